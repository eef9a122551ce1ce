"""The one cost-model fitter: measured seconds ≈ features · w (+ an overhead), w >= 0 (pure numpy).

Every cost model the package learns is fitted here from a module's features and measured seconds:
``mimo-accel calibrate`` (profiler rank-steps, with one overhead, none, or one per step:
:func:`fit_costs`), ``mimo-accel calibrate-gpu`` (measured points, on relative error) and the
online calibration (:func:`scale_and_overhead`, :func:`fit_near`). The solver is exact
non-negative least squares (:func:`nnls`) on the column-normalised design; a design whose columns
cannot be told apart is refused (:class:`SingularDesign`) where the caller asks.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

__all__ = ["MAX_CONDITION", "CostFit", "SingularDesign", "fit_costs", "fit_near", "in_seconds", "mean_overhead",
           "nnls", "scale_and_overhead", "solve", "step_means", "within_steps"]

MAX_COLUMNS = 6  # 2**6 supports: exact and still instant
MAX_CONDITION = 1e10  # of the column-normalised design; above it the fit is meaningless
OVERHEADS = ("none", "one", "per_step")
_VARIES = 1e-9  # a feature varies within steps if its within-step rms exceeds this × its mean size
# The prior weighs a feature as if it varied within steps by at least this share of its mean size:
# a feature the plan has all but equalised (tokens under a tokens-only model) carries little
# information, and without the floor its prior would carry as little, leaving its coefficient to
# the noise (in simulation: fits dropped as implausible from starts only 3-10x off).
PRIOR_FLOOR = 0.05
RECENTRE = 16  # fits with the prior's centre moved to the candidate (see fit_near)


def nnls(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Exact non-negative least squares for a few columns: ``argmin ||x·w - y||, w >= 0``.

    The optimum is the unconstrained least-squares solution on its own support, so trying every
    support (2^k for k columns, k <= 6 here) and keeping the best feasible one is exact. The
    supports are tried in a fixed order, so the same input gives bit-identical output.
    """
    n, k = x.shape
    if k > MAX_COLUMNS:
        raise ValueError(f"nnls: at most {MAX_COLUMNS} columns")
    best_w, best_rss = np.zeros(k), float(y @ y)
    for size in range(1, k + 1):
        for cols in itertools.combinations(range(k), size):
            sub = x[:, cols]
            w, *_ = np.linalg.lstsq(sub, y, rcond=None)
            if (w < 0).any():
                continue
            r = y - sub @ w
            rss = float(r @ r)
            if rss < best_rss * (1 - 1e-12):
                best_rss = rss
                best_w = np.zeros(k)
                best_w[list(cols)] = w
    return best_w


class SingularDesign(ValueError):
    """The observations cannot tell some columns apart: ``columns`` are the ones involved (the
    direction of the smallest singular value), or every column when there are fewer rows than
    columns; ``rows`` how many observations there were."""

    def __init__(self, columns: tuple[int, ...], rows: int, n_columns: int) -> None:
        self.columns, self.rows, self.n_columns = columns, rows, n_columns
        super().__init__(f"singular design: columns {list(columns)} cannot be told apart from {rows} rows")


def solve(design: np.ndarray, target: np.ndarray, *, max_condition: Optional[float] = MAX_CONDITION) -> np.ndarray:
    """``argmin ||design·w − target||, w >= 0`` on the column-normalised design (a column of zeros
    gets 0), through its QR factors: ``||A·v − b||² = ||R·v − Qᵀb||² + const``, so the k × k
    problem has the same solution whatever the number of rows. Raises :class:`SingularDesign`
    when the normalised design's condition number exceeds ``max_condition`` (None: no check)."""
    n, k = design.shape
    scale = np.linalg.norm(design, axis=0)
    scale[scale == 0] = 1.0
    xs = design / scale
    if max_condition is not None and n < k:
        raise SingularDesign(tuple(range(k)), n, k)
    q, r = np.linalg.qr(xs)
    if max_condition is not None:
        _, sv, vt = np.linalg.svd(r)
        if sv[-1] <= sv[0] / max_condition:
            v = np.abs(vt[-1])
            raise SingularDesign(tuple(int(i) for i in np.flatnonzero(v > 0.1 * v.max())), n, k)
    return nnls(r, q.T @ target) / scale


