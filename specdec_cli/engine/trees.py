"""Draft trees: their shape, how drafters build them, and which part of them is worth verifying.

A draft is a tree under the *root* (the last token of the sequence): ``parents[i] = -1`` for a child of the root,
otherwise the index of an earlier node. A chain is ``parents = [-1, 0, 1, ...]``. Every drafter returns a
:class:`Draft`; the ones here build it from what the drafter found:

* :func:`merge_paths` -- prefix-merge candidate sequences (ADED's MCTS rollouts);
* :func:`specdec_cli.drafting.count_trie.count_trie` + ``top_by_count`` -- a frequency trie of continuations and
  its most frequent nodes (REST);
* :func:`best_first` -- the most frequent nodes under a node of a pointer trie (N-gram trie).

Each node may carry ``scores[i]``: the drafter's estimate that node ``i`` is accepted *given that its parent is*
(frequency ratios for retrieval drafts, the draft model's confidence for model chains, a constant for copies).
:mod:`specdec_cli.engine.budget` calibrates those estimates against what the target accepted and keeps the subtree worth
its verification time with :func:`select` and :func:`path_probs`.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

import numpy as np
import torch

from ..runtime.positions import chain_parents, depths  # noqa: F401 - depths: the tree shape, for its users


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
        """The draft restricted to ``nodes`` (indices of a prefix-closed set, each after its parent), re-indexed."""
        nodes = list(nodes)
        if nodes == list(range(len(self.tokens))):
            return self
        new_index = {old: new for new, old in enumerate(nodes)}
        parents = [-1 if self.parents[i] < 0 else new_index[self.parents[i]] for i in nodes]
        q = self.q_draft[nodes] if self.q_draft is not None and nodes else None
        scores = [self.scores[i] for i in nodes] if self.scores is not None else None
        return Draft([self.tokens[i] for i in nodes], parents, q, scores, self.cost_s)


# --- shape ---------------------------------------------------------------------------------------------------------


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


def likeliest_path_first(draft: Draft, probs: np.ndarray) -> Draft:
    """The same tree with its nodes in depth-first order, the likelier child first. The likeliest path then takes
    rows ``0..k`` of the verification, and when the target accepts a prefix of it (the common case) the KV cache
    keeps it by a crop instead of moving the accepted rows down in every layer. Verification does not depend on
    the order (the tree walk follows tokens)."""
    if len(draft) < 2 or all(p == i - 1 for i, p in enumerate(draft.parents)):
        return draft
    kids: dict[int, list[int]] = {}
    for i, p in enumerate(draft.parents):
        kids.setdefault(p, []).append(i)
    order, stack = [], sorted(kids.get(-1, []), key=lambda i: probs[i])
    while stack:
        node = stack.pop()
        order.append(node)
        stack.extend(sorted(kids.get(node, []), key=lambda i: probs[i]))  # the likeliest child is popped next
    return draft.subtree(order)


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
    kept = sorted(order[:k].tolist())
    return likeliest_path_first(draft.subtree(kept), probs[kept])
