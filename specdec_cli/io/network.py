"""Is the Hugging Face hub reachable? Asked once per process, before anything tries to download.

Offline, transformers and datasets retry each request with back-off (half a minute and a screen of "Retrying"
lines before their error). One TCP connection attempt with a short timeout answers the question instead; when it
fails, the libraries are switched to offline mode (``HF_HUB_OFFLINE=1``), so they read the local cache at once
and fail at once when what is asked for is not there. ``HF_HUB_OFFLINE=1`` set by the user skips the check.
"""

from __future__ import annotations

import os
import socket
import sys
from urllib.parse import urlparse

TIMEOUT_S = 3.0
HINT = ("the Hugging Face hub is unreachable (offline?); set HF_HUB_OFFLINE=1 to use only the local cache without "
        "trying the network")
_state: dict[str, bool] = {}


def _truthy(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def hub_offline() -> bool:
    """True when the hub cannot be used: ``HF_HUB_OFFLINE`` is set, or a connection to it fails (then offline
    mode is switched on for transformers, huggingface_hub and datasets)."""
    if _truthy("HF_HUB_OFFLINE"):
        return True
    if "offline" not in _state:
        host = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co")).hostname or "huggingface.co"
        try:
            socket.create_connection((host, 443), timeout=TIMEOUT_S).close()
            _state["offline"] = False
        except OSError:
            _state["offline"] = True
            go_offline()
    return _state["offline"]


def go_offline() -> None:
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["HF_DATASETS_OFFLINE"] = "1"
    constants = sys.modules.get("huggingface_hub.constants")
    if constants is not None:
        constants.HF_HUB_OFFLINE = True
    config = sys.modules.get("datasets.config")
    if config is not None:
        config.HF_HUB_OFFLINE = True
        if hasattr(config, "HF_DATASETS_OFFLINE"):
            config.HF_DATASETS_OFFLINE = True
