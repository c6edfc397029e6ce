"""The entropy-bounded draft window shared by ``self-verify`` and ``hsddw`` (HSDDW, Algorithms 1 and 2).

A draft model keeps drafting while the entropy of its next-token distribution stays below ``tau``; ``tau`` starts
at ``tau0`` and becomes the mean entropy of every drafted token the verifier rejected so far.
"""

from __future__ import annotations

import math
from collections import Counter

from ..engine.loop import Outcome

DEFAULT_WINDOW = 10


def rejected_index(outcome: Outcome) -> int | None:
    """Index of the draft token the target rejected, or None when the whole chain was accepted."""
    n = len(outcome.path)
    return n if n < len(outcome.draft) else None


class EntropyThreshold:
    """``tau``: ``tau0`` until the first rejection, then the mean entropy of all rejected tokens so far."""

    def __init__(self, tau0: float = math.inf):
        self.tau0 = tau0
        self.rejected: list[float] = []

    @property
    def value(self) -> float:
        return sum(self.rejected) / len(self.rejected) if self.rejected else self.tau0

    def reject(self, h: float) -> None:
        self.rejected.append(h)


def window_summary(sizes: list[int]) -> dict:
    """Histogram-ready summary of per-step window sizes (paper Figure 8 / Table 4)."""
    if not sizes:
        return {"steps": 0, "mean": None, "min": None, "max": None, "histogram": {}}
    return {
        "steps": len(sizes),
        "mean": sum(sizes) / len(sizes),
        "min": min(sizes),
        "max": max(sizes),
        "histogram": {str(k): v for k, v in sorted(Counter(sizes).items())},
    }


def json_tau(tau: float) -> float | None:
    """``tau`` for JSON output: ``None`` while it is still the infinite default (no rejection yet)."""
    return tau if math.isfinite(tau) else None
