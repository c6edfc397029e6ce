"""``sd``: vanilla speculative sampling (Leviathan et al. 2023; Chen et al. 2023).

The draft model samples a chain of ``K`` tokens from ``q_draft``; the target checks them in one forward pass
with rejection sampling (``min(1, p_target/q_draft)``, residual ``max(0, p_target - q_draft)``).
"""

from __future__ import annotations

import torch

from ..decoding import Draft, Drafter
from ..draft_model import DraftModel
from ..sampling import logits_to_probs, sample


def draft_chain(dm: DraftModel, tokens: list[int], k: int, cfg, generator) -> tuple[list[int], torch.Tensor]:
    """Sample ``k`` tokens from the draft model; returns them and their distributions ``q_draft [k, V]``."""
    out: list[int] = []
    qs: list[torch.Tensor] = []
    logits = dm.logits_after(tokens)
    for i in range(k):
        q = logits_to_probs(logits, cfg)
        x = int(q.argmax()) if cfg.greedy else sample(q, generator)
        out.append(x)
        qs.append(q)
        if i + 1 < k:
            logits = dm.step(x)
    return out, torch.stack(qs) if qs else torch.empty(0)


class SpeculativeSampling(Drafter):
    name = "sd"

    def __init__(self, draft, vocab_size: int, window: int = 5):
        self.dm = DraftModel(draft, vocab_size)
        self.window = window

    def start(self, prompt, cfg, generator) -> None:
        super().start(prompt, cfg, generator)
        self.dm.reset()

    def propose(self, tokens: list[int], max_tokens: int) -> Draft:
        k = min(self.window, max_tokens)
        if k <= 0:
            return Draft()
        xs, q_draft = draft_chain(self.dm, tokens, k, self.cfg, self.generator)
        return Draft.chain(xs, q_draft)


def build(ctx) -> Drafter:
    return SpeculativeSampling(ctx.drafts[0], ctx.target.vocab_size, ctx.window or 5)
