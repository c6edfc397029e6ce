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

import math
import random
from dataclasses import dataclass



@dataclass
class MCTSConfig:
    iterations: int = 150  # s in the paper
    c1: float = 32.0
    c2: float = 8.0
    depth: int = 4  # l: search depth = length of each candidate continuation
    candidates: int = 24  # n: continuation candidates merged into the draft tree


def exploration(total_visits: int, c1: float, c2: float) -> float:
    """Eq. 3: ``E = C1 + log((sum_b N(s, b) + C2 + 1) / C2)`` -- grows slowly with the parent's visits."""
    return c1 + math.log((total_visits + c2 + 1) / c2)


def puct(q: float, prior: float, visits: int, total_visits: int, c1: float, c2: float) -> float:
    """Eq. 2: ``Q(s, a) + E * P(s, a) * sqrt(sum_b N(s, b)) / (1 + N(s, a))``."""
    return q + exploration(total_visits, c1, c2) * prior * math.sqrt(total_visits) / (1 + visits)


class Node:
    """A search node: ``token`` reached from a parent whose own token is ``prev`` (the tri-gram context)."""

    __slots__ = ("token", "prev", "prior", "parent", "children", "untried", "visits", "score")

    def __init__(self, token: int, prev: int, prior: float, parent: "Node | None", untried: tuple):
        self.token, self.prev, self.prior, self.parent = token, prev, prior, parent
        self.children: list[Node] = []
        self.untried = untried  # (next ids, probabilities) the matrix keeps after (prev, token)
        self.visits = 0
        self.score = 0.0

    def q(self) -> float:
        """Mean backed-up score; 0 for an unvisited child."""
        return self.score / self.visits if self.visits else 0.0


def select_child(node: Node, c1: float, c2: float) -> Node:
    """The child with the highest PUCT score (first one on ties: children are ordered by prior)."""
    total = sum(ch.visits for ch in node.children)
    return max(node.children, key=lambda ch: puct(ch.q(), ch.prior, ch.visits, total, c1, c2))


def expand(node: Node, matrix) -> Node:
    """Algorithm 1 lines 14-23: one child per candidate next token; returns the last child created."""
    ids, ps = node.untried
    for tok, p in zip(ids, ps):
        node.children.append(Node(tok, node.token, p, node, matrix.probs(node.token, tok)))
    return node.children[-1]


def simulate(state: list[int], length: int, matrix, rng: random.Random) -> None:
    """Extend ``state`` in place to ``length`` tokens by sampling the tri-gram distribution (stops if unseen)."""
    while len(state) < length:
        ids, ps = matrix.probs(state[-2], state[-1])
        if not ids:
            return
        state.append(rng.choices(ids, weights=ps)[0])


def rollout_score(state: list[int], matrix) -> float:
    """Algorithm 1 lines 35-38: ``1 + sum`` of the tri-gram probabilities of the drafted tokens."""
    return 1.0 + sum(matrix.prob(state[i - 2], state[i - 1], state[i]) for i in range(2, len(state)))


def backpropagate(node: Node | None, score: float) -> None:
    while node is not None:
        node.visits += 1
        node.score += score
        node = node.parent


def run_mcts(matrix, prev: int, root_token: int, cfg: MCTSConfig, rng: random.Random,
             depth: int | None = None) -> list[tuple[list[int], float]]:
    """Candidate continuations of ``(..., prev, root_token)``, best score first (at most ``cfg.candidates``).

    ``state`` holds ``[prev, root, drafted...]`` so that every step has its two context tokens.
    """
    depth = cfg.depth if depth is None else depth
    root = Node(root_token, prev, 1.0, None, matrix.probs(prev, root_token))
    if depth < 1 or not root.untried[0]:
        return []
    full = depth + 2
    best: dict[tuple[int, ...], float] = {}
    for _ in range(cfg.iterations):
        node, state = root, [prev, root_token]
        while node.untried[0] and node.children and len(state) < full:  # selection
            node = select_child(node, cfg.c1, cfg.c2)
            state.append(node.token)
        if node.untried[0] and not node.children and len(state) < full:  # expansion
            node = expand(node, matrix)
            state.append(node.token)
        simulate(state, full, matrix, rng)
        score = rollout_score(state, matrix)
        backpropagate(node, score)
        seq = tuple(state[2:])
        if score > best.get(seq, -1.0):
            best[seq] = score
    ranked = sorted(best.items(), key=lambda kv: -kv[1])  # stable: earlier rollouts first on ties
    return [(list(seq), score) for seq, score in ranked[: cfg.candidates]]
