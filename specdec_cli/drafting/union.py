"""One draft tree from many sources: identical paths become one node, and each node keeps every source's own
estimate that it is accepted given its parent is.

Each source's estimates are calibrated separately (:class:`SourceCalibration`: a
:class:`~specdec_cli.engine.budget.Calibrator` per source and match-length bucket, learning from what the target accepted
of that source's nodes); a node's estimate is the best of its sources', and the estimates of a node's children
are scaled down together when they add up to more than one (at most one child can be the target's token).
"""

from __future__ import annotations

import numpy as np

from ..engine import trees
from ..engine.budget import Calibrator
from ..engine.trees import Draft


class UnionTree:
    def __init__(self):
        self.tokens: list[int] = []
        self.parents: list[int] = []
        self.depths: list[int] = []
        self.raw: list[dict[str, dict[int, float]]] = []  # node -> {source: {bucket: raw score}}
        self.index: dict[tuple[int, int], int] = {}  # (parent node, token) -> node

    def __len__(self) -> int:
        return len(self.tokens)

    def add(self, draft: Draft, source: str, bucket: int = 0, under: int = -1) -> list[int]:
        """Merge ``draft`` (a tree under node ``under``) into the union; returns the union node of each node."""
        scores = draft.scores if draft.scores is not None else [1.0] * len(draft)
        mapped: list[int] = []
        for tok, par, score in zip(draft.tokens, draft.parents, scores):
            parent = under if par < 0 else mapped[par]
            node = self.index.get((parent, tok))
            if node is None:
                node = len(self.tokens)
                self.index[(parent, tok)] = node
                self.tokens.append(int(tok))
                self.parents.append(parent)
                self.depths.append(1 if parent < 0 else self.depths[parent] + 1)
                self.raw.append({})
            cells = self.raw[node].setdefault(source, {})  # a source may propose a node twice (two kinds of
            if score > cells.get(bucket, -1.0):  # evidence, two buckets): each bucket calibrates on its own
                cells[bucket] = float(score)
            mapped.append(node)
        return mapped

    def path(self, node: int) -> list[int]:
        """The tokens from the root down to ``node``."""
        out = []
        while node >= 0:
            out.append(self.tokens[node])
            node = self.parents[node]
        return out[::-1]

    def locate(self, draft: Draft) -> list[int]:
        """The union node of each node of ``draft``, a subtree of this union (re-indexed by the budget)."""
        mapped: list[int] = []
        for tok, par in zip(draft.tokens, draft.parents):
            mapped.append(self.index[(-1 if par < 0 else mapped[par], tok)])
        return mapped


class SourceCalibration:
    """Per (source, bucket) calibrated acceptance of raw scores, learnt from verified steps."""

    def __init__(self):
        self.cells: dict[tuple[str, int], Calibrator] = {}

    def reset(self) -> None:
        self.cells.clear()

    def calibrator(self, source: str, bucket: int) -> Calibrator:
        cal = self.cells.get((source, bucket))
        if cal is None:
            cal = self.cells[(source, bucket)] = Calibrator()
        return cal

    def state(self) -> list:
        return [[name, bucket, cal.state()] for (name, bucket), cal in self.cells.items()]

    @staticmethod
    def cells_of(state) -> dict[tuple[str, int], Calibrator]:
        """The cells of :meth:`state`'s answer (ValueError for data that is not one)."""
        from ..io.state import count

        cells = {}
        for name, bucket, cal_state in state:
            if not isinstance(name, str):
                raise ValueError("calibration source")
            cal = Calibrator()
            cal.load_state(cal_state)
            cells[(name, count(bucket))] = cal
        return cells

    def estimate(self, source: str, bucket: int, depths, scores) -> np.ndarray:
        return self.calibrator(source, bucket).estimate(depths, scores)

    def combined(self, union: UnionTree, start: int = 0) -> np.ndarray:
        """Each node's estimate (from node ``start`` on): the best of its sources' (and buckets') calibrated ones."""
        groups: dict[tuple[str, int], list[tuple[int, float]]] = {}
        for node in range(start, len(union)):
            for source, cells in union.raw[node].items():
                for bucket, score in cells.items():
                    groups.setdefault((source, bucket), []).append((node, score))
        out = np.zeros(len(union) - start)
        for (source, bucket), items in groups.items():
            nodes = np.array([n for n, _ in items])
            est = self.estimate(source, bucket, [union.depths[n] for n in nodes], [s for _, s in items])
            np.maximum.at(out, nodes - start, est)
        return out

    def observe(self, union: UnionTree, nodes: list[int], accepted: list[bool]) -> None:
        """``nodes`` (union nodes) were tested; ``accepted[i]`` says whether node ``i`` was the target's token."""
        groups: dict[tuple[str, int], list[tuple[int, float, bool]]] = {}
        for node, ok in zip(nodes, accepted):
            for source, cells in union.raw[node].items():
                for bucket, score in cells.items():
                    groups.setdefault((source, bucket), []).append((union.depths[node], score, ok))
        for (source, bucket), items in groups.items():
            depths, scores, oks = zip(*items)
            self.calibrator(source, bucket).add(depths, scores, oks)


def normalise_siblings(parents: list[int], cond: np.ndarray) -> np.ndarray:
    """Scale the estimates of each node's children down so that they add up to at most one."""
    totals: dict[int, float] = {}
    for p, c in zip(parents, cond):
        totals[p] = totals.get(p, 0.0) + float(c)
    scale = np.array([1.0 / max(totals[p], 1.0) for p in parents])
    return cond * scale


def best_subtree(union: UnionTree, cond: np.ndarray, max_nodes: int) -> tuple[Draft, list[int]]:
    """The ``max_nodes`` nodes most likely to be accepted (prefix-closed), as a draft scored with ``cond``, and
    the union node of each of its nodes."""
    probs = trees.path_probs(union.parents, cond)
    order = trees.rank(union.parents, probs)[:max_nodes]
    keep = sorted(order.tolist())
    new_index = {old: new for new, old in enumerate(keep)}
    parents = [-1 if union.parents[i] < 0 else new_index[union.parents[i]] for i in keep]
    draft = Draft([union.tokens[i] for i in keep], parents, scores=[float(cond[i]) for i in keep])
    return draft, keep
