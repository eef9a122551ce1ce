"""What the online calibration fits a module on (pure: numpy only): one step's observations (a
row per replica, or per micro-batch of a lone replica), and consecutive steps' stacked, with the
mean error of a prediction's split of each step (the replica share error of
:mod:`~mimo_accel.costs.share_error`, over many steps at once), and the cost per item a lone
encoder's micro-batches tell (:func:`per_item_level`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import numpy as np

from mimo_accel.costs.fit import nnls, step_means

__all__ = ["PER_ITEM_ROWS", "Observation", "Steps", "per_item_level"]

PER_ITEM_ROWS = 4  # observations a step (a lone replica's micro-batches) from which a cost per item is fitted


@dataclass(frozen=True)
class Observation:
    """One step of one module: what each replica (or micro-batch) computed and how long it took."""

    features: np.ndarray  # [replicas, n_features] float64
    seconds: np.ndarray  # [replicas] float64


class Steps:
    """Consecutive steps' observations stacked: ``features`` [N, F], ``seconds`` [N], each row's
    step in ``labels``, each step's rows from ``starts[i]`` (for the per-step maxima, without a
    loop over steps)."""

    def __init__(self, obs: list[Observation]) -> None:
        self.features = np.concatenate([o.features for o in obs])
        self.seconds = np.concatenate([o.seconds for o in obs])
        self.counts = np.array([o.seconds.size for o in obs])
        self.starts = np.concatenate([[0], np.cumsum(self.counts)[:-1]])
        self.labels = np.repeat(np.arange(len(obs)), self.counts)

    def share_error(self, w: np.ndarray, overhead: float) -> float:
        """The mean over the steps of the replica share error of the prediction ``x·w + o``
        (steps where either side has no work left out; NaN if all are)."""
        worst = self.share_errors(w, overhead)
        return float(worst.mean()) if worst.size else math.nan

    def share_errors(self, w: np.ndarray, overhead: float) -> np.ndarray:
        """Each step's replica share error of the prediction ``x·w + o``, in step order (steps
        where either side has no work left out)."""
        predicted = self.features @ w + overhead
        p_mean, m_mean = step_means(predicted, self.labels), step_means(self.seconds, self.labels)
        error = np.abs(predicted / p_mean - self.seconds / m_mean)
        worst = np.maximum.reduceat(error, self.starts)
        return worst[np.isfinite(worst) & (np.add.reduceat(predicted, self.starts) > 0)
                     & (np.add.reduceat(self.seconds, self.starts) > 0)]


def per_item_level(w: np.ndarray, recent: Steps) -> Optional[np.ndarray]:
    """An encoder's ``(a, b, k)`` at the pace of ``recent``: its rows' shape ``a·rows + b·rows²``
    (of ``w``) scaled, and a cost per item, fitted non-negatively to the observations' times in
    relative terms (a micro-batch's time is noisy in proportion to it: in absolute terms the few
    largest, or one that stalled, would set the level of all); None where they cannot tell the two
    apart (fewer than :data:`PER_ITEM_ROWS` observations a step, or a fit that leaves the rows no
    time). Each of a lone replica's micro-batches holds the same items, so a fit within the step
    cannot see what a forward costs whatever its size; each micro-batch's level beside its rows
    can, and a step plan weighs it against the language model's stages."""
    if recent.counts.min() < PER_ITEM_ROWS:
        return None
    timed = recent.seconds > 0
    if timed.sum() < 2:
        return None
    x, y = recent.features[timed], recent.seconds[timed]
    with np.errstate(all="ignore"):
        factor, k = nnls(np.column_stack([x[:, :2] @ w[:2], x[:, 2]]) / y[:, None], np.ones(y.size))
    if not (math.isfinite(factor) and factor > 0 and math.isfinite(k)):
        return None
    return np.array([factor * w[0], factor * w[1], k])
