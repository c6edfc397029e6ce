"""The ``dot`` strategy of :mod:`specdec_cli.runtime.kernels`: float32 ``x @ W.T`` by the register tiles of
:mod:`specdec_cli.runtime.tiles`, reading ``W`` as it is (no copy).

For the few rows of a decoding or verification step, single-threaded MKL streams these weights far below the
memory bandwidth on the CPUs this project measures (its GEMV at 10-12 GB/s for SmolLM2's 576-wide matrices against
~31 GB/s for a plain read; its GEMM for 4-8 rows at 2-3x one row's time): a tile loads each weight vector once for
its 2 rows (on AVX-512 4 or 8: :mod:`specdec_cli.runtime.tiles`) and each input vector once for four outputs.
Each output's sum runs in one order whatever the number of rows, so a row's result does not depend on the rows
computed beside it.
"""

from __future__ import annotations

import functools
import os
import threading

import numpy as np

from .jit import COMPILED, njit, numba
from .tiles import F32, OUTS, dot_tiled, dot_tiled_span

prange = numba.prange if COMPILED else range


@njit(cache=True, nogil=True, boundscheck=False)
def dot_rows(x, w, y):  # pragma: no cover - compiled
    """``y[r, j] = x[r] . w[j]`` (float32 ``x [n, K]``, ``w [N, K]``, ``y [n, N]``, C-contiguous)."""
    dot_tiled(x, w, y, F32, True)


@njit(cache=True, nogil=True, boundscheck=False)
def dot_rows_span(x, w, y, j0, j1, fmt):  # pragma: no cover - compiled
    """:func:`dot_rows` for the outputs ``j0 <= j < j1`` (:func:`specdec_cli.runtime.tiles.dot_tiled_span`), the
    weights in format ``fmt`` (float32, or GGUF blocks: :mod:`specdec_cli.runtime.blocks`)."""
    dot_tiled_span(x, w, y, fmt, True, j0, j1)


@njit(cache=True, nogil=True, boundscheck=False, parallel=True)
def dot_rows_parts(x, w, y, cuts, fmt):  # pragma: no cover - compiled
    """:func:`dot_rows_span` over the output ranges ``[cuts[i], cuts[i + 1])``, one per thread of numba's
    OpenMP pool (no Python thread to wake; a libgomp of its own beside torch's, its spin bounded by the same
    ``GOMP_SPINCOUNT``, which importing specdec sets)."""
    for i in prange(cuts.shape[0] - 1):
        dot_tiled_span(x, w, y, fmt, True, cuts[i], cuts[i + 1])


# Whether dot_rows_parts may split a product: None until its first call, then True where numba's threading layer
# is safe to enter from several Python threads at once (omp, tbb; its fallback "workqueue" is not), else False and
# the executor below splits instead. The pool's wake-up costs a few us against the executor's ~50 us a call: on 2
# cores a 32-row SmolLM2 576x576 product took 74 us split this way, 174 us by the executor, 120 us on one thread
# (docs/profiling.md, "Tall float32 tiles and OpenMP's pool").
_PARTS: list = [None]
_HELPERS: list = []  # [the executor, its worker count]: made at the first call that splits
_MAKING = threading.Lock()


def _forked_child() -> None:
    """A forked child has the executor object but none of its threads, and GNU OpenMP's pool may not be entered
    after a fork (numba's omp layer terminates the child): the child splits by a new executor (and a new lock: a
    thread of the parent may have held it at the fork)."""
    global _MAKING
    _HELPERS.clear()
    _PARTS[0] = False
    _MAKING = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked_child)


