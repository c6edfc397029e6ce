"""``self-verify``: speculative sampling with an entropy-bounded dynamic window (HSDDW, Algorithm 1).

The draft model samples tokens and stops drafting as soon as it is unsure: after drafting ``x_i`` from
``q_i``, it stops when ``H(q_i) > tau`` (``x_i`` itself is still sent, as in the paper: ``l = i`` then break).
``tau`` -- the *confidence threshold* -- is the running mean entropy of the drafted tokens the target rejected
in the current generation. The window is capped at ``K`` (default 10). Verification is the engine's ordinary
rejection sampling with ``q_draft``, so the method is exactly lossless whatever ``tau`` does: the decision to
draft position ``i + 1`` depends only on ``x_1 .. x_i``, never on the token drawn there.

Cold start: the paper starts at ``tau = 0``, which stops after every token (window 1) until the first
rejection. By default we start at ``tau = inf`` instead (full window ``K``, i.e. vanilla SD, until there is a
rejected token to learn from); ``--opt tau0=0`` gives the paper-literal behaviour, any other value a fixed
prior. Once a token has been rejected, ``tau`` is the plain mean of the rejected entropies (``tau0`` no longer
counts). See docs/hsddw.md.
"""

from __future__ import annotations

import math

from ..engine.loop import Draft, Drafter, Outcome
from ..drafting.draft_model import DraftModel, draft_chain, draft_model_for
from ..drafting.entropy_window import DEFAULT_WINDOW, EntropyThreshold, json_tau, rejected_index, window_summary


class SelfVerify(Drafter):
    probe_prefills = True  # its draft model skips the prompt while gated (engine.drafter.Drafter)
    name = "self-verify"

    def __init__(self, dm: DraftModel, window: int = DEFAULT_WINDOW, tau0: float = math.inf):
        self.dm = dm
        self.window = window
        self.tau0 = tau0

    def start(self, prompt, cfg, generator) -> None:
        super().start(prompt, cfg, generator)
        self.dm.prefill(prompt, now=self.budget.drafting)
        self.tau = EntropyThreshold(self.tau0)
        self.entropies: list[float] = []  # of the pending draft
        self.window_sizes: list[int] = []

    def use_target_cache(self, cache) -> None:
        self.dm.use_target_cache(cache)

    def propose(self, tokens: list[int], max_tokens: int) -> Draft:
        k = min(self.window, max_tokens)
        chain = draft_chain(self.dm, tokens, k, self.cfg, self.generator, self.budget, tau=self.tau.value,
                            entropies=True)
        self.entropies = chain.entropies
        self.window_sizes.append(len(chain.tokens))
        return chain.draft()

    def accept(self, tokens: list[int], outcome: Outcome) -> None:
        i = rejected_index(outcome)
        if i is not None:
            self.tau.reject(self.entropies[i])

    def stats(self) -> dict:
        return {
            "tau": json_tau(self.tau.value),
            "tau_rejections": len(self.tau.rejected),
            "window_sizes": list(self.window_sizes),
            "window_summary": window_summary(self.window_sizes),
        }


def build(ctx) -> Drafter:
    dm = draft_model_for(ctx.drafts[0], ctx.target, profiled=ctx.budget.adaptive)
    return SelfVerify(dm, ctx.window or DEFAULT_WINDOW, ctx.opt("tau0"))
