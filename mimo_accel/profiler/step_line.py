"""Reading one step line of a profile (a ``rank<N>.jsonl`` line, or the record
:meth:`~mimo_accel.profiler.Recorder.end_step` returns): what the metrics read in training and
the offline reader (:mod:`~mimo_accel.profiler.run`) reads after it."""

from __future__ import annotations

import math
from typing import Any

__all__ = ["module_seconds", "record_number"]


def record_number(rec: dict[str, Any], key: str) -> float | None:
    """A finite number from a profile record, or None (missing, null, not a number, NaN/inf)."""
    v = rec.get(key)
    if v is None or isinstance(v, bool):
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def module_seconds(rec: dict[str, Any], regions: tuple[str, ...]) -> float | None:
    """A module's time in one step line: the sum of its regions' ``<region>_s`` (a missing or null
    part counts 0); None when none of them was timed."""
    parts = [record_number(rec, f"{r}_s") for r in regions]
    if all(p is None for p in parts):
        return None
    return sum(p for p in parts if p is not None)
