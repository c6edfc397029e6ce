"""Compiled frequency trie of continuations (REST's Algorithm 2), in one pass instead of one ``np.unique`` per depth.

The rows (token ids, -1 after a continuation's end) are sorted lexicographically once; consecutive rows then
share their common prefix, so each row creates nodes only from the first position where it differs from the
previous row, and a node's count is the number of rows passing through it. Nodes come out depth by depth,
within a depth ordered by (parent, token) -- the same order, counts and tie-breaks as the ``np.unique``
formulation this replaces, so the drafts are identical (``tests/test_counting.py`` compares them). Compiled
with numba; without it the same code runs as Python.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..engine.trees import Draft
from ..runtime.jit import njit


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


@dataclass
class CountTrie:
    """Nodes in creation order (depth by depth); ``parents[i] = -1`` for children of the root."""

    tokens: np.ndarray
    parents: np.ndarray
    counts: np.ndarray
    depths: np.ndarray
    total: int = 0  # rows counted (the root's count)

    def __len__(self) -> int:
        return int(self.tokens.size)

    def conditional(self) -> np.ndarray:
        """count(node) / count(parent): the empirical probability of each node given its parent."""
        parent_counts = np.where(self.parents >= 0, self.counts[np.maximum(self.parents, 0)], max(self.total, 1))
        return self.counts / np.maximum(parent_counts, 1)

    def to_draft(self) -> Draft:
        return Draft(self.tokens.tolist(), self.parents.tolist(), scores=self.conditional().tolist())


def _empty_trie() -> CountTrie:
    return CountTrie(*(np.empty(0, dtype=np.int64) for _ in range(4)))


def count_trie(continuations: np.ndarray, weights: np.ndarray | None = None) -> CountTrie:
    """Count every prefix of every continuation (rows of token ids, -1 padded; row ``i`` counted ``weights[i]``
    times, default once): nodes depth by depth, ordered by (parent, token) within a depth (compiled:
    :func:`count_arrays`)."""
    tokens, parents, counts, depths = count_arrays(continuations, weights)
    rows = int(continuations.shape[0]) if continuations.ndim == 2 else 0
    total = rows if weights is None else int(np.sum(weights))
    return CountTrie(tokens, parents, counts, depths, total) if tokens.size else _empty_trie()


def top_by_count(trie: CountTrie, top_c: int) -> CountTrie:
    """The ``top_c`` most frequent nodes, prefix-closed, in BFS order (depth, then count desc, then token).

    A node's count never exceeds its parent's, so ranking by (count desc, depth asc) keeps the set prefix-closed;
    ties at the cut go to shallower nodes and smaller token ids, so the choice is deterministic."""
    if len(trie) == 0 or top_c < 1:
        return _empty_trie()
    candidates = _candidates(trie, top_c) if len(trie) > 4 * top_c else np.arange(len(trie))
    ranked = candidates[np.lexsort((trie.tokens[candidates], trie.depths[candidates], -trie.counts[candidates]))][:top_c]
    keep = np.zeros(len(trie), dtype=bool)
    for node in sorted(ranked.tolist()):  # creation order is depth order: parents are decided first
        parent = trie.parents[node]
        keep[node] = parent < 0 or keep[parent]
    chosen = np.flatnonzero(keep)
    order = chosen[np.lexsort((trie.tokens[chosen], -trie.counts[chosen], trie.depths[chosen]))]
    new_index = np.full(len(trie), -1, dtype=np.int64)
    new_index[order] = np.arange(order.size)
    parents = np.where(trie.parents[order] >= 0, new_index[np.maximum(trie.parents[order], 0)], -1)
    return CountTrie(trie.tokens[order], parents, trie.counts[order], trie.depths[order], trie.total)


def _candidates(trie: CountTrie, top_c: int) -> np.ndarray:
    """Nodes that can make the top ``top_c``: every node counted more than the ``top_c``-th largest count, and of
    the nodes tied at that count only the ones that win the tie-break (depth, token, creation order) -- found
    with a linear-time partition on a packed key, instead of ranking thousands of count-1 nodes."""
    n = len(trie)
    at_least = np.cumsum(np.bincount(trie.counts)[::-1])[::-1]  # nodes counted >= c, for every count c
    kth = int(np.flatnonzero(at_least >= top_c)[-1])  # the top_c-th largest count (np.partition: 1 ms on ties)
    above = np.flatnonzero(trie.counts > kth)
    ties = np.flatnonzero(trie.counts == kth)
    need = top_c - above.size
    packable = n < 2**20 and int(trie.tokens.max(initial=0)) < 2**31 and int(trie.depths.max(initial=0)) < 2**12
    if need >= ties.size or not packable:
        return np.concatenate([above, ties])
    key = (trie.depths[ties] << 51) | (trie.tokens[ties] << 20) | ties
    return np.concatenate([above, np.sort(ties[np.argpartition(key, need - 1)[:need]])])
