"""Compiled suffix-array search: the longest suffix of the context found in a shard, in microseconds.

REST tries the last ``n_max`` tokens, then one fewer, ... until one occurs in the datastore. Occurrence is
monotone in the length (an occurrence of the last ``k`` tokens contains one of the last ``k - 1``, token-aligned
and inside one document), so the longest matching length is found by a binary search over ``k`` -- four suffix
array range searches for ``n_max = 16`` instead of up to sixteen -- and each range search is two binary searches
over the suffix array comparing raw bytes. Every read is bounded by its array's size whatever the files hold
(the load also checks every offset: ``retrieval.range_problem``). Compiled with numba (cached on disk after the
first use); without numba the same functions run as plain Python, slower but identical.
"""

from __future__ import annotations

import numpy as np

from ...runtime.jit import COMPILED, njit  # noqa: F401 - COMPILED re-exported for the tests


@njit(cache=True, nogil=True)
def _compare(data, start, query):
    """Sign of ``data[start:start + len(query)]`` vs ``query`` (a shorter, truncated suffix sorts first)."""
    end = data.shape[0]
    if start < 0:  # never after the checks at load; a bound, not a branch the search takes
        return -1
    for i in range(query.shape[0]):
        if start + i >= end:
            return -1
        a = data[start + i]
        b = query[i]
        if a != b:
            return -1 if a < b else 1
    return 0


KEY_BYTES = 8  # bytes of each sampled suffix kept in the top-level index
KEY_STRIDE = 32  # every 32nd suffix-array entry: 0.25 bytes per token, the index of a 64 MB shard is 5 MB


@njit(cache=True, nogil=True)
def _compare_key(keys, row, query):
    """Sign of sampled key ``row`` vs the query's first ``KEY_BYTES`` bytes (0 when equal on the shorter)."""
    for i in range(min(keys.shape[1], query.shape[0])):
        a = keys[row, i]
        b = query[i]
        if a != b:
            return -1 if a < b else 1
    return 0


@njit(cache=True, nogil=True)
def bracket(keys, stride, n, query):
    """``[lo, hi)`` of suffix-array entries that holds every suffix starting with ``query`` and both ends of that
    range, from the sampled keys alone (a few MB that stay in cache) -- the full search then probes the big
    memory-mapped arrays only inside it (5 probes instead of 25). A sample whose key is below the query's first
    bytes is below every match, one above them is above every match; equal keys decide nothing."""
    m = keys.shape[0]
    if m == 0:
        return 0, n
    a, b = 0, m
    while a < b:  # first sample not below the query
        mid = (a + b) >> 1
        if _compare_key(keys, mid, query) < 0:
            a = mid + 1
        else:
            b = mid
    lo = min(max(a - 1, 0) * stride, n)  # inside the suffix array even for an index of the wrong size
    b = m
    while a < b:  # first sample above the query
        mid = (a + b) >> 1
        if _compare_key(keys, mid, query) <= 0:
            a = mid + 1
        else:
            b = mid
    return lo, min(a * stride, n)


def sample_keys(data: np.ndarray, sa: np.ndarray, stride: int = KEY_STRIDE) -> np.ndarray:
    """The top-level index: the first ``KEY_BYTES`` bytes of every ``stride``-th suffix ([m, 8] uint8; bytes past
    the end of the data are 0, which keeps the keys in suffix-array order)."""
    picks = np.asarray(sa[::stride], dtype=np.int64)
    at = picks[:, None] + np.arange(KEY_BYTES, dtype=np.int64)[None, :]
    keys = np.asarray(data)[np.minimum(at, data.size - 1)]
    keys[at >= data.size] = 0
    return np.ascontiguousarray(keys, dtype=np.uint8)


@njit(cache=True, nogil=True)
def match_range(data, sa, query, lo=0, hi=-1):
    """``[lo, hi)`` of suffix-array entries whose suffix starts with ``query``, searched inside ``[lo, hi)``
    (which must hold the whole answer: :func:`bracket`; ``hi = -1``: the whole array)."""
    if hi < 0:
        hi = sa.shape[0]
    end = hi
    while lo < hi:  # first suffix >= query
        mid = (lo + hi) >> 1
        if _compare(data, sa[mid], query) < 0:
            lo = mid + 1
        else:
            hi = mid
    first = lo
    hi = end
    while lo < hi:  # first suffix whose prefix > query
        mid = (lo + hi) >> 1
        if _compare(data, sa[mid], query) <= 0:
            lo = mid + 1
        else:
            hi = mid
    return first, lo


@njit(cache=True, nogil=True)
def indexed_range(data, sa, keys, stride, query):
    lo, hi = bracket(keys, stride, sa.shape[0], query)
    return match_range(data, sa, query, lo, hi)


