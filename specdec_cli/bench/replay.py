"""Replay a method against a greedy output it must reproduce, without the target model (issue 36).

Greedy verification is deterministic: the target accepts the longest path of the draft tree that agrees with its
own greedy continuation, and an ``ar`` run has already written that continuation down. So a drafter, its budget
and the loop's bookkeeping can run against the recorded output alone: every step's draft, selection, accepted
path and the drafter's learning are what a real run decides, minus the model. What comes out are the counts a
``bench`` record holds -- target forwards, emitted, drafted and accepted tokens, ``auto``'s per-source counts --
plus a modelled time: the machine's measured forward times ``t(n)`` (the budget's profile) of every step, plus
drafting time.

Drafting time is the only clock the budget reads in greedy runs. ``clock="fixed"`` replaces it with a constant
per call (:data:`FIXED_DRAFT_S`), so a replay is exactly reproducible (the counts no longer move with the machine's
load); ``clock="measured"`` keeps the real clock.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from types import SimpleNamespace
from unittest import mock

from ..config import AUTO_BUDGET, PAPER_BUDGET, BudgetSpec, SamplingConfig
from ..engine.budget import Budget
from ..engine.loop import Draft, Drafter, Outcome
from ..methods import MethodContext, build_drafter
from ..runtime.profile import Profile

FIXED_DRAFT_S = 1e-4  # what one drafting step of a cheap drafter costs on the 2-core CPU (0.05-0.5 ms measured)


@dataclass
class Replayed:
    """Counts of one replayed generation (the fields of a bench record's ``per_prompt`` entry)."""

    new_tokens: int = 0
    forwards: int = 0
    emitted: int = 0
    drafted: int = 0
    accepted: int = 0
    verify_s: float = 0.0  # modelled: the profile's t(n + 1) of every step
    draft_s: float = 0.0
    sources: dict | None = None
    steps: list = field(default_factory=list)  # (position, drafted, accepted) per step

    @property
    def seconds(self) -> float:
        return self.verify_s + self.draft_s


class _FixedClock:
    """``time.perf_counter`` for the drafting code: each call advances by half of :data:`FIXED_DRAFT_S`, so the
    difference of two readings around one proposal is the fixed cost."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self) -> float:
        self.now += FIXED_DRAFT_S / 2
        return self.now


def stub_target(vocab_size: int, stop_ids=frozenset()):
    """What a drafter's ``build`` reads of the target (no model): fingerprint, vocabulary, stop ids."""
    return SimpleNamespace(fingerprint="replay", vocab_size=vocab_size, stop_ids=frozenset(stop_ids), model=None)


def make_drafter(method: str, profile: Profile, vocab_size: int, options: dict | None = None,
                 stop_ids=frozenset(), budget: BudgetSpec | str | int = AUTO_BUDGET) -> Drafter:
    """A drafter of a method that needs no model and no datastore, with its budget priced by ``profile``."""
    ctx = MethodContext(stub_target(vocab_size, stop_ids), [], None, None, dict(options or {}), budget)
    drafter = build_drafter(method, ctx)
    drafter.budget = Budget(PAPER_BUDGET if method == "ar" else ctx.budget, profile, gate=drafter.gated_by_budget,
                            trust_scores=drafter.calibrated_scores)
    return drafter


def oracle_path(draft: Draft, truth: list[int], at: int) -> list[int]:
    """The greedy tree walk against the known output: the nodes whose tokens are ``truth[at], truth[at+1], ...``."""
    children: dict[int, dict[int, int]] = {}
    for i, (tok, par) in enumerate(zip(draft.tokens, draft.parents)):
        children.setdefault(par, {}).setdefault(tok, i)
    path, node = [], -1
    while at + len(path) < len(truth):
        nxt = children.get(node, {}).get(truth[at + len(path)])
        if nxt is None:
            break
        path.append(nxt)
        node = nxt
    return path


def replay(drafter: Drafter, prompt: list[int], output: list[int], max_new_tokens: int, stop_ids=frozenset(),
           clock: str = "fixed") -> Replayed:
    """One generation of ``drafter`` whose target's greedy output after ``prompt`` is ``output`` (with its stop
    token, if it stopped on one): the loop of :func:`specdec_cli.engine.loop.generate`, verified by the oracle."""
    fixed = _FixedClock() if clock == "fixed" else None
    patch = mock.patch.object(time, "perf_counter", fixed.perf_counter) if fixed else contextlib.nullcontext()
    truth = list(prompt) + list(output)
    budget, res = drafter.budget, Replayed()
    with patch:
        budget.start(sampled=False)
        drafter.start(list(prompt), SamplingConfig(), None)
        tokens, out = list(prompt), 0
        while out < max_new_tokens and len(tokens) < len(truth):
            t0 = time.perf_counter()
            drafting = budget.should_draft()
            room = budget.draft_limit(max_new_tokens - out - 1)
            plan = budget.select(drafter.propose(tokens, room) if drafting else Draft())
            draft = plan.draft
            draft_s = time.perf_counter() - t0
            path = oracle_path(draft, truth, len(tokens))
            at = len(tokens)
            nxt = truth[at + len(path)] if at + len(path) < len(truth) else 0
            budget.observe(plan, path, draft.cost_s if not budget.draft_cost else draft_s, drafting)
            accepted = [draft.tokens[i] for i in path]
            tokens.extend(accepted + [nxt])
            drafter.accept(tokens, Outcome(draft, path, accepted, nxt, None))
            new = accepted + [nxt]
            stop_at = next((i for i, t in enumerate(new) if t in stop_ids), None)
            kept = new[:stop_at] if stop_at is not None else new
            kept = kept[: max_new_tokens - out]
            out += len(kept)
            res.forwards += 1
            res.emitted += len(new)
            res.drafted += len(draft)
            res.accepted += len(accepted)
            res.verify_s += budget.profile(len(draft) + 1)
            res.draft_s += draft_s
            res.steps.append((at, len(draft), len(accepted)))
            if stop_at is not None:
                break
        res.new_tokens = out
        res.sources = drafter.stats().get("sources")
    return res
