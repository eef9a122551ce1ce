"""How far a predicted split of one step's work over replicas is from the measured one (pure:
numpy only): what the online calibration judges a refit by (:mod:`~mimo_accel.costs.online`)."""

from __future__ import annotations

import math
from typing import Any, Optional

import numpy as np

__all__ = ["replica_share_error", "spread_error"]


def _shares(x: np.ndarray) -> Optional[np.ndarray]:
    top = float(x.max()) if x.size else 0.0
    if not (top > 0 and math.isfinite(top)):
        return None
    y = x / top  # scaled first: a mean of subnormal times would round to nothing
    return y / float(y.mean())


def replica_share_error(predicted: Any, measured: Any) -> float:
    """``max_r |p_r/mean(p) − m_r/mean(m)|``: the largest error in a replica's share of the step's
    mean time (predicted against measured seconds of one step's replicas). NaN when either side
    has no work (mean 0): such a step says nothing about the split."""
    p, m = _pair(predicted, measured)
    sp, sm = _shares(p), _shares(m)
    if sp is None or sm is None:
        return math.nan
    return float(np.abs(sp - sm).max())


def spread_error(predicted: Any, measured: Any) -> float:
    """``|max(p)/mean(p) − max(m)/mean(m)|``: how far the predicted straggler (replica spread)
    is from the measured one; at most :func:`replica_share_error`. NaN when either side has no
    work."""
    p, m = _pair(predicted, measured)
    sp, sm = _shares(p), _shares(m)
    if sp is None or sm is None:
        return math.nan
    return float(abs(sp.max() - sm.max()))


def _pair(predicted: Any, measured: Any) -> tuple[np.ndarray, np.ndarray]:
    p = np.asarray(predicted, dtype=np.float64).reshape(-1)
    m = np.asarray(measured, dtype=np.float64).reshape(-1)
    if p.shape != m.shape or p.size == 0:
        raise ValueError(f"predicted and measured need one time per replica each, got {p.size} and {m.size}")
    if not (np.isfinite(p).all() and np.isfinite(m).all()) or (p < 0).any() or (m < 0).any():
        raise ValueError("predicted and measured replica times must be finite and >= 0")
    return p, m
