"""numba's ``njit`` where numba is installed; otherwise a decorator that leaves the function as plain Python
(slower, identical results). ``COMPILED`` says which one this installation got.

**The compiled code's cache follows every compiled source.** numba keeps a compiled function beside its source
file and checks only that file's time: a function that inlines another module's compiled code (the tiles, into
``dot``, ``dot16``, ``attend``, ``fused``) kept its old machine code after only the other module changed -- new
GGUF formats computed garbage through a stale ``dot`` until its own file was touched. So the cache lives under
``$SPECDEC_CACHE/numba/DIGEST``, ``DIGEST`` from the text of every module that compiles anything: any change to any
of them starts a fresh cache. ``NUMBA_CACHE_DIR``, where the user set it, wins.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from ..io.aliases import cache_root

USER_CACHE = bool(os.environ.get("NUMBA_CACHE_DIR"))  # the user's own choice wins
COMPILING = (b"njit", b"llvmlite", b"numba")  # a module with any of these compiles, or emits code others inline


def compiled_sources_digest() -> str:
    """A digest of every module of the package that compiles code with numba or writes IR that compiled code
    inlines (:mod:`~specdec_cli.runtime.ggml_blocks`): their paths and text."""
    package = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for path in sorted(package.rglob("*.py")):
        text = path.read_bytes()
        if any(word in text for word in COMPILING):
            digest.update(str(path.relative_to(package)).encode() + b"\0" + text)
    return digest.hexdigest()[:16]


def cache_dir(digest: str = "") -> Path | None:
    """Where numba caches this package's compiled functions (None: where the user's ``NUMBA_CACHE_DIR`` says, or
    numba's own place when there is no home folder to put the cache under). ``digest``: the sources' digest when
    the caller has it (taken now otherwise)."""
    if os.environ.get("NUMBA_CACHE_DIR") and USER_CACHE:
        return None
    try:
        return cache_root() / "numba" / (digest or compiled_sources_digest())
    except (OSError, RuntimeError):  # no home folder (Path.home), an unreadable source
        return None


try:
    LOADED = compiled_sources_digest()  # the compiled sources this process runs (profiles of GGUF blocks name it)
except OSError:  # pragma: no cover - an unreadable source
    LOADED = ""
_MINE = cache_dir(LOADED)  # the digest once at import
if _MINE is not None:  # in the environment too: numba re-reads its configuration from it when NUMBA_* changes
    os.environ["NUMBA_CACHE_DIR"] = str(_MINE)

try:  # pragma: no cover - exercised either way depending on the installation
    import numba
    from numba import njit
except ImportError:  # pragma: no cover
    numba = None

    def njit(*args, **kwargs):
        if args and callable(args[0]):
            return args[0]
        return lambda fn: fn

COMPILED = njit.__module__.startswith("numba") if hasattr(njit, "__module__") else False
if COMPILED and _MINE is not None:  # numba imported before this module read the environment already
    numba.config.CACHE_DIR = str(_MINE)
