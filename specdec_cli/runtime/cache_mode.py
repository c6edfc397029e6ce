"""The engine path a generation runs on, resolved once from ``--compile`` and handed down as one typed value.

``--compile`` takes ``auto``, ``on``, ``off`` or ``static``; :func:`resolve` turns it into a :class:`CacheMode`
(``auto`` needs the model: it compiles for CUDA only). The value travels down unchanged: ``api`` ->
``engine.loop.generate`` -> ``runtime.forward.new_cache`` (which cache to build) -> the cache itself
(``cache.mode``, read by draft models that follow the target's path) and ``runtime.profile`` (whose cache key
spells the mode as its ``value``, so profiles measured before stay valid).
"""

from __future__ import annotations

from enum import Enum

from ..errors import SpecdecError

CHOICES = ("auto", "on", "off", "static")


class CacheMode(Enum):
    EAGER = "off"  # growing cache (runtime/kvcache.py), eager forwards
    STATIC = "static"  # static cache, bucketed forwards (runtime/static_cache.py), eager
    COMPILED = "compiled"  # the same, compiled (CUDA graphs on a GPU)

    @property
    def static(self) -> bool:
        return self is not CacheMode.EAGER

    @property
    def compiled(self) -> bool:
        return self is CacheMode.COMPILED


def check(choice: str | CacheMode) -> None:
    """A ``--compile`` value this resolves (the one check of it; torch-free, so the CLI makes it before loading)."""
    if not isinstance(choice, CacheMode) and choice not in CHOICES:
        raise SpecdecError(f"unknown --compile {choice!r}; choose {', '.join(CHOICES)}")


def resolve(choice: str | CacheMode, model) -> CacheMode:
    """``--compile`` -> the :class:`CacheMode` (a mode already resolved is returned as is). ``auto`` compiles for
    CUDA; on the CPU it stays eager, where the static path measured slower than the growing cache (docs/gpu.md)."""
    check(choice)
    if isinstance(choice, CacheMode):
        return choice
    if choice == "auto":
        on_cuda = model.get_input_embeddings().weight.device.type == "cuda"
        return CacheMode.COMPILED if on_cuda else CacheMode.EAGER
    return {"on": CacheMode.COMPILED, "off": CacheMode.EAGER, "static": CacheMode.STATIC}[choice]
