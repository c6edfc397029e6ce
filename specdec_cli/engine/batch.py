"""Many prompts at once: the decoding loop of :mod:`specdec_cli.engine.loop`, for up to ``B`` sequences that share
one target forward per step (continuous batching).

Each sequence keeps its own draft tree and acceptance, and its drafting state in the run's
:class:`~specdec_cli.engine.drafters.Drafters` (one object, keyed by sequence; as many slots as rows); one
:class:`~specdec_cli.runtime.batch_cache.BatchCache` holds every row's keys and values at its own length (a batch
of one row decodes in the single loop's one-sequence cache instead, static and compiled included: both are a
:class:`~specdec_cli.runtime.cache.KVCache`, asked the same things). A step:

    drafts = [seq.propose(...) for each row]                  # each row's budget prices draft tokens with its
    width  = choose_width(...)                                #  share of the whole batch's forward time
    logits = cache.forward_rows(target, drafts)               # one forward, per-row positions and masks
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
from typing import Callable

import torch

from ..runtime import forward
from ..runtime.batch_cache import BatchCache
from ..runtime.cache import CACHE_SLACK, KVCache
from ..runtime.cache_mode import CacheMode, resolve
from .drafter import Drafter, GenerationResult, vocab_size
from .drafters import Drafters
from .sampling import Draws, SamplingConfig
from .sequence import Sequence
from .times import BatchShare, LearnedTimes, flat_times

WIDEST_PAPER_DRAFT = 64  # REST's top-64 tree, the largest fixed draft a method verifies (--budget paper); the
#                          cache is sized for it up front and grows past it when a node-limit budget asks more


def _admit(target, cache, row: int, index: int, prompt: list[int], drafters: Drafters, share: BatchShare,
           sampling: SamplingConfig, seed: int) -> Sequence:
    """Prefill ``prompt`` (all but its last token, the first step's root) into row ``row`` of ``cache``; the
    sequence ``index`` begins in ``drafters``."""
    t0 = time.perf_counter()
    cache.prefill_row(target, row, prompt[:-1])
    seq = Sequence(index, list(prompt), drafters, cache.row_view(row), torch.Generator().manual_seed(seed),
                   Draws(seed), t0, tokens=list(prompt))
    seq.begin(sampling, price=share)  # the row's price of a forward: its share of the batch's
    seq.prefill_s = time.perf_counter() - t0
    return seq


def choose_width(seqs: list[Sequence], times) -> int:
    """The query width (root + draft nodes per row) maximising expected tokens per second of the whole step.
    A sampled chain (rejection sampling) is never cut: its length was decided causally."""
    sizes = [1 + len(s.draft) for s in seqs]
    floor = max([1 + len(s.draft) for s in seqs if s.draft.q_draft is not None], default=1)
    expected = [s.expected() for s in seqs]
    best, best_rate = max(sizes), -1.0
    for width in sorted(set(sizes)):
        if width < floor:
            continue
        gain = sum(float(e[min(width, len(e)) - 1]) for e in expected)
        rate = gain / times(len(seqs), width)
        if rate > best_rate + 1e-12:
            best, best_rate = width, rate
    return best


def generate_batch(target, prompts: list[list[int]], drafters: Drafters | list[Drafter], *, max_new_tokens: int,
                   sampling: SamplingConfig = SamplingConfig(), seed: int = 0,
                   stop_ids: set[int] | frozenset[int] = frozenset(),
                   on_result: Callable[[int, GenerationResult], None] | None = None,
                   on_step: Callable[[int, float], None] | None = None, times=None) -> list[GenerationResult]:
    """Decode every prompt, up to ``len(drafters)`` at a time (one slot each; a list of drafters is a
    :class:`~specdec_cli.engine.drafters.Drafters` of those slots). ``on_result(index, result)``
    is called as each sequence finishes (in finishing order); ``on_step(rows, seconds)`` after each forward.
    ``times(rows, width)``: the measured batched forward times (:mod:`specdec_cli.runtime.batch_profile`) that
    price draft tokens; None: the first drafter's one-sequence profile at ``rows * width`` tokens. The returned
    results are in input order. While batched, each drafter's budget prices its row's share of the batch's forward;
    afterwards its own profile is back (a warm-up's shares never price the timed run, nor wrap each other)."""
    if not prompts:
        return []
    drafters = Drafters.of(drafters)
    own = [d.budget.profile for d in drafters.slots]
    try:
        return _decode(target, prompts, drafters, max_new_tokens, sampling, seed, stop_ids, on_result, on_step,
                       times or flat_times(own[0]))
    finally:
        for drafter, profile in zip(drafters.slots, own):
            drafter.budget.profile = profile


def _decode(target, prompts, drafters: Drafters, max_new_tokens, sampling, seed, stop_ids, on_result, on_step,
            times) -> list[GenerationResult]:
    results: list[GenerationResult | None] = [None] * len(prompts)
    width_limit = 1 + max(WIDEST_PAPER_DRAFT, max((d.budget.mode.limit or 0 for d in drafters.slots), default=0))
    capacity = max(len(p) for p in prompts) + max_new_tokens + width_limit + CACHE_SLACK
    rows = min(len(drafters), len(prompts))
    drafters.open(rows)
    chosen = drafters.cache_mode  # None: a drafter made outside api.make_drafter, "auto" as api.run reads it
    cache = new_batch_cache(target, rows, capacity, resolve("auto" if chosen is None else chosen, target),
                            greedy=sampling.greedy)
    times = LearnedTimes(times, learn=sampling.greedy)
    share = BatchShare(times, rows if sampling.greedy else len(drafters))
    vocab, clock = vocab_size(target), forward.wall_clock(target)
    waiting = list(range(len(prompts)))[::-1]
    slots: list[Sequence | None] = [None] * rows
    while True:
        for row in range(cache.rows):
            if slots[row] is None and waiting:
                i = waiting.pop()
                slots[row] = _admit(target, cache, row, i, prompts[i], drafters, share, sampling, seed)
        if any(s is None for s in slots):  # no prompt waits for these rows: drop them (one copy)
            _compact(cache, slots)
        live = slots
        if not live:
            break
        share.rows = len(live) if sampling.greedy else len(drafters)  # sampled: prices never depend on the others
        for seq in live:
            seq.propose(max_new_tokens, vocab, share, cache.max_draft_nodes)  # a static cache: one bucket
        width = choose_width(live, times)
        for seq in live:
            seq.cut(width, share(width))
        t0 = clock()
        logits = cache.forward_rows(target, [([s.tokens[-1], *s.draft.tokens], s.draft.parents) for s in live])
        verify_s = clock() - t0
        times.observe(len(live), width, verify_s)
        keep = [s.settle(lg, sampling, stop_ids, max_new_tokens, verify_s)[0] for s, lg in zip(live, logits)]
        cache.keep_paths(keep)
        if on_step:
            on_step(len(live), time.perf_counter() - t0)
        now = time.perf_counter()
        for row, slot in enumerate(slots):
            if slot is not None and slot.done(max_new_tokens):
                results[slot.index] = slot.result(now, latency_s=now - slot.t_start)  # its slot is idle again
                if on_result:
                    on_result(slot.index, results[slot.index])
                slots[row] = None
    return results


def new_batch_cache(target, rows: int, capacity: int, cache_mode: CacheMode, greedy: bool = False) -> KVCache:
    """The cache of a batch: one row is the one-sequence cache of the drafters' engine path (growing, or static and
    compiled: the path the single loop takes), several are a :class:`BatchCache` -- the loop asks either the same.
    ``greedy`` (only argmaxes are read): the rows attend their own columns (faster; their outputs are ``ar``'s,
    asserted) unless a draft model copying the target's keys and values asks for the module code's
    (``KVCache.keep_module_bits``), and the forward returns the rows' tokens where the head's screen proves them
    (:mod:`specdec_cli.runtime.head_screen`: the float32 logits' own argmax, faster). Sampled: the rows attend with
    SDPA's bits, the module code's (a draw near a tie then never moves with attention's rounding, whatever the
    batch size), and the float32 head gives whole distributions."""
    if rows == 1:
        return forward.new_cache(target, capacity, cache_mode, greedy=greedy)
    return BatchCache(target, rows, capacity, own_columns=greedy, greedy=greedy)


def _compact(cache, slots: list) -> None:
    """Drop the rows of finished sequences (no prompt waits for them)."""
    order = cache.drop_rows([r for r, s in enumerate(slots) if s is None])
    slots[:] = [slots[r] for r in order]
    for row, slot in enumerate(slots):
        slot.view.row = row
