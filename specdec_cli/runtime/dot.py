"""The ``dot`` strategy of :mod:`specdec_cli.runtime.kernels`: one vectorised float32 dot product per output,
compiled by numba.

For the few rows of a decoding step, single-threaded MKL's GEMV streams a weight far below the memory bandwidth on
the CPUs this project measures (10-12 GB/s for SmolLM2's 576-wide matrices, against ~31 GB/s for a plain read):
this loop reads each weight row once, from ``W`` as it is (no copy), for all the input rows, at 20-28 GB/s. Each
output's sum runs in the same order whatever the number of rows, so a row's result does not depend on the rows
computed beside it.
"""

from __future__ import annotations

import threading

import numpy as np

from .jit import COMPILED, njit


@njit(fastmath={"reassoc", "contract"}, cache=True, nogil=True, boundscheck=False)
def dot_rows(x, w, y):  # pragma: no cover - compiled
    """``y[r, j] = x[r] . w[j]`` (float32 ``x [n, K]``, ``w [N, K]``, ``y [n, N]``): the weight streamed once."""
    n, k_dim = x.shape
    for j in range(w.shape[0]):
        for r in range(n):
            acc = np.float32(0.0)
            for k in range(k_dim):
                acc += x[r, k] * w[j, k]
            y[r, j] = acc


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
