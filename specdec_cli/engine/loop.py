"""The decoding loop of one sequence: a batch of one of :mod:`specdec_cli.engine.sequence`'s step.

A drafter (cf. transformers' ``CandidateGenerator``, :mod:`specdec_cli.engine.drafter`) has two methods:
``propose`` a draft for the current sequence, and ``accept`` -- learn from what the target accepted; the
:class:`~specdec_cli.engine.drafters.Drafters` of a run hold one per slot and key them by sequence. Every
method and both loops (this one, and :mod:`specdec_cli.engine.batch` for many sequences) run the same step:

    draft  = seq.propose(...)                           # drafter.propose, priced and cut by the budget
    logits = cache.forward_rows(target, [(root + draft.tokens, draft.parents)])  # one target pass, [1 + n, V]
    rows, emitted = seq.settle(logits, ...)             # exact acceptance; cache.keep_paths([rows]); drafter.accept

Both loops ask their cache the same things (:mod:`specdec_cli.runtime.cache`): a one-sequence cache is one row.
"""

from __future__ import annotations

import time
from typing import Callable

import torch

from ..runtime import forward
from ..runtime.cache import CACHE_SLACK
from ..runtime.cache_mode import CacheMode
from .drafter import (Draft, Drafter, GenerationResult, Outcome, StepStats, cut_at_stop, fit_draft,  # noqa: F401
                      vocab_size)  # the drafter interface, re-exported: methods import it from the loop they run in
from .drafters import Drafters
from .sampling import Draws, SamplingConfig
from .sequence import Sequence

__all__ = ["Draft", "Outcome", "Drafter", "StepStats", "GenerationResult", "generate", "cut_at_stop"]


def generate(target, prompt: list[int], drafter: Drafter | Drafters, *, max_new_tokens: int,
             sampling: SamplingConfig = SamplingConfig(), seed: int = 0,
             stop_ids: set[int] | frozenset[int] = frozenset(), on_tokens: Callable[[list[int]], None] | None = None,
             cache_mode: CacheMode = CacheMode.EAGER) -> GenerationResult:
    """Decode up to ``max_new_tokens`` after ``prompt`` with ``target`` (a transformers causal LM): one
    :class:`Sequence` through a one-sequence cache.

    ``cache_mode``: ``EAGER`` (growing cache), ``STATIC`` (static cache, bucketed forwards) or ``COMPILED`` (the
    same, compiled: CUDA graphs on a GPU) -- :mod:`specdec_cli.runtime.cache_mode`. The output is the same.
    ``drafter``: a method's drafter, or the :class:`~specdec_cli.engine.drafters.Drafters` of a run (one slot is
    used)."""
    drafters = Drafters.of(drafter)
    drafters.open(1)
    t_start = time.perf_counter()
    cache = forward.new_cache(target, len(prompt) + max_new_tokens + CACHE_SLACK, cache_mode, greedy=sampling.greedy)
    cache.prefill_row(target, 0, list(prompt[:-1]))
    seq = Sequence(0, list(prompt), drafters, cache, torch.Generator().manual_seed(seed), Draws(seed), t_start,
                   tokens=list(prompt))
    seq.begin(sampling)
    seq.prefill_s = time.perf_counter() - t_start
    vocab, share = vocab_size(target), seq.budget.profile  # alone: the sequence pays the whole forward
    clock = forward.wall_clock(target)
    while not seq.done(max_new_tokens):
        draft = seq.propose(max_new_tokens, vocab, share, cache.max_draft_nodes)  # a static cache: one bucket
        t1 = clock()
        logits, = cache.forward_rows(target, [([seq.tokens[-1], *draft.tokens], draft.parents)])  # [1 + n, V]
        _, emitted = seq.settle(logits, sampling, stop_ids, max_new_tokens, clock() - t1,
                                keep=lambda rows: cache.keep_paths([rows]))
        if on_tokens and emitted:
            on_tokens(emitted)
    return seq.result(time.perf_counter())
