"""Compiled suffix-array search: the longest suffix of the context found in a shard, in microseconds.

REST tries the last ``n_max`` tokens, then one fewer, ... until one occurs in the datastore. Occurrence is
monotone in the length (an occurrence of the last ``k`` tokens contains one of the last ``k - 1``, token-aligned
and inside one document), so the longest matching length is found by a binary search over ``k`` -- four suffix
array range searches for ``n_max = 16`` instead of up to sixteen -- and each range search is two binary searches
over the suffix array comparing raw bytes. Compiled with numba (cached on disk after the first use); without
numba the same functions run as plain Python, slower but identical.
"""

from __future__ import annotations

import numpy as np

try:  # pragma: no cover - exercised either way depending on the installation
    from numba import njit
except ImportError:  # pragma: no cover
    def njit(*args, **kwargs):
        if args and callable(args[0]):
            return args[0]
        return lambda fn: fn

COMPILED = njit.__module__.startswith("numba") if hasattr(njit, "__module__") else False


@njit(cache=True, nogil=True)
def _compare(data, start, query):
    """Sign of ``data[start:start + len(query)]`` vs ``query`` (a shorter, truncated suffix sorts first)."""
    end = data.shape[0]
    for i in range(query.shape[0]):
        if start + i >= end:
            return -1
        a = data[start + i]
        b = query[i]
        if a != b:
            return -1 if a < b else 1
    return 0


@njit(cache=True, nogil=True)
def match_range(data, sa, query):
    """``[lo, hi)`` of suffix-array entries whose suffix starts with ``query``."""
    lo, hi = 0, sa.shape[0]
    while lo < hi:  # first suffix >= query
        mid = (lo + hi) >> 1
        if _compare(data, sa[mid], query) < 0:
            lo = mid + 1
        else:
            hi = mid
    first = lo
    hi = sa.shape[0]
    while lo < hi:  # first suffix whose prefix > query
        mid = (lo + hi) >> 1
        if _compare(data, sa[mid], query) <= 0:
            lo = mid + 1
        else:
            hi = mid
    return first, lo


@njit(cache=True, nogil=True)
def longest_match(data, sa, context, width, n_max):
    """Longest ``k <= n_max`` such that the last ``k`` tokens of ``context`` (big-endian bytes, ``width`` per
    token) start some suffix; returns ``(k, lo, hi)`` (``k = 0`` and an empty range when none does)."""
    tokens = context.shape[0] // width
    best, best_lo, best_hi = 0, 0, 0
    lo_k, hi_k = 1, min(n_max, tokens)
    while lo_k <= hi_k:
        k = (lo_k + hi_k) >> 1
        lo, hi = match_range(data, sa, context[context.shape[0] - k * width:])
        if hi > lo:
            best, best_lo, best_hi = k, lo, hi
            lo_k = k + 1
        else:
            hi_k = k - 1
    return best, best_lo, best_hi


def as_arrays(data, sa) -> tuple[np.ndarray, np.ndarray]:
    """Plain (memory-mapped) uint8 / int32 views the compiled search can take."""
    return np.asarray(data, dtype=np.uint8), np.asarray(sa).astype(np.int32, copy=False)
