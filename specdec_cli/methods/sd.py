"""``sd``: vanilla speculative sampling (Leviathan et al. 2023; Chen et al. 2023).

The draft model samples a chain from ``q_draft``; the target checks it in one forward pass with rejection sampling
(``min(1, p_target/q_draft)``, residual ``max(0, p_target - q_draft)``). With ``--budget paper`` the chain is
always ``K`` tokens (default 5, ``--window``); with ``--budget auto`` (default) it stops as soon as one more
draft-model forward is not worth its expected gain on this machine (cap ``--window``, default 16).
"""

from __future__ import annotations

from ..engine.loop import Draft, Drafter
from ..drafting.draft_model import DraftModel, draft_chain, draft_model_for

PAPER_WINDOW = 5
AUTO_WINDOW = 16


class SpeculativeSampling(Drafter):
    probe_prefills = True  # its draft model skips the prompt while gated (engine.drafter.Drafter)
    name = "sd"

    def __init__(self, draft, vocab_size: int, window: int = PAPER_WINDOW, profiled: bool = False):
        """``draft``: a :class:`DraftModel`, or a loaded model of the target's tokenizer."""
        self.dm = draft if isinstance(draft, DraftModel) else DraftModel(draft, vocab_size, profiled)
        self.window = window

    def start(self, prompt, cfg, generator) -> None:
        super().start(prompt, cfg, generator)
        self.dm.prefill(prompt, now=self.budget.drafting)

    def use_target_cache(self, cache) -> None:
        self.dm.use_target_cache(cache)

    def propose(self, tokens: list[int], max_tokens: int) -> Draft:
        k = min(self.window, max_tokens)
        return draft_chain(self.dm, tokens, k, self.cfg, self.generator, self.budget).draft()


def build(ctx) -> Drafter:
    default = PAPER_WINDOW if ctx.budget.paper else AUTO_WINDOW
    dm = draft_model_for(ctx.drafts[0], ctx.target, ctx.budget.adaptive)
    return SpeculativeSampling(dm, ctx.target.vocab_size, ctx.window or default)