def step_means(values: np.ndarray, steps: np.ndarray) -> np.ndarray:
    """Each row's step mean of ``values`` ([N] or [N, F]; ``steps`` [N] labels, in any order)."""
    steps = np.asarray(steps)
    order = np.argsort(steps, kind="stable")
    ordered = steps[order]
    starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]])
    counts = np.diff(np.r_[starts, ordered.size])
    means = np.add.reduceat(values[order], starts, axis=0) / (counts if values.ndim == 1 else counts[:, None])
    out = np.empty_like(values, dtype=np.float64)
    out[order] = np.repeat(means, counts, axis=0)
    return out


def within_steps(values: np.ndarray, steps: np.ndarray) -> np.ndarray:
    """``values`` with each step's mean taken out: what one free level per step leaves to fit."""
    return values - step_means(values, steps)


@dataclass(frozen=True)
class CostFit:
    """One module's fit (:func:`fit_costs`).

    ``coefficients``: one per feature column, >= 0, in seconds per unit. ``overhead``: the fitted
    constant, or with per-step levels their mean over the observations (0 without). ``step_overheads``:
    each step's level (per-step fits only). ``predicted``: seconds per observation, overheads
    included. ``rss`` / ``r2``: of what was fitted (within steps for per-step levels; unweighted
    seconds for a relative fit). ``design``: the fitted system's columns (within steps; the
    overhead column last when one was fitted), for :meth:`standard_errors`."""

    coefficients: np.ndarray
    overhead: float
    step_overheads: Optional[dict[int, float]]
    predicted: np.ndarray
    rss: float
    r2: float
    design: np.ndarray
    levels: int  # free per-step levels taken out before the fit (their degrees of freedom)

    @property
    def solution(self) -> np.ndarray:
        """The coefficient of every design column: the features', then a fitted overhead's."""
        return np.r_[self.coefficients, self.overhead] if self.design.shape[1] > self.coefficients.size \
            else self.coefficients

    def standard_errors(self) -> np.ndarray:
        """Per design column, the standard error of its coefficient on the columns the fit kept
        (coefficient > 0); NaN for the others, or without degrees of freedom left."""
        w = self.solution
        active = [i for i in range(w.size) if w[i] > 0]
        dof = self.design.shape[0] - len(active) - self.levels
        se = np.full(w.size, math.nan)
        if active and dof > 0:
            xa = self.design[:, active]
            try:
                cov = (self.rss / dof) * np.linalg.inv(xa.T @ xa)
                se[active] = np.sqrt(np.clip(np.diag(cov), 0, None))
            except np.linalg.LinAlgError:  # pragma: no cover - excluded by the condition check
                pass
        return se


def fit_costs(features: Any, seconds: Any, *, overhead: str = "one", steps: Any = None, relative: bool = False,
              max_condition: Optional[float] = MAX_CONDITION) -> CostFit:
    """Fit ``seconds ≈ features · w + overhead``, ``w >= 0`` (see :class:`CostFit`).

    ``overhead``: ``"one"`` (a constant per observation, fitted non-negatively with ``w``),
    ``"none"``, or ``"per_step"`` (one free level per step of ``steps``: the coefficients are
    fitted on how the observations of each step differ). ``relative``: fit on relative error
    (each row weighted by 1/seconds; every time must be > 0). Raises :class:`SingularDesign`
    (see :func:`solve`)."""
    x = np.asarray(features, dtype=np.float64)
    y = np.asarray(seconds, dtype=np.float64)
    if x.ndim != 2 or y.shape != (x.shape[0],):
        raise ValueError(f"fit_costs: features must be [N, F] and seconds [N], got {x.shape} and {y.shape}")
    if overhead not in OVERHEADS:
        raise ValueError(f"fit_costs: overhead must be one of {', '.join(OVERHEADS)}, got {overhead!r}")
    if overhead == "per_step":
        if steps is None or relative:
            raise ValueError("fit_costs: per-step overheads need the steps, and a fit on absolute error")
        steps = np.asarray(steps)
        xt, yt = within_steps(x, steps), within_steps(y, steps)
        w = solve(xt, yt, max_condition=max_condition)
        resid = yt - xt @ w
        rss = float(resid @ resid)
        # each step's level: what its mean time leaves over the features' share
        levels = step_means(y, steps) - step_means(x, steps) @ w
        labels, first = np.unique(steps, return_index=True)
        per_step = {int(s): float(levels[i]) for s, i in zip(labels, first)}
        return CostFit(w, float(np.mean([per_step[int(s)] for s in steps])), per_step,
                       x @ w + np.array([per_step[int(s)] for s in steps]), rss, _r2(rss, float(yt @ yt)),
                       xt, labels.size)
    design = np.column_stack([x, np.ones(y.size)]) if overhead == "one" else x
    if relative:
        if not (np.isfinite(y).all() and (y > 0).all()):
            raise ValueError("fit_costs: a fit on relative error needs every time finite and > 0")
        w = solve(design / y[:, None], np.ones(y.size), max_condition=max_condition)
    else:
        w = solve(design, y, max_condition=max_condition)
    predicted = design @ w
    resid = y - predicted
    rss = float(resid @ resid)
    coefficients, level = (w[:-1], float(w[-1])) if overhead == "one" else (w, 0.0)
    return CostFit(coefficients, level, None, predicted, rss, _r2(rss, float(((y - y.mean()) ** 2).sum())),
                   design, 0)


