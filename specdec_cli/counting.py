"""Compiled frequency trie of continuations (REST's Algorithm 2), in one pass instead of one ``np.unique`` per depth.

The rows (token ids, -1 after a continuation's end) are sorted lexicographically once; consecutive rows then
share their common prefix, so each row creates nodes only from the first position where it differs from the
previous row, and a node's count is the number of rows passing through it. Nodes come out depth by depth,
within a depth ordered by (parent, token) -- the same order, counts and tie-breaks as the ``np.unique``
formulation this replaces, so the drafts are identical (``tests/test_counting.py`` compares them). Compiled
with numba; without it the same code runs as Python.
"""

from __future__ import annotations

import numpy as np

from .datastore.search import njit


@njit(cache=True, nogil=True)
def _trie_from_sorted(rows, weights):
    """Nodes of the lexicographically sorted rows, each row counted ``weights[i]`` times: (tokens, parents,
    counts, depths), depth by depth."""
    k, length = rows.shape
    tokens = np.empty(k * length, dtype=np.int64)
    parents = np.empty(k * length, dtype=np.int64)
    counts = np.zeros(k * length, dtype=np.int64)
    depths = np.empty(k * length, dtype=np.int64)
    per_depth = np.zeros(length + 1, dtype=np.int64)
    path = np.full(max(length, 1), -1, dtype=np.int64)
    n = 0
    for i in range(k):  # depth-first: a row creates nodes from the first position where it leaves the previous row
        first = 0
        if i > 0:
            while first < length and rows[i, first] == rows[i - 1, first]:
                first += 1
        for d in range(length):
            t = rows[i, d]
            if t < 0:
                break
            if i == 0 or d >= first:
                tokens[n] = t
                parents[n] = path[d - 1] if d > 0 else -1
                depths[n] = d
                path[d] = n
                per_depth[d + 1] += 1
                n += 1
            counts[path[d]] += weights[i]
    for d in range(length):  # depth by depth, keeping depth-first order within a depth: (parent, token) order
        per_depth[d + 1] += per_depth[d]
    new_id = np.empty(n, dtype=np.int64)
    for i in range(n):
        new_id[i] = per_depth[depths[i]]
        per_depth[depths[i]] += 1
    out_tokens = np.empty(n, dtype=np.int64)
    out_parents = np.empty(n, dtype=np.int64)
    out_counts = np.empty(n, dtype=np.int64)
    out_depths = np.empty(n, dtype=np.int64)
    for i in range(n):
        j = new_id[i]
        out_tokens[j] = tokens[i]
        out_parents[j] = new_id[parents[i]] if parents[i] >= 0 else -1
        out_counts[j] = counts[i]
        out_depths[j] = depths[i]
    return out_tokens, out_parents, out_counts, out_depths


def count_arrays(rows: np.ndarray, weights: np.ndarray | None = None
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(tokens, parents, counts, depths) of every prefix of every row, depth by depth, (parent, token) within.
    ``weights``: how many times each row counts (default once) -- the same trie as repeating the rows."""
    rows = np.ascontiguousarray(rows, dtype=np.int64)
    if rows.ndim != 2 or rows.shape[0] == 0 or rows.shape[1] == 0:
        empty = np.empty(0, dtype=np.int64)
        return empty, empty, empty, empty
    weights = np.ones(rows.shape[0], dtype=np.int64) if weights is None else np.asarray(weights, dtype=np.int64)
    order = np.lexsort(_packed_columns(rows)[::-1])  # lexicographic; -1 (ended) sorts before any token
    return _trie_from_sorted(rows[order], weights[order])


def _packed_columns(rows: np.ndarray) -> list[np.ndarray]:
    """Sort keys equivalent to the rows' columns, several tokens packed per int64 (a 2-3x cheaper lexsort):
    each token + 1 (so -1 becomes 0) in ``bits`` bits, the first column of a group in the highest bits."""
    bits = max(int(rows.max(initial=0)) + 1, 1).bit_length()
    per = max(63 // bits, 1)
    keys = []
    for start in range(0, rows.shape[1], per):
        key = np.zeros(rows.shape[0], dtype=np.int64)
        for j in range(start, min(start + per, rows.shape[1])):
            key = (key << bits) | (rows[:, j] + 1)
        keys.append(key << (bits * (per - min(per, rows.shape[1] - start))))
    return keys
