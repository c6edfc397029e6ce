"""What one more draft token costs on an engine we do not drive (vLLM): learnt from the run's own steps.

A step of the engine computes ``T`` tokens (each running sequence's last token plus its draft); its time is
modelled as ``a + b * T``: ``a`` the fixed part (reading the weights once, the scheduler, sampling), ``b`` what
each computed token adds. On one CPU core a one-token step is memory-bound and ``b`` is a few percent of ``a``;
with 32 sequences the step is compute-bound and ``b`` dominates. ``b`` is fitted online by least squares over the
recent steps (exponential forgetting), shrunk towards a prior, so it follows the batch as it grows and shrinks.

A draft token is worth sending when the probability that it is accepted exceeds ``value * b``: the tokens per
second the engine currently emits times the seconds the token costs (the same Dinkelbach rule as the budget of
our own engine, :mod:`specdec_cli.engine.budget`).
"""

from __future__ import annotations

FORGET = 0.98  # weight kept by an observation per later step: the fit follows about the last 50 steps
PRIOR_TOKENS = 20.0  # prior: the fixed part of a step costs as much as computing 20 tokens (CPU, measured 10-40)
PRIOR_WEIGHT = 16.0  # strength of that prior, in squared tokens of spread (a few steps of varied drafts win)
VALUE_EMA = 0.1  # weight of the newest step in the running tokens per second
MIN_SECONDS = 1e-5  # a step faster than this is a clock glitch, not a measurement


class StepCost:
    """Step time ``a + b * tokens``, fitted online; and the tokens per second the engine emits."""

    def __init__(self):
        self.w = self.x = self.y = self.xx = self.xy = 0.0  # forgotten-weighted sums of 1, T, t, T^2, T*t
        self.value = 0.0  # emitted tokens per second (all sequences), running
        self.steps = 0

    def observe(self, tokens: int, seconds: float, emitted: int) -> None:
        """One decoding step computed ``tokens`` tokens in ``seconds`` and emitted ``emitted``."""
        if seconds < MIN_SECONDS or tokens < 1:
            return
        f = FORGET
        self.w, self.x, self.y = f * self.w + 1.0, f * self.x + tokens, f * self.y + seconds
        self.xx, self.xy = f * self.xx + tokens * tokens, f * self.xy + tokens * seconds
        rate = emitted / seconds
        self.value = rate if not self.steps else (1 - VALUE_EMA) * self.value + VALUE_EMA * rate
        self.steps += 1

    @property
    def per_token(self) -> float:
        """``b``: seconds one more computed token adds to a step (0 before any step)."""
        if not self.w:
            return 0.0
        mx, my = self.x / self.w, self.y / self.w
        sxx, sxy = self.xx - self.w * mx * mx, self.xy - self.w * mx * my
        prior = my / (mx + PRIOR_TOKENS)
        return max((sxy + PRIOR_WEIGHT * prior) / (max(sxx, 0.0) + PRIOR_WEIGHT), 0.0)

    @property
    def threshold(self) -> float:
        """The acceptance probability above which one more draft token pays: tokens/s times seconds per token."""
        return self.value * self.per_token

    def state(self) -> dict:
        return {"steps": self.steps, "per_token_ms": 1000 * self.per_token, "tokens_per_s": self.value,
                "threshold": self.threshold}
