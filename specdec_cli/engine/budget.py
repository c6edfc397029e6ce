"""The draft budget: one mechanism, for every method, deciding how much draft is worth verifying.

Every drafter attaches to each node an estimate that it is accepted given its parent is (``Draft.scores``). The
:class:`Budget` then

1. **calibrates** those raw estimates against what the target actually accepted (:class:`Calibrator`: per depth
   and per score decile, a running acceptance rate that starts from the drafter's own estimate);
2. **selects** the prefix-closed subtree that maximises ``E[emitted tokens] - value * t(n)`` (``trees.select``),
   where ``t(n)`` is this machine's measured forward time (:mod:`specdec_cli.runtime.profile`) and ``value`` the
   tokens per second the method currently achieves (Dinkelbach's rule for a ratio objective) -- possibly the
   empty draft, a plain autoregressive step;
3. tells model drafters whether drafting **one more token** is worth its draft-model forward (:meth:`extend`);
4. **gates** drafting altogether: when the recent net value of drafting (the extra tokens steps actually yielded
   minus the time spent drafting and verifying, priced at ``value``) is negative, the next steps are plain
   autoregressive steps; probes come back at exponentially spaced steps, and never more often than keeps their
   losses under :data:`GATE_TOLERANCE` tokens per step, to notice when drafting pays again.

Nothing here reads the target's verdict on the current step: selection and gating use estimates from earlier
steps only, so verification stays exact (rejection-sampled chains are cut causally, see ``trees.causal_size``).
In sampled generations the calibration restarts with each generation and only the cached hardware profile prices
time, so a seed reproduces its output; in greedy ones learning carries over and measured drafting times count
too (outputs are identical to ``ar``'s either way).

Modes (``--budget``): ``auto`` (all of the above), ``N`` (keep the ``N`` nodes most likely to be accepted; no
timing), ``paper`` (the drafter's own configuration, verified whole: the papers' settings, for comparison).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import trees
from ..config import AUTO_BUDGET, BudgetSpec
from ..io.state import count, number
from ..runtime.profile import Profile

DEPTH_BINS = 8
SCORE_BINS = 10
PRIOR_WEIGHT = 4.0  # pseudo-observations of the drafter's own estimate in each calibration cell
MAX_BACKOFF = 4096
GATE_TOLERANCE = 0.02  # after a losing probe, wait until it costs at most this many tokens per step
PROBE_TOKENS = 4  # a probe (the first drafting step, or the first after a gated stretch) drafts at most this much
EMA = 0.1  # weight of the newest step in the running value of time
GATE_EMA = 0.2  # ... and in the running net value of drafting
GATE_WARMUP = 8  # drafting steps before a mildly losing drafter is gated (calibration needs a few observations)
GATE_HOPELESS = -0.5  # ... unless those steps lost more than this many tokens' worth of time
GATE_RETRY = -0.3  # a drafter whose running net value is above this gets a fresh chance with each generation
GATE_NEW_PROMPT = 8  # ... and one below it is probed again after at most this many steps of a new generation:
# one probe (<= PROBE_TOKENS verified rows) per prompt costs well under one token's time, and the first few output
# tokens give the lookup some context to match


class Calibrator:
    """Observed acceptance, shrunk three ways so that a few observations already help:

    * globally, ``rho`` = accepted / (sum of raw scores of the tested nodes): a drafter that is systematically
      under- or over-confident gets all its raw scores rescaled;
    * per raw-score decile, towards the rescaled raw score;
    * per (depth, decile) cell, towards its decile's rate.
    """

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        self.accepted = np.zeros((DEPTH_BINS, SCORE_BINS))
        self.tested = np.zeros((DEPTH_BINS, SCORE_BINS))
        self.raw_total = 0.0

    @staticmethod
    def cells(depths, scores) -> tuple[np.ndarray, np.ndarray]:
        d = np.minimum(np.asarray(depths, dtype=np.int64), DEPTH_BINS) - 1
        s = np.clip((np.asarray(scores, dtype=np.float64) * SCORE_BINS).astype(np.int64), 0, SCORE_BINS - 1)
        return d, s

    def estimate(self, depths, scores) -> np.ndarray:
        scores = np.clip(np.asarray(scores, dtype=np.float64), 0.0, 1.0)
        d, s = self.cells(depths, scores)
        rho = (self.accepted.sum() + PRIOR_WEIGHT) / (self.raw_total + PRIOR_WEIGHT)
        prior = np.minimum(scores * rho, 1.0)
        by_score = (self.accepted.sum(0)[s] + PRIOR_WEIGHT * prior) / (self.tested.sum(0)[s] + PRIOR_WEIGHT)
        return (self.accepted[d, s] + PRIOR_WEIGHT * by_score) / (self.tested[d, s] + PRIOR_WEIGHT)

    def observe(self, draft: trees.Draft, path: list[int]) -> None:
        """Every child of the root and of each accepted node was tested; the one on the path passed."""
        if not len(draft):
            return
        scores = np.clip(np.asarray(draft.scores if draft.scores is not None else [1.0] * len(draft)), 0.0, 1.0)
        on_path = set(path)
        tested_parents = {-1, *path}
        nodes = [i for i, p in enumerate(draft.parents) if p in tested_parents]
        dep = trees.depths(draft.parents)
        self.add([dep[i] for i in nodes], scores[nodes], [i in on_path for i in nodes])

    def add(self, depths, scores, accepted) -> None:
        """Nodes at ``depths`` with raw ``scores`` were tested; ``accepted`` says which passed."""
        scores = np.clip(np.asarray(scores, dtype=np.float64), 0.0, 1.0)
        d, s = self.cells(depths, scores)
        np.add.at(self.tested, (d, s), 1.0)
        np.add.at(self.accepted, (d, s), np.asarray(accepted, dtype=np.float64))
        self.raw_total += float(scores.sum())

    def state(self) -> dict:
        return {"accepted": self.accepted.tolist(), "tested": self.tested.tolist(), "raw_total": self.raw_total}

    def load_state(self, state: dict) -> None:
        accepted, tested = grid(state["accepted"]), grid(state["tested"])
        self.accepted, self.tested, self.raw_total = accepted, tested, number(state["raw_total"])


# -- learned state as JSON (bench checkpoints): checked on the way in, a file may be hostile --------------------


def grid(value) -> np.ndarray:
    """A calibration table (DEPTH_BINS x SCORE_BINS finite non-negative numbers) from JSON data."""
    try:
        arr = np.asarray(value, dtype=np.float64)
    except (OverflowError, TypeError):  # 10**400 is an int beyond any float; a dict is no number
        raise ValueError("not a calibration table") from None
    if arr.shape != (DEPTH_BINS, SCORE_BINS) or not np.isfinite(arr).all() or (arr < 0).any():
        raise ValueError("not a calibration table")
    return arr


@dataclass
class StepPlan:
    """What the budget decided for one step (kept for ``observe``)."""

    draft: trees.Draft
    expected: float  # expected tokens emitted by the step
    verify_s: float  # predicted target forward time


class Budget:
    def __init__(self, mode: BudgetSpec | str | int = AUTO_BUDGET, profile: Profile | None = None, *,
                 draft_cost: bool = True, gate: bool = True, trust_scores: bool = False, cheap_probe: bool = True):
        self.mode = BudgetSpec.parse(mode)  # parsed where it entered (RunSettings); a spelling is read as --budget
        self.gate = gate  # False: never skip drafting (a drafter that gates its own costly parts: auto)
        self.trust_scores = trust_scores  # True: the drafter's scores are calibrated already (auto): used as they are
        self.cheap_probe = cheap_probe  # False: a probe costs a draft model's prefill (no probe at every new prompt)
        self.profile = profile or Profile.flat()
        self.draft_cost = draft_cost  # count measured drafting time (greedy runs)
        self.calibrator = Calibrator()
        self.value = 1.0 / self.profile(1)  # tokens per second the method achieves (starts at the ar rate)
        self.net = 0.0  # running net value of drafting, in tokens per step
        self.skip = 0  # autoregressive steps left before the next probe
        self.backoff = 1
        self.steps = self.gated = self.drafted_steps = 0
        self.lost = 0.0  # tokens' worth of time lost since drafting last started

    # -- per generation ----------------------------------------------------------------------------------------

    def start(self, sampled: bool) -> None:
        """A new generation. Sampled ones start from the drafter's own estimates, so a seed reproduces its output.
        Greedy ones keep what was learnt, but a drafter that lost only a little gets a fresh chance (prompts
        differ: a drafter useless on chat may shine on a copy-heavy prompt); one that lost badly keeps its backoff,
        and if its probes are cheap (no draft model to catch up on the prompt) it is probed again within
        :data:`GATE_NEW_PROMPT` steps of this prompt (a stretch gated on earlier prompts used to run on for whole
        generations: pld on Gemma-3's held-out edits never drafted again after the first)."""
        if sampled:
            self.calibrator.reset()
            self.value = 1.0 / self.profile(1)
            self.net, self.lost, self.skip, self.backoff, self.drafted_steps = 0.0, 0.0, 0, 1, 0
        elif self.net > GATE_RETRY:
            self.net, self.lost, self.skip, self.backoff, self.drafted_steps = 0.0, 0.0, 0, 1, 0
        elif self.cheap_probe:
            self.skip = min(self.skip, GATE_NEW_PROMPT)
        self.draft_cost = not sampled
        self.steps = self.gated = 0

    @property
    def adaptive(self) -> bool:
        return self.mode.adaptive

    # -- gate --------------------------------------------------------------------------------------------------

    @property
    def drafting(self) -> bool:
        """Whether the next step will draft (model drafters skip their prompt prefill when it will not)."""
        return not self.adaptive or self.skip <= 0 or not self.gate

    def draft_limit(self, room: int) -> int:
        """How many tokens this step may draft: a probe drafts little, so probing an expensive drafter is cheap."""
        probing = self.adaptive and self.gate and (self.drafted_steps == 0 or self.backoff > 1)
        return min(room, PROBE_TOKENS) if probing else room

    def should_draft(self) -> bool:
        """False for a plain autoregressive step (drafting has not paid lately; probes come back off)."""
        self.steps += 1
        if not self.adaptive or self.skip <= 0 or not self.gate:
            return True
        self.skip -= 1
        self.gated += 1
        return False

    # -- selection ---------------------------------------------------------------------------------------------

    def calibrated(self, draft: trees.Draft) -> np.ndarray:
        raw = draft.scores if draft.scores is not None else [1.0] * len(draft)
        if self.trust_scores:  # the drafter calibrates its own estimates (auto: per source and evidence)
            return np.clip(np.asarray(raw, dtype=np.float64), 0.0, 1.0)
        return self.calibrator.estimate(trees.depths(draft.parents), raw)

    def select(self, draft: trees.Draft) -> StepPlan:
        """The part of ``draft`` to verify, with its expected yield."""
        if self.mode.paper or not len(draft):
            probs = trees.path_probs(draft.parents, self.calibrated(draft)) if len(draft) else np.empty(0)
            return StepPlan(draft, 1.0 + float(probs.sum()), self.profile(len(draft) + 1))
        cond = self.calibrated(draft)
        causal = draft.q_draft is not None  # a sampled chain: cut without looking ahead
        if self.mode.limit is not None:
            kept = trees.select(draft, cond, self.profile, 0.0, causal=causal, limit=self.mode.limit) \
                if self.mode.limit else trees.Draft()
        else:
            kept = trees.select(draft, cond, self.profile, self.value, causal=causal)
        probs = trees.path_probs(kept.parents, self.calibrated(kept)) if len(kept) else np.empty(0)
        return StepPlan(kept, 1.0 + float(probs.sum()), self.profile(len(kept) + 1))

    def extend(self, path_prob: float, cond: float, drafted: int, step_s: float) -> bool:
        """Whether a model drafter should draft token ``drafted + 1``: ``path_prob`` is the calibrated probability
        that its latest token is accepted, ``cond`` that token's own conditional estimate (used for the tokens to
        come), ``step_s`` what one more draft-model forward costs."""
        if self.mode.paper:
            return True
        if self.mode.limit is not None:
            return drafted < self.mode.limit
        base = self.profile(drafted + 1)
        gain, extra = 0.0, path_prob
        for m in range(1, 9):
            extra *= cond
            gain += extra
            if gain - self.value * (m * step_s + self.profile(drafted + 1 + m) - base) > 0:
                return True
        return False

    def calibrate_one(self, depth: int, score: float) -> float:
        return float(self.calibrator.estimate([depth], [score])[0])

    # -- learning ----------------------------------------------------------------------------------------------

    def observe(self, plan: StepPlan, path: list[int], draft_s: float, drafted: bool) -> None:
        """After verification: calibrate; update the value of time (tokens per second this method achieves) and
        the net value of drafting, from what the step actually yielded.

        ``draft_s`` is the drafting time: measured in greedy runs, the drafter's prediction in sampled ones; the
        verification time is always the profile's, so sampled runs never read the clock."""
        self.calibrator.observe(plan.draft, path)
        if not self.adaptive:
            return
        emitted = len(path) + 1
        spent = plan.verify_s + draft_s
        self.value = max(1.0 / self.profile(1), (1 - EMA) * self.value + EMA * emitted / spent)
        if not drafted:
            return
        net = len(path) - self.value * (plan.verify_s - self.profile(1) + draft_s)
        probe = self.backoff > 1 or self.drafted_steps == 0  # the first drafting step, or the first after a gap
        self.drafted_steps += 1
        self.net = net if probe else (1 - GATE_EMA) * self.net + GATE_EMA * net
        self.lost = min(self.lost + net, 0.0) if not probe else min(net, 0.0)
        if self.net < 0 and (self.drafted_steps >= GATE_WARMUP or self.lost < GATE_HOPELESS or self.backoff > 1):
            # wait at least twice as long as last time, and long enough that probes like this one cost at most
            # GATE_TOLERANCE tokens per step on average (an expensive drafter is probed rarely)
            self.skip = min(max(self.backoff, int(-self.net / GATE_TOLERANCE)), MAX_BACKOFF)
            self.backoff = min(2 * self.backoff, MAX_BACKOFF)
        elif self.net >= 0:
            self.backoff = 1

    # -- checkpoints ------------------------------------------------------------------------------------------

    def state(self) -> dict:
        """What the budget learnt (calibration, value of time, gate), as JSON data: a resumed ``bench`` run
        continues from it exactly where the interrupted one stood."""
        return {"calibrator": self.calibrator.state(), "value": self.value, "net": self.net, "skip": self.skip,
                "backoff": self.backoff, "steps": self.steps, "gated": self.gated,
                "drafted_steps": self.drafted_steps, "lost": self.lost, "draft_cost": self.draft_cost}

    def load_state(self, state: dict) -> None:
        """Continue from :meth:`state`'s answer (ValueError/KeyError/TypeError on data that is not one)."""
        calibrator = Calibrator()
        calibrator.load_state(state["calibrator"])
        value, net, lost = number(state["value"]), number(state["net"]), number(state["lost"])
        if value <= 0:
            raise ValueError("value of time must be > 0")
        skip, backoff, steps, gated = (count(state[k]) for k in ("skip", "backoff", "steps", "gated"))
        drafted_steps = count(state["drafted_steps"])
        if not isinstance(state["draft_cost"], bool):
            raise ValueError("draft_cost")
        self.calibrator, self.value, self.net, self.lost = calibrator, value, net, lost
        self.skip, self.backoff, self.steps, self.gated = min(skip, MAX_BACKOFF), max(1, min(backoff, MAX_BACKOFF)), \
            steps, gated
        self.drafted_steps, self.draft_cost = drafted_steps, state["draft_cost"]

    def stats(self) -> dict:
        return {"budget": self.mode.to_json(), "gated_steps": self.gated, "value_tokens_per_s": self.value}
