"""Learned state read back from JSON files (bench checkpoints, ``--memory``): every value checked on the way in,
since a file may be hostile -- a bad value is a ValueError, never a crash or a huge allocation."""

from __future__ import annotations

import numpy as np


def number(value) -> float:
    """A finite float from JSON data (ValueError otherwise)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not np.isfinite(value):
        raise ValueError(f"not a finite number: {str(value)[:20]}")
    return float(value)


def count(value) -> int:
    """A non-negative int from JSON data (ValueError otherwise)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"not a count: {str(value)[:20]}")
    return value
