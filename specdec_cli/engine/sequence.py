"""One sequence being decoded, and the two halves of its step that every loop shares.

A step of speculative decoding is, for each sequence, ``propose`` (the drafter's draft, priced by its budget and cut
to what the cache can take) before the target's forward, and ``settle`` (exact verification, the budget's and the
drafter's learning, stop tokens, emission) after it. :func:`specdec_cli.engine.loop.generate` runs one sequence
through a one-sequence cache; :func:`specdec_cli.engine.batch.generate_batch` runs many through one batched
forward. Both call these two methods and nothing else decides a step, so a gate or a statistic added here holds
for every caller:

    seq.propose(max_new_tokens, vocab, share, max_nodes)     # -> seq.draft (Draft of n nodes)
    logits = forward(root=seq.tokens[-1], seq.draft)          # [1 + n, V], row 0 = root
    keep = seq.settle(logits, sampling, stop_ids, max_new_tokens, verify_s)   # cache rows to keep
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch

from . import trees
from .budget import StepPlan
from .drafter import Draft, GenerationResult, Outcome, StepStats, fit_draft
from .drafters import Drafters
from .sampling import Draws, SamplingConfig
from .verify import verify_rejection, verify_tree


def hopeless(budget, share) -> bool:
    """Whether even a draft token sure to be accepted costs more than it yields: one more query position (priced
    at ``share(n)``, the sequence's share of a forward of ``n`` positions per row) is worth more time than a token at
    the current value of time. Then the sequence does not draft at all (no drafting time either): a batch that
    fills the machine decodes plainly. One sequence alone on a CPU never gets there (one more position costs ~2% of
    a step), but the rule is the same for every loop."""
    return budget.adaptive and budget.value * (share(2) - share(1)) >= 1.0


@dataclass
class Sequence:
    """One prompt's decoding state: tokens, emitted output, per-step statistics and the current step's draft;
    ``drafters`` holds its drafting state, keyed by ``index``. ``view``: the KV cache it decodes in (a
    one-sequence cache, or its row of a batched one)."""

    index: int  # its prompt's position in the input: its id for the drafters
    prompt: list[int]
    drafters: Drafters
    view: object
    generator: torch.Generator
    draws: Draws
    t_start: float
    prefill_s: float = 0.0
    tokens: list[int] = field(default_factory=list)
    out: list[int] = field(default_factory=list)
    steps: list[StepStats] = field(default_factory=list)
    stopped_by: str = "length"
    plan: StepPlan | None = None
    draft: Draft | None = None
    drafting: bool = False
    draft_s: float = 0.0

    def begin(self, sampling: SamplingConfig, price=None) -> None:
        """Before the first step: the sequence takes a drafter slot, whose budget restarts its per-generation
        state and which reads the prompt (and the target's cache, when its draft model shares it). ``price``:
        what a forward costs this sequence (a batch row's share; None: its slot's own profile)."""
        self.drafters.begin(self.index, self.prompt, sampling, self.generator, self.view, price)

    @property
    def budget(self):
        return self.drafters.budget(self.index)

    def propose(self, max_new_tokens: int, vocab: int, share, max_nodes: int | None = None) -> Draft:
        """This step's draft: the budget decides whether to draft and how much of the draft to verify; ``share``
        prices a forward of ``n`` positions for this sequence; ``max_nodes``: what its cache can take."""
        t0 = time.perf_counter()
        budget = self.budget
        self.drafting = budget.should_draft() and not hopeless(budget, share)
        room = budget.draft_limit(max_new_tokens - len(self.out) - 1)  # the step's own token is the last one
        self.plan = budget.select(self.drafters.propose(self.index, self.tokens, room) if self.drafting else Draft())
        self.draft = fit_draft(self.plan.draft, max_nodes, vocab, self.drafters.name)
        self.draft_s = time.perf_counter() - t0
        return self.draft

    def cut(self, width: int, verify_s: float) -> None:
        """Keep the first ``width - 1`` draft nodes (a batch's common query width); the plan is priced again."""
        if len(self.draft) > width - 1:
            self.draft = self.draft.subtree(range(width - 1))
        self.plan = StepPlan(self.draft, float(self.expected()[-1]), verify_s)

    def expected(self):
        """Expected tokens the step emits when the draft is cut to its first ``m`` nodes, for every ``m``."""
        if not len(self.draft):
            return np.ones(1)
        probs = trees.path_probs(self.draft.parents, self.budget.calibrated(self.draft))
        return np.concatenate([[1.0], 1.0 + np.cumsum(probs)])

    def settle(self, logits: torch.Tensor, sampling: SamplingConfig, stop_ids, max_new_tokens: int,
               verify_s: float, keep=None) -> tuple[list[int], list[int]]:
        """Verify the draft against ``logits`` [1 + n, V] (row 0: the root; a greedy batch's rows may be only their
        argmaxes, :class:`~specdec_cli.runtime.head_screen.GreedyRows`); returns ``(rows, emitted)``: the
        query rows the cache keeps (the root and the accepted path) and the tokens this step adds to the output.
        ``keep(rows)``, when given, trims the sequence's own cache before the drafter learns (a drafter may read
        the target's cache); a batch trims every row at once after all its sequences settled."""
        draft = self.draft
        if draft.q_draft is not None:
            path, nxt = verify_rejection(logits, draft.tokens, draft.q_draft, sampling, self.generator)
        else:
            path, nxt = verify_tree(logits, draft.tokens, draft.parents, sampling, self.generator,
                                    draws=self.draws, position=len(self.tokens))
        rows = [0] + [i + 1 for i in path]
        if keep is not None:
            keep(rows)
        budget = self.budget
        budget.observe(self.plan, path, draft.cost_s if not budget.draft_cost else self.draft_s, self.drafting)
        accepted = [draft.tokens[i] for i in path]
        new = accepted + [nxt]
        self.tokens.extend(new)
        self.drafters.accept(self.index, self.tokens, Outcome(draft, path, accepted, nxt, logits))
        self.steps.append(StepStats(len(draft), len(accepted), len(new), self.draft_s, verify_s))
        stop_at = next((i for i, t in enumerate(new) if t in stop_ids), None)
        if stop_at is not None:
            new, self.stopped_by = new[:stop_at], "eos"
        emitted = new[: max_new_tokens - len(self.out)]
        self.out.extend(emitted)
        return rows, emitted

    def done(self, max_new_tokens: int) -> bool:
        return self.stopped_by == "eos" or len(self.out) >= max_new_tokens

    def result(self, now: float, **extra) -> GenerationResult:
        """The generation's result; the sequence's drafter slot is idle again (so this is called once, last)."""
        stats = {**self.drafters.stats(self.index), **extra}
        self.drafters.end(self.index)
        return GenerationResult(self.prompt, self.out, self.steps, self.prefill_s, now - self.t_start,
                                self.stopped_by, extra=stats)
