"""``hsddw``: Hierarchical Speculative Decoding with Dynamic Window (HSDDW, Algorithm 2).

Three models: a fast draft ``M1`` (``ctx.drafts[0]``), a stronger draft ``M2`` (``ctx.drafts[1]``) and the
target. One :meth:`Hsddw.propose` call runs rounds of

1. **Draft + self-verify** -- ``M1`` samples tokens from ``q1`` until ``H(q1_i) > tau1`` (or ``K`` tokens);
2. **Pre-verify** -- one ``M2`` forward over them gives ``q2``; rejection sampling of ``q1`` against ``q2``
   accepts a prefix and draws a correction (or a bonus token) from ``q2``. By the speculative-sampling theorem
   the emitted tokens are distributed exactly as sampling from ``M2``: each one is a draw from ``q2`` given
   everything before it. ``M2``'s rejections update ``tau1``;
3. **Self-verify of M2** -- when ``H(q2)`` of an emitted token exceeds ``tau2`` (M2 is unsure), the round ends
   the proposal; otherwise another round starts after the emitted tokens;

until ``M2`` loses confidence or the chain reaches the cap (``--opt max_draft``, default ``2K``) or the
new-token budget. The chain goes to the target with ``q_draft = q2`` rows, so the engine's rejection sampling
makes the output exactly the target's distribution: whether position ``j`` is in the chain is decided before
the token at ``j`` is drawn, and given that history the token is a draw from ``q2``. The target's rejections
update ``tau2``. Greedy: all by argmax (pre-verify keeps M1's tokens while they equal M2's argmax and puts
M2's argmax at the first mismatch), so the output equals the target's greedy output.

Thresholds start at ``tau0`` (default ``inf``; ``--opt tau0=0`` is the paper's cold start, ``tau1_0`` /
``tau2_0`` set them apart). See docs/hsddw.md.
"""

from __future__ import annotations

import math

import torch

from ..engine.loop import Draft, Drafter, Outcome
from ..drafting.draft_model import GREEDY, DraftModel, confidence, confidence_entropy, draft_chain, draft_model_for
from ..drafting.entropy_window import DEFAULT_WINDOW, EntropyThreshold, json_tau, rejected_index, window_summary
from ..engine.metrics import ratio
from ..engine.sampling import logits_to_probs
from ..engine.trees import chain_parents
from ..engine.verify import verify_rejection, verify_tree