def _r2(rss: float, tss: float) -> float:
    return 1.0 - rss / tss if tss > 0 else (1.0 if rss <= 1e-30 else 0.0)


# ---------------------------------------------------------------- a model's level, and a prior


def scale_and_overhead(predicted: np.ndarray, seconds: np.ndarray) -> tuple[float, float]:
    """``(λ, o) >= 0`` with ``seconds ≈ λ·predicted + o`` (least squares): a model in any unit at
    its best level in seconds, and the per-replica time it leaves over. Where the times do not
    grow with the prediction at all (λ = 0), the ratio of the totals and no overhead."""
    total = float(predicted.sum())
    if not total > 0 or not math.isfinite(total):
        return 1.0, max(0.0, float(seconds.mean()))
    lam = fit_costs(predicted[:, None], seconds, max_condition=None).coefficients[0]
    if not lam > 0:
        return in_seconds(predicted, seconds), 0.0
    return float(lam), mean_overhead(lam * predicted, seconds)


def in_seconds(predicted: np.ndarray, seconds: np.ndarray) -> float:
    """The factor that makes a model's predicted work total the measured time."""
    total = float(predicted.sum())
    return float(seconds.sum()) / total if total > 0 and math.isfinite(total) else 1.0


def mean_overhead(predicted: np.ndarray, seconds: np.ndarray) -> float:
    """The mean time the prediction leaves over (>= 0): the per-replica overhead."""
    return max(0.0, float((seconds - predicted).mean()))


def fit_near(features: np.ndarray, seconds: np.ndarray, steps: np.ndarray, centre: np.ndarray,
             prior: float) -> tuple[np.ndarray, np.ndarray]:
    """Coefficients fitted within steps (one free level per step), drawn towards ``centre`` (the
    model in use, in seconds), and which features varied within steps (the others held at ``centre``).

    The prior is a ridge towards ``centre`` worth ``prior`` steps that ``centre`` explains exactly (per
    feature, its within-step energy per step, at least as if it varied by :data:`PRIOR_FLOOR` of its
    mean). Where ``centre`` lacks a term the steps tell (a 0), the centre moves to the candidate,
    scaled to the measured time, and the fit is made again (:data:`RECENTRE` times): what the steps
    cannot tell then takes the share of the time the rest leaves, not the share a wrong model gave it."""
    x, y = features, seconds
    xt = within_steps(x, steps)
    yt = within_steps(y, steps)
    size = np.abs(x).mean(axis=0)
    energy = (xt * xt).sum(axis=0) / np.unique(steps).size  # within-step energy of each feature, per step
    varying = (size > 0) & (np.sqrt(energy) > _VARIES * size)
    w = centre.copy()
    if not varying.any():
        return w, varying
    s = np.sqrt(energy[varying])
    z = xt[:, varying] / s
    root = math.sqrt(prior) * np.maximum(1.0, PRIOR_FLOOR * size[varying] / s)
    # ||A·v − b||² = ||R·v − Qᵀb||² + const: A = [z; diag(root)] is factored once, and each fit
    # is a k × k problem whatever the number of rows
    q, r = np.linalg.qr(np.vstack([z, np.diag(root)]))
    q_data, q_prior = q[:z.shape[0]], q[z.shape[0]:]
    # recentred only from a model without a term the steps tell: a model that prices every such term
    # is the prior, and moving its centre to each fit would leave a few noisy steps unopposed
    rounds = RECENTRE + 1 if (centre[varying] <= 0).any() else 1
    for i in range(rounds):
        if i:
            centre = in_seconds(x @ w, y) * w
            w = centre.copy()
        target = q_data.T @ (yt - xt[:, ~varying] @ centre[~varying]) + q_prior.T @ (root * centre[varying] * s)
        w[varying] = nnls(r, target) / s
    return w, varying
