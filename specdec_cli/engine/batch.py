"""Many prompts at once: the decoding loop of :mod:`specdec_cli.engine.loop`, for up to ``B`` sequences that share
one target forward per step (continuous batching).

Each sequence keeps its own drafter (one per slot), its own draft tree and its own acceptance; one
:class:`~specdec_cli.runtime.batch_cache.BatchCache` holds every row's keys and values at its own length. A step:

    drafts = [slot.drafter.propose(...) for each row]        # each row's budget prices draft tokens with its
    width  = choose_width(...)                                #  share of the whole batch's forward time
    logits = cache.forward(target, drafts)                    # one forward, per-row positions and masks
    verify each row; cache.keep_paths(paths); finished rows take the next waiting prompt

Prices: a row's budget sees ``t(B * n) / B`` for a forward of ``n`` tokens per row -- the measured time of one
forward over all ``B * n`` tokens, shared by the ``B`` rows -- so speculation shrinks as the batch fills the machine
and grows when it does not. The rows' drafts are then cut to the common width that maximises the tokens the step
is expected to emit per second (a single row with a long draft does not make every row pay for padding).

Greedy rows are identical to their own ``ar`` output. Sampled rows draw each token from a generator keyed by
(seed, position) (:class:`~specdec_cli.engine.sampling.Draws`), so a sequence's output does not depend on its
neighbours, on the batch size, nor -- for drafts fixed before the target draws -- on the drafts at all.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

from ..runtime import forward
from ..runtime.batch_cache import BatchCache, RowView
from . import trees
from .budget import StepPlan
from .loop import Draft, Drafter, GenerationResult, Outcome, StepStats, fit_draft, vocab_size
from .sampling import Draws, SamplingConfig
from .verify import verify_rejection, verify_tree


class BatchShare:
    """A row's price of a forward of ``n`` tokens per row: ``T(rows, n) / rows`` (``rows``: the live rows)."""

    def __init__(self, times, rows: int = 1):
        self.times, self.rows = times, rows

    def __call__(self, n: int) -> float:
        return self.times(self.rows, n) / self.rows


class LearnedTimes:
    """``T(rows, width)``: the measured table, corrected by what this run's forwards actually took (greedy runs
    only: sampled ones never read the clock). One factor per width, ``actual / table`` averaged over recent steps,
    absorbs what the table missed (longer contexts than it was measured at, a busy machine)."""

    EMA = 0.2

    def __init__(self, table, learn: bool):
        self.table, self.learn = table, learn
        self.factor: dict[int, float] = {}

    def __call__(self, rows: int, width: int) -> float:
        return self.table(rows, width) * self.factor.get(min(width, 9), self.factor.get(1, 1.0))

    def observe(self, rows: int, width: int, seconds: float) -> None:
        if self.learn and seconds > 0:
            key, ratio = min(width, 9), seconds / self.table(rows, width)
            old = self.factor.get(key)
            self.factor[key] = ratio if old is None else (1 - self.EMA) * old + self.EMA * ratio


def flat_times(profile):
    """``T(rows, width)`` from a one-sequence profile, ``t(rows * width)`` (when no batched one is measured)."""
    return lambda rows, width: profile(rows * width)


@dataclass
class Slot:
    """One sequence in the batch."""

    index: int  # its prompt's position in the input
    prompt: list[int]
    drafter: Drafter
    view: RowView
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


def _admit(target, cache: BatchCache, row: int, index: int, prompt: list[int], drafter: Drafter, share: BatchShare,
           sampling: SamplingConfig, seed: int) -> Slot:
    """Prefill ``prompt`` on its own (one-sequence cache) and move it into row ``row``."""
    t0 = time.perf_counter()
    single = forward.new_cache(target, len(prompt) + 8)
    if len(prompt) > 1:
        forward.forward_chain(target, single, prompt[:-1], keep=0)
    cache.load_row(row, single, len(prompt) - 1)
    generator = torch.Generator().manual_seed(seed)
    slot = Slot(index, list(prompt), drafter, RowView(cache, row), generator, Draws(seed), t0, tokens=list(prompt))
    drafter.budget.profile = share
    drafter.budget.start(sampled=not sampling.greedy)
    drafter.use_target_cache(slot.view)
    drafter.start(list(prompt), sampling, generator)
    slot.prefill_s = time.perf_counter() - t0
    return slot


