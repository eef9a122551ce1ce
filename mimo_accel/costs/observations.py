"""What the online calibration fits a module on (pure: numpy only): one step's observations (a
row per replica, or per micro-batch of a lone replica), and consecutive steps' stacked, with the
mean error of a prediction's split of each step (the replica share error of
:mod:`~mimo_accel.costs.share_error`, over many steps at once)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from mimo_accel.costs.fit import step_means

__all__ = ["Observation", "Steps"]


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
        predicted = self.features @ w + overhead
        p_mean, m_mean = step_means(predicted, self.labels), step_means(self.seconds, self.labels)
        error = np.abs(predicted / p_mean - self.seconds / m_mean)
        worst = np.maximum.reduceat(error, self.starts)
        worst = worst[np.isfinite(worst) & (np.add.reduceat(predicted, self.starts) > 0)
                      & (np.add.reduceat(self.seconds, self.starts) > 0)]
        return float(worst.mean()) if worst.size else math.nan
