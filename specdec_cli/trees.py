"""Draft trees: their shape, how drafters build them, and which part of them is worth verifying.

A draft is a tree under the *root* (the last token of the sequence): ``parents[i] = -1`` for a child of the root,
otherwise the index of an earlier node. A chain is ``parents = [-1, 0, 1, ...]``. Every drafter returns a
:class:`Draft`; the ones here build it from what the drafter found:

* :func:`merge_paths` -- prefix-merge candidate sequences (ADED's MCTS rollouts);
* :func:`count_trie` + :func:`top_by_count` -- a frequency trie of continuations and its most frequent nodes (REST);
* :func:`best_first` -- the most frequent nodes under a node of a pointer trie (N-gram trie).

Each node may carry ``scores[i]``: the drafter's estimate that node ``i`` is accepted *given that its parent is*
(frequency ratios for retrieval drafts, the draft model's confidence for model chains, a constant for copies).
:mod:`specdec_cli.budget` calibrates those estimates against what the target accepted and keeps the subtree worth
its verification time with :func:`select` and :func:`path_probs`.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

import numpy as np
import torch


@dataclass
class Draft:
    """Draft tokens forming a tree under the root.

    ``q_draft`` (``[n, V]``) is given only for a chain *sampled* from a draft model; it switches verification to
    rejection sampling. ``scores`` are per-node conditional acceptance estimates (see the module doc).
    """

    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    q_draft: torch.Tensor | None = None
    scores: list[float] | None = None
    cost_s: float = 0.0  # predicted drafting time (model drafters), for decisions that must not read the clock

    @classmethod
    def chain(cls, tokens: list[int], q_draft: torch.Tensor | None = None, scores: list[float] | None = None,
              cost_s: float = 0.0) -> "Draft":
        return cls(list(tokens), chain_parents(len(tokens)), q_draft, scores, cost_s)

    def __len__(self) -> int:
        return len(self.tokens)

    def subtree(self, nodes) -> "Draft":
        """The draft restricted to ``nodes`` (ascending indices of a prefix-closed set), re-indexed."""
        nodes = list(nodes)
        if len(nodes) == len(self.tokens):
            return self
        new_index = {old: new for new, old in enumerate(nodes)}
        parents = [-1 if self.parents[i] < 0 else new_index[self.parents[i]] for i in nodes]
        q = self.q_draft[nodes] if self.q_draft is not None and nodes else None
        scores = [self.scores[i] for i in nodes] if self.scores is not None else None
        return Draft([self.tokens[i] for i in nodes], parents, q, scores, self.cost_s)


# --- shape ---------------------------------------------------------------------------------------------------------


def is_chain(parents: list[int]) -> bool:
    return all(p == i - 1 for i, p in enumerate(parents))


def chain_parents(n: int) -> list[int]:
    return list(range(-1, n - 1))


def depths(parents: list[int]) -> list[int]:
    out: list[int] = []
    for p in parents:
        out.append(1 if p < 0 else out[p] + 1)
    return out


def ancestor_matrix(parents: list[int]) -> torch.Tensor:
    """``anc[i, j]`` is True when node ``j`` is ``i`` or an ancestor of ``i``; index 0 is the root."""
    n = len(parents) + 1
    anc = torch.zeros(n, n, dtype=torch.bool)
    anc[0, 0] = True
    for i, p in enumerate(parents, start=1):
        if not -1 <= p < i - 1:
            raise ValueError(f"draft tree parents must point to earlier nodes, got parents[{i - 1}] = {p}")
        anc[i] = anc[p + 1]
        anc[i, i] = True
    return anc


def children(tokens: list[int], parents: list[int]) -> dict[int, dict[int, int]]:
    """``children[node][token] = child`` (node -1 is the root); the first node wins if a token repeats."""
    out: dict[int, dict[int, int]] = {}
    for i, (tok, par) in enumerate(zip(tokens, parents)):
        out.setdefault(par, {}).setdefault(tok, i)
    return out


# --- building ------------------------------------------------------------------------------------------------------


def merge_paths(paths: list[list[int]], max_depth: int | None = None, path_scores: list[float] | None = None
                ) -> Draft:
    """Prefix-merge candidate sequences into a token tree: a shared prefix appears once.

    With ``path_scores`` (one weight per path), a node's score is the share of its parent's weight that passes
    through it (the candidates as an empirical distribution over continuations)."""
    tokens: list[int] = []
    parents: list[int] = []
    weight: list[float] = []
    index: dict[tuple[int, int], int] = {}  # (parent node, token) -> node
    weights = path_scores if path_scores is not None else [1.0] * len(paths)
    for path, w in zip(paths, weights):
        parent = -1
        for tok in path[:max_depth] if max_depth is not None else path:
            node = index.get((parent, tok))
            if node is None:
                node = len(tokens)
                tokens.append(tok)
                parents.append(parent)
                weight.append(0.0)
                index[(parent, tok)] = node
            weight[node] += w
            parent = node
    total = sum(weights[: len(paths)]) or 1.0
    scores = [weight[i] / (weight[p] if p >= 0 else total) for i, p in enumerate(parents)]
    return Draft(tokens, parents, scores=scores)


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
    :mod:`specdec_cli.counting`)."""
    from .counting import count_arrays

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


