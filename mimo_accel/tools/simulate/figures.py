"""The figures every table of the simulation reports: a series' p50, p99 and mean, and the
spread of replicas' totals."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from mimo_accel.balance import spread

__all__ = ["stats", "totals_spread"]


def stats(values: Sequence[float]) -> dict[str, float]:
    """``{"p50", "p99", "mean"}`` of ``values``."""
    a = np.asarray(values, dtype=np.float64)
    return {"p50": float(np.percentile(a, 50)), "p99": float(np.percentile(a, 99)), "mean": float(a.mean())}


def totals_spread(totals: np.ndarray) -> float:
    """The spread of replicas whose totals are ``totals`` (max / mean; 1.0 without cost)."""
    return spread(totals, np.arange(totals.size), totals.size)
