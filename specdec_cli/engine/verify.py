"""Acceptance rules. Both are exact: the emitted tokens are distributed as autoregressive decoding from
``p_target`` (greedy: identical to it).

* :func:`verify_rejection` -- a chain drafted by a model with distributions ``q_draft``: accept ``x_i`` with
  probability ``min(1, p_target(x_i) / q_draft(x_i))``; at the first rejection draw from the residual
  ``norm(max(0, p_target - q_draft))``; after a fully accepted chain draw the bonus token from ``p_target``.
* :func:`verify_tree` -- deterministic drafts (retrieval, n-gram, tries; or any draft when greedy): walk down
  from the root, draw ``y ~ p_target`` at the current node (argmax when greedy) and descend into the child whose
  token is ``y``; stop when there is none, emitting ``y``. Every emitted token is a draw from ``p_target`` given
  the accepted prefix, so the output distribution is exactly the target's.
"""

from __future__ import annotations

import torch

from .sampling import Draws, SamplingConfig, logits_to_probs, pick, sample, uniform
from .trees import chain_parents, children


def verify_tree(
    logits: torch.Tensor,
    tokens: list[int],
    parents: list[int],
    cfg: SamplingConfig,
    generator: torch.Generator | None,
    draws: Draws | None = None,
    position: int = 0,
) -> tuple[list[int], int]:
    """Returns ``(path, next_token)``: accepted node indices from the root down, and the token drawn after them.
    With ``draws``, the token for sequence position ``position + depth`` is drawn by ``draws.at`` of that position
    (``position``: where the root's successor goes) instead of from ``generator``."""
    kids = children(tokens, parents)
    path: list[int] = []
    node = -1
    while True:
        gen = draws.at(position + len(path)) if draws is not None and not cfg.greedy else generator
        y = pick(logits[node + 1], cfg, gen)
        child = kids.get(node, {}).get(y)
        if child is None:
            return path, y
        path.append(child)
        node = child


def verify_rejection(
    logits: torch.Tensor,
    tokens: list[int],
    q_draft: torch.Tensor,
    cfg: SamplingConfig,
    generator: torch.Generator | None,
) -> tuple[list[int], int]:
    """Speculative sampling (Leviathan et al. / Chen et al.) for a chain; returns ``(path, next_token)``."""
    if cfg.greedy:
        return verify_tree(logits, tokens, chain_parents(len(tokens)), cfg, generator)
    p_target = logits_to_probs(logits, cfg)
    q_draft = q_draft.to(p_target.device).float()
    for i, x in enumerate(tokens):
        p, q = p_target[i, x].item(), q_draft[i, x].item()
        if q > 0 and uniform(generator) < min(1.0, p / q):
            continue
        residual = (p_target[i] - q_draft[i]).clamp_min(0)
        if residual.sum() <= 0:  # p == q up to rounding: the residual is then p itself
            residual = p_target[i]
        return list(range(i)), sample(residual / residual.sum(), generator)
    return list(range(len(tokens))), sample(p_target[len(tokens)], generator)