def spans(n_out: int, parts: int) -> list[tuple[int, int]]:
    """``parts`` output ranges covering ``[0, n_out)``, cut at multiples of :data:`~specdec_cli.runtime.tiles.OUTS`
    (so each output gets the tile it gets in one thread: the same bits)."""
    if n_out <= 0:
        return [(0, n_out)]
    per_part = -(-n_out // parts)  # rounded up
    step = -(-per_part // OUTS) * OUTS  # and up again to whole tiles
    return [(j, min(j + step, n_out)) for j in range(0, n_out, step)]


def dot_rows_threads(x, w, y, threads: int, fmt: int = F32) -> None:
    """:func:`dot_rows` over ``threads`` threads, each a span of the outputs: on numba's OpenMP pool, else (a
    threading layer that may not be shared, a forked child) by a Python executor (the compiled code releases the
    GIL). The tiles stream the weights from one core at a time; a second core reads the other half, which is what
    a batch's forward (8-32 rows and more) needs on a machine of several cores. Same bits as one thread."""
    parts = spans(w.shape[0], threads)
    if len(parts) < 2:
        dot_rows_span(x, w, y, 0, w.shape[0], fmt)
        return
    if on_pool(len(parts)):  # on as many of numba's threads as ranges (the rest would wake for nothing)
        dot_rows_parts(x, w, y, _cuts(w.shape[0], threads), fmt)
        return
    with _MAKING:  # forwards from several Python threads must not replace the executor under one another
        if not _HELPERS or _HELPERS[1] < len(parts) - 1:  # the first split, or more threads than before
            from concurrent.futures import ThreadPoolExecutor

            if _HELPERS:
                _HELPERS[0].shutdown(wait=False)
            _HELPERS[:] = [ThreadPoolExecutor(len(parts) - 1, thread_name_prefix="specdec-dot"), len(parts) - 1]
        executor = _HELPERS[0]
    others = [executor.submit(dot_rows_span, x, w, y, j0, j1, fmt) for j0, j1 in parts[1:]]
    dot_rows_span(x, w, y, *parts[0], fmt)
    for done in others:
        done.result()


@functools.lru_cache(maxsize=256)
def _cuts(n_out: int, threads: int) -> np.ndarray:
    """:func:`spans`' boundaries as ``dot_rows_parts`` takes them (one array per shape and thread count, reused)."""
    parts = spans(n_out, threads)
    return np.array([j0 for j0, _ in parts] + [parts[-1][1]], np.int64)


def on_pool(threads: int) -> bool:
    """Whether a ``prange`` kernel may run on numba's OpenMP pool (:func:`_pool_ready`); if so, on ``threads`` of its
    threads from now on in this Python thread (numba's setting is per thread)."""
    if not (COMPILED and _pool_ready()):
        return False
    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    return True


def _pool_ready() -> bool:
    """Whether splits run on numba's pool, which the first caller starts (one at a time)."""
    if _PARTS[0] is None:
        with _MAKING:
            if _PARTS[0] is None:
                _PARTS[0] = _start_pool()
    return _PARTS[0]


def _start_pool() -> bool:
    """Start numba's OpenMP pool from a thread of its own, and say whether splits may use it: its threading layer
    may be entered from several threads at once (omp, tbb; its fallback "workqueue" may not) and it started.

    Why a thread of its own: started from the thread that runs torch's products, at its first split, the pool
    made batched `ar` on SmolLM2 run at 135-140 tok/s against 190 (B = 8, 2 threads, AMD EPYC VM; docs/profiling.md,
    "Tall float32 tiles and OpenMP's pool")."""
    verdict = [False]

    def start():
        one, out = np.zeros((1, 1), np.float32), np.empty((1, 1), np.float32)
        try:
            dot_rows_parts(one, one, out, np.array([0, 1], np.int64), F32)
            verdict[0] = numba.threading_layer() in ("omp", "tbb")
        except Exception:  # noqa: BLE001 - a layer that cannot start (NUMBA_THREADING_LAYER=omp, no libgomp)
            pass  # verdict stays False: the executor splits

    starter = threading.Thread(target=start, name="specdec-dot-pool", daemon=True)
    starter.start()
    starter.join()
    return verdict[0]


def warm_up() -> threading.Thread | None:
    """Load the compiled :func:`dot_rows` in a background thread (numba's first call in a process costs ~0.4 s
    even from its on-disk cache), so that it overlaps the model's loading instead of delaying the first step."""
    if not COMPILED:
        return None

    def first_call():
        x, w, y = np.zeros((1, 1), np.float32), np.zeros((1, 1), np.float32), np.empty((1, 1), np.float32)
        dot_rows(x, w, y)
        dot_rows_span(x, w, y, 0, 1, F32)  # the split's kernel too (the first step of a run of several threads)
        _pool_ready()  # and its pool, off the thread that runs torch's products (_start_pool says why)

    thread = threading.Thread(target=first_call, name="specdec-dot-warm-up", daemon=True)
    thread.start()
    return thread
