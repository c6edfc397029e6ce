"""ADED's draft maker: Monte Carlo Tree Search over a tri-gram matrix (Liu et al., Algorithm 1, Eqs. 2-3).

The search state is the sequence so far ending in the root token. Each iteration

1. *selects* children by the PUCT score (Eq. 2) while the node is expanded and the depth is not reached,
2. *expands* a leaf: one child per next token the tri-gram matrix keeps for the node's last two tokens,
3. *simulates* to the full depth by sampling next tokens from the tri-gram probabilities,
4. *backpropagates* the rollout score ``1 + sum_i P(w_i | w_{i-2}, w_{i-1})`` (visits + 1, score + score).

Each iteration's rollout (selected + expanded + simulated tokens) is a candidate continuation; the best-scoring
distinct ones are returned and become a prefix-merged draft tree (``trees.merge_paths``).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np

from ..runtime.jit import njit


@dataclass
class MCTSConfig:
    iterations: int = 150  # s in the paper
    c1: float = 32.0
    c2: float = 8.0
    depth: int = 4  # l: search depth = length of each candidate continuation
    candidates: int = 24  # n: continuation candidates merged into the draft tree


@njit(cache=True, nogil=True)
def _search(offsets, ids, probs, child_row, root_row, depth, iterations, c1, c2, seed):
    """The MCTS over a gathered sub-matrix (see :func:`reachable`), as arrays: no Python object per node.

    Returns every iteration's rollout: ``seqs [iterations, depth]`` (-1 padded), their lengths and scores.
    Mirrors the steps of :func:`run_mcts`'s docstring exactly: select by PUCT while the node is expanded and the
    depth allows, expand a leaf into one child per row entry and continue from the last one, simulate by sampling
    the tri-gram rows, score ``1 + sum of the drafted tokens' probabilities``, back up visits and score.
    """
    np.random.seed(seed)
    width = 1
    for r in range(offsets.shape[0] - 1):
        width = max(width, offsets[r + 1] - offsets[r])
    cap = 1 + iterations * width
    parent = np.full(cap, -1, np.int64)
    row = np.full(cap, -1, np.int64)
    token = np.full(cap, -1, np.int64)
    prior = np.zeros(cap)
    first = np.zeros(cap, np.int64)
    count = np.zeros(cap, np.int64)
    visits = np.zeros(cap, np.int64)
    score = np.zeros(cap)
    row[0], prior[0] = root_row, 1.0
    used = 1
    seqs = np.full((iterations, depth), -1, np.int64)
    lengths = np.zeros(iterations, np.int64)
    scores = np.zeros(iterations)
    for it in range(iterations):
        node, n, acc = 0, 0, 0.0
        while row[node] >= 0 and offsets[row[node] + 1] > offsets[row[node]] and count[node] > 0 and n < depth:
            total = 0
            for c in range(first[node], first[node] + count[node]):
                total += visits[c]
            factor = (c1 + np.log((total + c2 + 1.0) / c2)) * np.sqrt(total)
            best, best_score = first[node], -np.inf
            for c in range(first[node], first[node] + count[node]):
                q = score[c] / visits[c] if visits[c] > 0 else 0.0
                value = q + factor * prior[c] / (1.0 + visits[c])
                if value > best_score:
                    best, best_score = c, value
            node = best
            seqs[it, n] = token[node]
            acc += prior[node]
            n += 1
        r = row[node]
        if r >= 0 and offsets[r + 1] > offsets[r] and count[node] == 0 and n < depth:
            first[node], count[node] = used, offsets[r + 1] - offsets[r]
            for e in range(offsets[r], offsets[r + 1]):
                parent[used], token[used], prior[used], row[used] = node, ids[e], probs[e], child_row[e]
                used += 1
            node = used - 1
            seqs[it, n] = token[node]
            acc += prior[node]
            n += 1
        r = row[node]
        while n < depth and r >= 0 and offsets[r + 1] > offsets[r]:
            a, b = offsets[r], offsets[r + 1]
            total_p = 0.0
            for e in range(a, b):
                total_p += probs[e]
            u = np.random.random() * total_p
            e, cum = a, probs[a]
            while cum <= u and e < b - 1:
                e += 1
                cum += probs[e]
            seqs[it, n] = ids[e]
            acc += probs[e]
            n += 1
            r = child_row[e]
        lengths[it] = n
        scores[it] = 1.0 + acc
        while node >= 0:
            visits[node] += 1
            score[node] += 1.0 + acc
            node = parent[node]
    return seqs, lengths, scores


def reachable(matrix, prev: int, root_token: int, depth: int):
    """The tri-gram rows a search of ``depth`` can touch, gathered level by level in a few vectorised lookups.

    Row 0 is the root context ``(prev, root)``; every entry ``e`` of a row at level ``d < depth - 1`` gets
    ``child_row[e]``, the row of the context (its parent token, its own token) one level down (-1 below the
    last level). At most ``1 + 12 + 144 + 1728`` rows for the paper's depth 4 and top-12 rows.
    """
    v = matrix.vocab_size
    if not (0 <= prev < v and 0 <= root_token < v):
        return np.zeros(2, np.int64), np.empty(0, np.int64), np.empty(0), np.empty(0, np.int64)
    level_keys = np.array([prev * v + root_token], dtype=np.int64)
    level_last = np.array([root_token], dtype=np.int64)  # the token each row's context ends with
    offsets_parts, ids_parts, probs_parts = [np.zeros(1, np.int64)], [], []
    entries_before = 0
    for level in range(depth):
        offsets, ids, probs = matrix.gather(level_keys)
        offsets_parts.append(offsets[1:] + entries_before)
        ids_parts.append(ids)
        probs_parts.append(probs)
        entries_before += ids.size
        if level == depth - 1 or not ids.size:
            break
        parents_last = np.repeat(level_last, np.diff(offsets))
        level_keys = parents_last * v + ids
        level_last = ids
    offsets = np.concatenate(offsets_parts)
    ids = np.concatenate(ids_parts) if ids_parts else np.empty(0, np.int64)
    probs = np.concatenate(probs_parts) if probs_parts else np.empty(0)
    child_row = np.full(ids.size, -1, np.int64)
    # entries of level d (all but the last gathered level) point at the rows of level d + 1, in order
    first_entry, next_row = 0, 1
    for part in ids_parts[:-1]:
        child_row[first_entry: first_entry + part.size] = np.arange(next_row, next_row + part.size)
        first_entry += part.size
        next_row += part.size
    return offsets, ids, probs, child_row


def run_mcts(matrix, prev: int, root_token: int, cfg: MCTSConfig, rng: random.Random,
             depth: int | None = None) -> list[tuple[list[int], float]]:
    """Candidate continuations of ``(..., prev, root_token)``, best score first (at most ``cfg.candidates``).

    Each iteration (Algorithm 1) *selects* children by PUCT (Eq. 2) while the node is expanded and the depth is
    not reached, *expands* a leaf into one child per next token the matrix keeps after the node's last two
    tokens (and moves to the last one), *simulates* to the full depth by sampling the tri-gram probabilities,
    and *backpropagates* ``1 + sum of the drafted tokens' probabilities``. The search runs compiled over the
    rows gathered by :func:`reachable`; ``rng`` seeds it, so the same rng state gives the same candidates.
    """
    depth = cfg.depth if depth is None else depth
    if depth < 1:
        return []
    offsets, ids, probs, child_row = reachable(matrix, prev, root_token, depth)
    if offsets[1] == offsets[0]:
        return []
    seqs, lengths, scores = _search(offsets, ids, probs, child_row, 0, depth, cfg.iterations, float(cfg.c1),
                                    float(cfg.c2), rng.getrandbits(31))
    best: dict[tuple[int, ...], float] = {}
    for seq, n, score in zip(seqs.tolist(), lengths.tolist(), scores.tolist()):
        key = tuple(seq[:n])
        if score > best.get(key, -1.0):
            best[key] = score
    ranked = sorted(best.items(), key=lambda kv: -kv[1])  # stable: earlier rollouts first on ties
    return [(list(seq), score) for seq, score in ranked[: cfg.candidates]]