class Hsddw(Drafter):
    probe_prefills = True  # its draft model skips the prompt while gated (engine.drafter.Drafter)
    name = "hsddw"

    def __init__(self, m1: DraftModel, m2: DraftModel, window: int = DEFAULT_WINDOW, max_draft: int | None = None,
                 tau1_0: float = math.inf, tau2_0: float = math.inf):
        self.m1, self.m2 = m1, m2
        self.window = window  # M1's per-round window cap K
        self.max_draft = max_draft or 2 * window  # cap on the chain sent to the target
        self.tau1_0, self.tau2_0 = tau1_0, tau2_0

    def start(self, prompt, cfg, generator) -> None:
        super().start(prompt, cfg, generator)
        m2_prompt = self.m2.bridge.draft_context(prompt) if self.m2.bridge is not None else prompt  # M1 drafts for M2
        self.m1.prefill(m2_prompt, now=self.budget.drafting)
        self.m2.prefill(prompt, now=self.budget.drafting)
        self.tau1 = EntropyThreshold(self.tau1_0)
        self.tau2 = EntropyThreshold(self.tau2_0)
        self.h2: list[float] = []  # M2 entropies of the pending chain
        self.m1_drafted = self.m1_accepted = self.m2_forwards = 0
        self.chain_drafted = self.chain_accepted = self.target_forwards = self.emitted = 0
        self.window_sizes: list[int] = []  # chain length sent to the target, per target step
        self.m1_window_sizes: list[int] = []  # M1 draft length, per round

    def use_target_cache(self, cache) -> None:
        self.m1.use_target_cache(cache)
        self.m2.use_target_cache(cache)

    def pre_verify_round(self, prefix: list[int], room: int, cfg):
        """One M1 draft + M2 pre-verify round; returns the emitted tokens (at most ``room``), their q2 rows
        (sampling only), M2's confidences and entropies. The drafted tokens ride along in the same M2 forward, so
        pre-verification costs a single M2 forward per round."""
        chain = draft_chain(self.m1, prefix, min(self.window, room), cfg, self.generator,
                            tau=self.tau1.value, entropies=True)
        xs = chain.tokens
        logits2 = self.m2.logits_rows(prefix + xs, len(xs) + 1)
        q1 = torch.stack(chain.q_rows) if chain.q_rows else None
        if q1 is None:  # a fixed chain (greedy, or M1 of another tokenizer): M2's exact walk along it
            path, y = verify_tree(logits2, xs, chain_parents(len(xs)), cfg, self.generator)
        else:
            path, y = verify_rejection(logits2, xs, q1, cfg, self.generator)
        n = len(path)
        self.m1_drafted += len(xs)
        self.m1_accepted += n
        self.m2_forwards += 1
        self.m1_window_sizes.append(len(xs))
        if n < len(xs):
            self.tau1.reject(chain.entropies[n])
        emitted = (xs[:n] + [y])[:room]
        rows = logits2[: len(emitted)]
        q2 = None if cfg.greedy else logits_to_probs(rows, cfg)
        conf = [confidence(row) if q2 is None else float(q2[i].max()) for i, row in enumerate(rows)]
        h2 = [confidence_entropy(row, None if q2 is None else q2[i], cfg) for i, row in enumerate(rows)]
        return emitted, q2, conf, h2

    def propose(self, tokens: list[int], max_tokens: int) -> Draft:
        bridge = self.m2.bridge  # M2 of another tokenizer than the target's: the rounds run in M2's tokens
        if bridge is None:
            return self.rounds(tokens, max_tokens, self.cfg)
        context = bridge.draft_context(tokens)
        if not context:
            return Draft()
        own = self.rounds(context, max_tokens + 1, GREEDY)  # a fixed chain: the target walks it exactly
        ids, cover = self.m2.translate(own.tokens, max_tokens)
        self.h2 = [self.h2[j] for j in cover]  # M2's entropy per target token, for tau2's update on a rejection
        return Draft.chain(ids, None, [own.scores[j] for j in cover]) if ids else Draft()

    def rounds(self, tokens: list[int], max_tokens: int, cfg) -> Draft:
        """Pre-verify rounds after ``tokens`` (M2's token ids), sampling with ``cfg`` (greedy for a chain that
        another tokenizer's target verifies by the exact tree walk)."""
        cap = min(self.max_draft, max_tokens)
        chain: list[int] = []
        rows: list[torch.Tensor] = []
        scores: list[float] = []
        self.h2 = []
        path_prob = 1.0
        while len(chain) < cap:
            emitted, q2, conf, h2 = self.pre_verify_round(tokens + chain, cap - len(chain), cfg)
            chain += emitted
            if q2 is not None:
                rows.append(q2)
            scores += conf
            self.h2 += h2
            if max(h2) > self.tau2.value:  # M2 is unsure: let the target verify now
                break
            if self.budget.adaptive:  # another round only if its expected tokens pay for its M1 + M2 time
                for depth in range(len(chain) - len(emitted) + 1, len(chain) + 1):
                    cond = self.budget.calibrate_one(depth, scores[depth - 1])
                    path_prob *= cond
                per_token = self.m1.profile(1) + self.m2.profile(self.window + 1) / self.window
                if not self.budget.extend(path_prob, cond, len(chain), per_token):
                    break
        self.window_sizes.append(len(chain))
        return Draft.chain(chain, torch.cat(rows) if rows else None, scores) if chain else Draft()

    def accept(self, tokens: list[int], outcome: Outcome) -> None:
        self.target_forwards += 1
        self.chain_drafted += len(outcome.draft)
        self.chain_accepted += len(outcome.path)
        self.emitted += len(outcome.path) + 1
        i = rejected_index(outcome)
        if i is not None:
            self.tau2.reject(self.h2[i])

    def stats(self) -> dict:
        return {
            "tau1": json_tau(self.tau1.value),
            "tau2": json_tau(self.tau2.value),
            "tau1_rejections": len(self.tau1.rejected),
            "tau2_rejections": len(self.tau2.rejected),
            "m1_drafted": self.m1_drafted,
            "m1_accepted_by_m2": self.m1_accepted,
            "sigma_m1": 1 - ratio(self.m1_accepted, self.m1_drafted) if self.m1_drafted else None,
            "m2_chain_tokens": self.chain_drafted,
            "m2_accepted_by_target": self.chain_accepted,
            "sigma_m2": 1 - ratio(self.chain_accepted, self.chain_drafted) if self.chain_drafted else None,
            # end to end: M1 tokens drafted vs draft tokens that reached the output
            "sigma_m1_to_target": 1 - ratio(self.chain_accepted, self.m1_drafted) if self.m1_drafted else None,
            "m2_forwards": self.m2_forwards,
            "eta_m2": ratio(self.m2_forwards, self.emitted),
            "eta_target": ratio(self.target_forwards, self.emitted),
            "window_sizes": list(self.window_sizes),
            "window_summary": window_summary(self.window_sizes),
            "m1_window_sizes": list(self.m1_window_sizes),
            "m1_window_summary": window_summary(self.m1_window_sizes),
        }


def build(ctx) -> Drafter:
    window = ctx.window or DEFAULT_WINDOW
    tau0 = ctx.opt("tau0")
    tau1, tau2, cap = ctx.opt("tau1_0"), ctx.opt("tau2_0"), ctx.opt("max_draft")
    profiled = ctx.budget.adaptive
    m1 = draft_model_for(ctx.drafts[0], ctx.drafts[1], profiled)  # M1 drafts for M2, M2 for the target
    return Hsddw(m1, draft_model_for(ctx.drafts[1], ctx.target, profiled), window,
                 cap or 2 * window, tau0 if tau1 is None else tau1, tau0 if tau2 is None else tau2)
