"""numba's ``njit`` where numba is installed; otherwise a decorator that leaves the function as plain Python
(slower, identical results). ``COMPILED`` says which one this installation got."""

from __future__ import annotations

try:  # pragma: no cover - exercised either way depending on the installation
    from numba import njit
except ImportError:  # pragma: no cover
    def njit(*args, **kwargs):
        if args and callable(args[0]):
            return args[0]
        return lambda fn: fn

COMPILED = njit.__module__.startswith("numba") if hasattr(njit, "__module__") else False