@njit(cache=True, nogil=True)
def longest_match(data, sa, keys, stride, context, width, n_max, min_k=1):
    """Longest ``k`` in ``[min_k, n_max]`` such that the last ``k`` tokens of ``context`` (big-endian bytes,
    ``width`` per token) start some suffix; returns ``(k, lo, hi)`` (``k = 0`` and an empty range when none
    does). ``min_k``: a length another shard already matched -- shorter matches are of no use."""
    tokens = context.shape[0] // width
    best, best_lo, best_hi = 0, 0, 0
    lo_k, hi_k = max(min_k, 1), min(n_max, tokens)
    if min_k > 1 and lo_k <= hi_k:  # one search says whether this shard can reach the others' length at all
        lo, hi = indexed_range(data, sa, keys, stride, context[context.shape[0] - lo_k * width:])
        if hi <= lo:
            return 0, 0, 0
        best, best_lo, best_hi = lo_k, lo, hi
        lo_k += 1
    while lo_k <= hi_k:
        k = (lo_k + hi_k) >> 1
        lo, hi = indexed_range(data, sa, keys, stride, context[context.shape[0] - k * width:])
        if hi > lo:
            best, best_lo, best_hi = k, lo, hi
            lo_k = k + 1
        else:
            hi_k = k - 1
    return best, best_lo, best_hi


@njit(cache=True, nogil=True)
def gather(data, sa, picks, skip, width, cont_len, separator, out, row0):
    """Fill ``out[row0 + r]`` with the ``cont_len`` tokens starting ``skip`` bytes after suffix ``sa[picks[r]]``,
    -1 from the first separator (a document's end) on."""
    end = data.shape[0]
    for r in range(picks.shape[0]):
        at = sa[picks[r]] + skip
        live = True
        for j in range(cont_len):
            token = -1
            off = at + j * width
            if live and off >= 0 and off + width <= end:
                value = 0
                for b in range(width):
                    value = (value << 8) | data[off + b]
                if value == separator:
                    live = False
                else:
                    token = value
            else:
                live = False
            out[row0 + r, j] = token


@njit(cache=True, nogil=True)
def longest_all(datas, sas, keys, strides, context, width, n_max):
    """The longest suffix of ``context`` (at most ``n_max`` tokens) found in any shard: ``(k, found)`` with
    ``found[s] = (k_s, lo, hi)`` per shard (only shards with ``k_s == k`` hold matches of that length)."""
    shards = len(datas)
    found = np.zeros((shards, 3), dtype=np.int64)
    best = 0
    for s in range(shards):  # each shard only looks for matches at least as long as the best so far
        k, lo, hi = longest_match(datas[s], sas[s], keys[s], strides[s], context, width, n_max, max(best, 1))
        found[s, 0], found[s, 1], found[s, 2] = k, lo, hi
        best = max(best, k)
    return best, found


@njit(cache=True, nogil=True)
def retrieve(datas, sas, keys, strides, context, width, n_max, max_matches, cont_len, separator):
    """All of one REST retrieval over every shard in one compiled call: the longest suffix of ``context`` found
    in any shard, its total number of matches, and the continuations of up to ``max_matches`` of them spread
    evenly over all shards' ranges (in shard order) -- ``(k, total, rows)``."""
    shards = len(datas)
    best, found = longest_all(datas, sas, keys, strides, context, width, n_max)
    total = 0
    for s in range(shards):
        if found[s, 0] == best and best > 0:
            total += found[s, 2] - found[s, 1]
    count = min(total, max_matches)
    rows = np.empty((count, cont_len), dtype=np.int64)
    if count == 0:
        return best, total, rows
    start = 0  # index of the first of all matches that belongs to shard s
    row = 0
    for s in range(shards):
        if found[s, 0] != best:
            continue
        size = found[s, 2] - found[s, 1]
        # picks i with start <= (i * total) // count < start + size, i.e. i in [ceil(start*count/total), ...)
        first = (start * count + total - 1) // total
        last = ((start + size) * count + total - 1) // total
        picks = np.empty(last - first, dtype=np.int64)
        for i in range(first, last):
            picks[i - first] = (i * total) // count - start + found[s, 1]
        gather(datas[s], sas[s], picks, best * width, width, cont_len, separator, rows, row)
        row += last - first
        start += size
    return best, total, rows


def shard_lists(datas, sas, keys, strides):
    """The per-shard arrays as the compiled :func:`retrieve` takes them (numba typed lists; plain lists without)."""
    if COMPILED:
        from numba.typed import List

        datas, sas, keys = List(datas), List(sas), List(keys)
    return datas, sas, keys, np.asarray(strides, dtype=np.int64)


def as_arrays(data, sa) -> tuple[np.ndarray, np.ndarray]:
    """Plain (memory-mapped) uint8 / int32 views the compiled search can take."""
    return np.asarray(data, dtype=np.uint8), np.asarray(sa).astype(np.int32, copy=False)
