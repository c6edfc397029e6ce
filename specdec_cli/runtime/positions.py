"""The shape of a draft tree as the forward sees it: node depths (position offsets), the ancestor mask, chains.

A draft is a tree under the *root* (the last token of the sequence): ``parents[i] = -1`` for a child of the root,
otherwise the index of an earlier node (:mod:`specdec_cli.engine.trees`).
"""

from __future__ import annotations

import torch


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
