"""The ``dot`` strategy of :mod:`specdec_cli.runtime.kernels`: float32 ``x @ W.T`` by the register tiles of
:mod:`specdec_cli.runtime.tiles`, reading ``W`` as it is (no copy).

For the few rows of a decoding or verification step, single-threaded MKL streams these weights far below the
memory bandwidth on the CPUs this project measures (its GEMV at 10-12 GB/s for SmolLM2's 576-wide matrices against
~31 GB/s for a plain read; its GEMM for 4-8 rows at 2-3x one row's time): a tile loads each weight vector once for
a pair of rows and each input vector once for four outputs. Each output's sum runs in one order whatever the
number of rows, so a row's result does not depend on the rows computed beside it.
"""

from __future__ import annotations

import threading

import numpy as np

from .jit import COMPILED, njit
from .tiles import F32, dot_tiled


@njit(cache=True, nogil=True, boundscheck=False)
def dot_rows(x, w, y):  # pragma: no cover - compiled
    """``y[r, j] = x[r] . w[j]`` (float32 ``x [n, K]``, ``w [N, K]``, ``y [n, N]``, C-contiguous)."""
    dot_tiled(x, w, y, F32, True)


def warm_up() -> threading.Thread | None:
    """Load the compiled :func:`dot_rows` in a background thread (numba's first call in a process costs ~0.4 s
    even from its on-disk cache), so that it overlaps the model's loading instead of delaying the first step."""
    if not COMPILED:
        return None

    def first_call():
        dot_rows(np.zeros((1, 1), np.float32), np.zeros((1, 1), np.float32), np.empty((1, 1), np.float32))

    thread = threading.Thread(target=first_call, name="specdec-dot-warm-up", daemon=True)
    thread.start()
    return thread