def _hopeless(budget, share: BatchShare) -> bool:
    """Whether even a draft token sure to be accepted costs more than it yields: one more query position per row
    (priced at the row's share of the batch) is worth more time than a token at the current value of time. Then
    the row does not draft at all (no drafting time either) -- a batch that fills the machine decodes plainly."""
    return budget.adaptive and budget.value * (share(2) - share(1)) >= 1.0


def _propose(slot: Slot, share: BatchShare, max_new_tokens: int, vocab: int) -> None:
    t0 = time.perf_counter()
    budget, drafter = slot.drafter.budget, slot.drafter
    slot.drafting = budget.should_draft() and not _hopeless(budget, share)
    room = budget.draft_limit(max_new_tokens - len(slot.out) - 1)
    slot.plan = budget.select(drafter.propose(slot.tokens, room) if slot.drafting else Draft())
    slot.draft = fit_draft(slot.plan.draft, None, vocab, drafter.name)
    slot.draft_s = time.perf_counter() - t0


def _expected(slot: Slot) -> np.ndarray:
    """Expected tokens emitted by the slot's step when its draft is cut to its first ``m`` nodes, for every ``m``."""
    draft = slot.draft
    if not len(draft):
        return np.ones(1)
    probs = trees.path_probs(draft.parents, slot.drafter.budget.calibrated(draft))
    return np.concatenate([[1.0], 1.0 + np.cumsum(probs)])


def choose_width(slots: list[Slot], times) -> int:
    """The query width (root + draft nodes per row) maximising expected tokens per second of the whole step.
    A sampled chain (rejection sampling) is never cut: its length was decided causally."""
    sizes = [1 + len(s.draft) for s in slots]
    floor = max([1 + len(s.draft) for s in slots if s.draft.q_draft is not None], default=1)
    expected = [_expected(s) for s in slots]
    best, best_rate = max(sizes), -1.0
    for width in sorted(set(sizes)):
        if width < floor:
            continue
        gain = sum(float(e[min(width, len(e)) - 1]) for e in expected)
        rate = gain / times(len(slots), width)
        if rate > best_rate + 1e-12:
            best, best_rate = width, rate
    return best


def _cut(slot: Slot, width: int, share: BatchShare) -> None:
    if len(slot.draft) > width - 1:
        slot.draft = slot.draft.subtree(range(width - 1))
    expected = float(_expected(slot)[-1])
    slot.plan = StepPlan(slot.draft, expected, share(width))


def _settle(slot: Slot, logits: torch.Tensor, sampling: SamplingConfig, stop_ids, max_new_tokens: int,
            verify_s: float) -> list[int]:
    """Verify the slot's draft against its logits; returns the rows of its query to keep."""
    draft = slot.draft
    position = len(slot.tokens)
    if draft.q_draft is not None:
        path, nxt = verify_rejection(logits, draft.tokens, draft.q_draft, sampling, slot.generator)
    else:
        path, nxt = verify_tree(logits, draft.tokens, draft.parents, sampling, slot.generator,
                                draws=slot.draws, position=position)
    budget = slot.drafter.budget
    budget.observe(slot.plan, path, draft.cost_s if not budget.draft_cost else slot.draft_s, slot.drafting)
    accepted = [draft.tokens[i] for i in path]
    new = accepted + [nxt]
    slot.tokens.extend(new)
    slot.drafter.accept(slot.tokens, Outcome(draft, path, accepted, nxt, logits))
    slot.steps.append(StepStats(len(draft), len(accepted), len(new), slot.draft_s, verify_s))
    stop_at = next((i for i, t in enumerate(new) if t in stop_ids), None)
    if stop_at is not None:
        new, slot.stopped_by = new[:stop_at], "eos"
    slot.out.extend(new[: max_new_tokens - len(slot.out)])
    return [0] + [i + 1 for i in path]


def _result(slot: Slot, now: float) -> GenerationResult:
    extra = {**slot.drafter.stats(), **slot.drafter.budget.stats(), "latency_s": now - slot.t_start}
    return GenerationResult(slot.prompt, slot.out, slot.steps, slot.prefill_s, now - slot.t_start, slot.stopped_by,
                            extra=extra)


