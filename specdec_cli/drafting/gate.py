"""A gate for a draft source of ``auto`` (the memory, a datastore, a draft model): it keeps drafting from the
source only while the tokens that only it got accepted pay for its time -- its drafting, and the verification of
the nodes no other source proposed."""

from __future__ import annotations

# the budget's own gate constants (engine/budget.py, with their reasons): a source is gated by the same rule as a
# single method's drafter -- warm-up steps, running-value weight, the retry threshold, the per-prompt probe
from ..engine.budget import GATE_EMA as EMA, GATE_NEW_PROMPT as NEW_PROMPT, GATE_RETRY as RETRY, \
    GATE_WARMUP as WARMUP


class Gate:
    """Whether a source pays: the running net value (tokens only it got accepted, minus its time priced at
    the method's current tokens per second) of the steps it ran; negative -> skipped for a stretch that doubles
    with each losing probe."""

    def __init__(self, cheap_probe: bool = True):
        self.cheap_probe = cheap_probe  # False: a probe costs a draft model's prefill (not probed at every prompt)
        self.net, self.runs, self.skip, self.backoff, self.gated = 0.0, 0, 0, 1, 0
        self.probing = False

    def start(self) -> None:
        """A new generation: a source that lost only a little gets a fresh chance (a memory that had nothing to
        offer the first prompts may hold the answer to this one; prompts differ)."""
        if self.net > RETRY:
            self.net, self.runs, self.skip, self.backoff, self.probing = 0.0, 0, 0, 1, False
        elif self.cheap_probe:
            self.skip = min(self.skip, NEW_PROMPT)

    def open(self) -> bool:
        if self.skip > 0:
            self.skip -= 1
            self.gated += 1
            return False
        return True

    def record(self, only_accepted: int, cost_s: float, value: float) -> None:
        net = only_accepted - value * cost_s
        self.runs += 1
        probe, self.probing = self.probing or self.runs == 1, False
        self.net = net if probe else (1 - EMA) * self.net + EMA * net  # a probe decides alone
        if self.net < 0 and (self.runs >= WARMUP or (probe and self.backoff > 1)):
            self.skip, self.backoff, self.probing = self.backoff, min(2 * self.backoff, 4096), True
        elif self.net >= 0:
            self.backoff = 1

    def state(self) -> dict:
        return {"net": self.net, "runs": self.runs, "skip": self.skip, "backoff": self.backoff,
                "gated": self.gated, "probing": self.probing}

    def load_state(self, state: dict) -> None:
        from ..io.state import count, number

        net = number(state["net"])
        runs, skip, backoff, gated = (count(state[k]) for k in ("runs", "skip", "backoff", "gated"))
        if not isinstance(state["probing"], bool):
            raise ValueError("probing")
        self.net, self.runs, self.skip, self.backoff, self.gated = net, runs, min(skip, 4096), \
            max(1, min(backoff, 4096)), gated
        self.probing = state["probing"]
