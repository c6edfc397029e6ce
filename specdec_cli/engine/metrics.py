"""The decoding metrics, defined once (docs/bench.md): a generation's summary and bench's records both use these.

Counts: ``forwards`` target forwards (steps), ``emitted`` tokens they produced (each step's own token included),
``drafted`` draft tokens sent to verification, ``accepted`` of them kept.
"""

from __future__ import annotations


def ratio(num: float | None, den: float | None) -> float | None:
    """``num / den``; None when either is unknown or the denominator is zero."""
    return num / den if num is not None and den else None


def mean_accepted_length(emitted: float | None, forwards: float | None) -> float | None:
    """Tokens emitted per target forward, the target's own token included (1.0 for ``ar``)."""
    return ratio(emitted, forwards)


def acceptance_rate(accepted: float | None, drafted: float | None) -> float | None:
    return ratio(accepted, drafted)


def sigma(accepted: float | None, drafted: float | None) -> float | None:
    """Redundancy: the share of drafted tokens the target rejected (None without drafts)."""
    rate = acceptance_rate(accepted, drafted)
    return None if rate is None else 1 - rate


def eta(forwards: float | None, emitted: float | None) -> float | None:
    """Target utilisation: target forwards per output token (1.0 for ``ar``; lower is better)."""
    return ratio(forwards, emitted)