def generate_batch(target, prompts: list[list[int]], drafters: list[Drafter], *, max_new_tokens: int,
                   sampling: SamplingConfig = SamplingConfig(), seed: int = 0,
                   stop_ids: set[int] | frozenset[int] = frozenset(),
                   on_result: Callable[[int, GenerationResult], None] | None = None,
                   on_step: Callable[[int, float], None] | None = None, times=None) -> list[GenerationResult]:
    """Decode every prompt, up to ``len(drafters)`` at a time (one drafter per slot). ``on_result(index, result)``
    is called as each sequence finishes (in finishing order); ``on_step(rows, seconds)`` after each forward.
    ``times(rows, width)``: the measured batched forward times (:mod:`specdec_cli.runtime.batch_profile`) that
    price draft tokens; None: the first drafter's one-sequence profile at ``rows * width`` tokens. The returned
    results are in input order. While batched, each drafter's budget prices its row's share of the batch's forward;
    afterwards its own profile is back (a warm-up's shares never price the timed run, nor wrap each other)."""
    if not prompts:
        return []
    own = [d.budget.profile for d in drafters]
    try:
        return _decode(target, prompts, drafters, max_new_tokens, sampling, seed, stop_ids, on_result, on_step,
                       times or flat_times(own[0]))
    finally:
        for drafter, profile in zip(drafters, own):
            drafter.budget.profile = profile


def _decode(target, prompts, drafters, max_new_tokens, sampling, seed, stop_ids, on_result, on_step,
            times) -> list[GenerationResult]:
    results: list[GenerationResult | None] = [None] * len(prompts)
    width_limit = 1 + max(64, max((d.budget.mode for d in drafters if isinstance(d.budget.mode, int)), default=0))
    capacity = max(len(p) for p in prompts) + max_new_tokens + width_limit + 8
    rows = min(len(drafters), len(prompts))
    cache = BatchCache(target, rows, capacity)
    times = LearnedTimes(times, learn=sampling.greedy)
    share = BatchShare(times, rows if sampling.greedy else len(drafters))
    vocab = vocab_size(target)
    waiting = list(range(len(prompts)))[::-1]
    slots: list[Slot | None] = [None] * rows
    free = list(drafters[:rows])
    while True:
        for row in range(cache.rows):
            if slots[row] is None and waiting:
                i = waiting.pop()
                slots[row] = _admit(target, cache, row, i, prompts[i], free.pop(0), share, sampling, seed)
        if any(s is None for s in slots):  # no prompt waits for these rows: drop them (one copy)
            _compact(cache, slots)
        live = slots
        if not live:
            break
        share.rows = len(live) if sampling.greedy else len(drafters)  # sampled: prices never depend on the others
        for slot in live:
            _propose(slot, share, max_new_tokens, vocab)
        width = choose_width(live, times)
        for slot in live:
            _cut(slot, width, share)
        t0 = time.perf_counter()
        logits = cache.forward(target, [([s.tokens[-1], *s.draft.tokens], s.draft.parents) for s in live])
        verify_s = time.perf_counter() - t0
        times.observe(len(live), width, verify_s)
        keep = [_settle(s, lg, sampling, stop_ids, max_new_tokens, verify_s) for s, lg in zip(live, logits)]
        cache.keep_paths(keep)
        if on_step:
            on_step(len(live), time.perf_counter() - t0)
        now = time.perf_counter()
        for row, slot in enumerate(slots):
            if slot is not None and (slot.stopped_by == "eos" or len(slot.out) >= max_new_tokens):
                results[slot.index] = _result(slot, now)
                if on_result:
                    on_result(slot.index, results[slot.index])
                free.append(slot.drafter)
                slots[row] = None
    return results


def _compact(cache: BatchCache, slots: list) -> None:
    """Drop the rows of finished sequences (no prompt waits for them)."""
    order = cache.drop_rows([r for r, s in enumerate(slots) if s is None])
    slots[:] = [slots[r] for r in order]
    for row, slot in enumerate(slots):
        slot.view.row = row