def best_first(node, budget: int, max_depth: int) -> Draft:
    """The ``budget`` most frequent nodes under ``node`` of a pointer trie (``.children: {token: child}``,
    ``.freq``), at most ``max_depth`` deep, as a draft tree whose scores are ``freq / parent freq``.

    Best-first with a heap keyed on (frequency desc, depth, discovery order): since a child's frequency never
    exceeds its parent's, this yields the top ``budget`` nodes and always emits a node after its parent."""
    tokens: list[int] = []
    parents: list[int] = []
    scores: list[float] = []
    total = sum(child.freq for child in node.children.values()) or 1
    heap: list = []
    order = 0
    for tok, child in node.children.items():
        heap.append((-child.freq, 1, order, tok, child, -1, total))
        order += 1
    heapq.heapify(heap)
    while heap and len(tokens) < budget:
        neg_freq, depth, _, tok, child, parent, parent_freq = heapq.heappop(heap)
        index = len(tokens)
        tokens.append(tok)
        parents.append(parent)
        scores.append(-neg_freq / max(parent_freq, 1))
        if depth < max_depth:
            for t, grandchild in child.children.items():
                heapq.heappush(heap, (-grandchild.freq, depth + 1, order, t, grandchild, index, -neg_freq))
                order += 1
    return Draft(tokens, parents, scores=scores)


# --- selection -----------------------------------------------------------------------------------------------------


def path_probs(parents: list[int], cond) -> np.ndarray:
    """Probability that each node is accepted: the product of conditional estimates from the root down."""
    out = np.empty(len(parents), dtype=np.float64)
    for i, p in enumerate(parents):
        out[i] = cond[i] * (out[p] if p >= 0 else 1.0)
    return out


def rank(parents: list[int], probs: np.ndarray) -> np.ndarray:
    """Nodes by acceptance probability, highest first; ties keep creation order (a parent before its child), so
    every prefix of the ranking is a prefix-closed subtree."""
    return np.lexsort((np.arange(len(parents)), -probs))


def best_size(sorted_probs: np.ndarray, verify_s, value_per_s: float, limit: int | None = None) -> int:
    """How many of the ranked nodes to verify: the ``k`` maximising ``E(k) - value_per_s * verify_s(k + 1)``.

    ``E(k) = 1 + sum of the k highest acceptance probabilities`` is the expected number of tokens a step emits;
    ``verify_s(n)`` the target's forward time for ``n`` tokens. ``k = 0`` (a plain autoregressive step) is always
    a candidate."""
    n = len(sorted_probs) if limit is None else min(limit, len(sorted_probs))
    gains = np.concatenate([[1.0], 1.0 + np.cumsum(sorted_probs[:n])])
    costs = np.array([verify_s(k + 1) for k in range(n + 1)])
    return int(np.argmax(gains - value_per_s * costs))


def causal_size(chain_probs: np.ndarray, verify_s, value_per_s: float, horizon: int = 8) -> int:
    """Like :func:`best_size` for a chain, but deciding node by node from the root, never looking at later nodes:
    what rejection sampling of a *sampled* chain needs to stay exact (whether position ``i`` is verified must not
    depend on the token drawn there, and later nodes' estimates do).

    Node ``i`` is kept when it, and up to ``horizon`` more nodes extrapolated at its own conditional rate, would
    add more expected tokens than their verification time is worth (so one step in ``verify_s`` does not stop a
    chain that would pay for it a few nodes later)."""
    k = 0
    while k < len(chain_probs):
        p = chain_probs[k]
        rate = p / chain_probs[k - 1] if k and chain_probs[k - 1] > 0 else p
        gain, best, extra = 0.0, -1.0, p
        for m in range(1, horizon + 1):
            gain += extra
            best = max(best, gain - value_per_s * (verify_s(k + m + 1) - verify_s(k + 1)))
            extra *= rate
        if best <= 0:
            break
        k += 1
    return k


def select(draft: Draft, cond, verify_s, value_per_s: float, *, causal: bool = False, limit: int | None = None
           ) -> Draft:
    """The prefix-closed part of ``draft`` worth verifying (possibly empty), given calibrated conditional
    acceptance estimates ``cond`` (one per node), the target's ``verify_s(n)`` and the value of a second."""
    if not len(draft):
        return draft
    probs = path_probs(draft.parents, cond)
    if causal:
        k = causal_size(probs, verify_s, value_per_s)
        if limit is not None:
            k = min(k, limit)
        return draft.subtree(range(k))
    order = rank(draft.parents, probs)
    k = best_size(probs[order], verify_s, value_per_s, limit)
    return draft.subtree(sorted(order[:k].tolist()))
