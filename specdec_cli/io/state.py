"""Learned state read back from JSON files (bench checkpoints, ``--memory``): every value checked on the way in,
since a file may be hostile -- a bad value is a ValueError, never a crash or a huge allocation.

JSON integers have no size limit (``10**400`` parses), and ``float(10**400)`` or ``np.isfinite(10**400)`` is an
OverflowError, not a ValueError: numbers are converted here, inside the check, so every caller sees ValueError.
"""

from __future__ import annotations

import math

MAX_COUNT = 2**62  # a count no run reaches (and int64 arrays and floats still hold it)


def number(value) -> float:
    """A finite float from JSON data (ValueError otherwise)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"not a finite number: {str(value)[:20]}")
    try:
        out = float(value)
    except OverflowError:  # an integer beyond any float
        raise ValueError("not a finite number: too large") from None
    if not math.isfinite(out):
        raise ValueError(f"not a finite number: {out}")
    return out


def count(value) -> int:
    """A non-negative int from JSON data, below :data:`MAX_COUNT` (ValueError otherwise)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < MAX_COUNT:
        raise ValueError("not a count" + ("" if isinstance(value, int) and value > 0 else f": {str(value)[:20]}"))
    return value
