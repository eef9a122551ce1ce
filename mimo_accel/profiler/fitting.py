"""Each module's cost model fitted from a profile's rank-steps (``mimo-accel calibrate``).

:func:`fit_modules` fits every module a run records through
:func:`mimo_accel.costs.fit.fit_costs` (the one fitter), with one overhead, none, or one per step.
What is fitted on what, and why, is the command's doc (:mod:`mimo_accel.tools.calibrate`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from mimo_accel.costs import CostModel, ModuleCost
from mimo_accel.costs.fit import SingularDesign, fit_costs, within_steps
from mimo_accel.modules import LANGUAGE
from mimo_accel.profiler.run import Run
from mimo_accel.profiler.observations import (CalibrationError, ProfileSpec, encoder_spec, language_spec,
                                                     modules_in, observe)

__all__ = ["fit_modules"]

_MIN_STEPS = 3
_T_SIGNIFICANT = 2.0


def _fit_spec(run: Run, spec: ProfileSpec, *, warmup: int, intercept: bool,
              per_step: bool) -> tuple[dict[str, float], dict[str, Any], dict[str, Any]]:
    """(coefficients, stats, model-file metadata) of one module's fit."""
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup must be an integer >= 0, got {warmup!r}")
    if per_step and not intercept:
        raise ValueError("per_step fits one overhead per step: it needs the intercept (drop intercept=False)")
    what = spec.what
    obs = observe(run, spec, warmup=warmup)
    warnings = []  # this module's; the run's own (run.warnings) are said once by the caller
    if obs["dropped"]:
        counters = "/".join(f for f, _ in spec.features if f != spec.optional)
        warnings.append(f"{obs['dropped']} step line(s) without usable {counters} counters were skipped")
    y = obs["y"]
    keep = np.ones(y.size, dtype=bool)
    have_sq = np.array([v is not None for v in obs[spec.optional]], dtype=bool)
    use_sq = bool(have_sq.all()) and y.size > 0
    sq_coef = dict(spec.features)[spec.optional]
    if not use_sq and have_sq.sum() >= _MIN_STEPS + 1:
        warnings.append(
            f"{int((~have_sq).sum())} of {y.size} steps lack {spec.optional} (older profiler?); fitted on the"
            f" {int(have_sq.sum())} steps that have it"
        )
        keep, use_sq = have_sq, True
    elif not use_sq:
        warnings.append(f"the logs carry no {spec.optional}, so the attention term cannot be fitted: "
                        f"{sq_coef} = 0 for {spec.module}. Record it and calibrate again.")
    n = int(keep.sum())
    if n < _MIN_STEPS:
        raise CalibrationError(
            f"{run.directory}: too few steps to fit: {n} usable {what} step(s) after skipping"
            f" {len(obs['skipped_warmup'])} warm-up step(s); need at least {_MIN_STEPS} — profile more steps"
            " (or lower --warmup)"
        )
    y = y[keep]
    columns: dict[str, np.ndarray] = {}
    for field_name, coef in spec.features:
        if field_name == spec.optional:
            if use_sq:
                columns[coef] = np.asarray([v for v, k in zip(obs[spec.optional], keep) if k], dtype=np.float64)
        else:
            columns[coef] = obs[field_name][keep]
    feature_of = {coef: field_name for field_name, coef in spec.features}
    unfitted = [name for name, col in columns.items() if not col.any()]
    first = spec.features[0][1]
    if first in unfitted:
        raise CalibrationError(f"{run.directory}: {spec.nothing}")
    for name in unfitted:
        warnings.append(f"every step has {feature_of[name]} = 0: {name} is not observable, set to 0")
        del columns[name]
    step_of = obs["steps"][keep]
    groups = np.unique(step_of)
    if per_step and not _varies_within_steps(columns, step_of):
        warnings.append(f"no step has two {what} replicas with different work, so per-step overheads cannot"
                        " be told from the features: fitted one overhead across steps")
        per_step = False
    across = None
    if per_step:
        # one free level per step: the coefficients are fitted on how the replicas of a step differ
        try:  # the same fit with one overhead across steps, for comparison only
            across = _fit_spec(run, spec, warmup=warmup, intercept=True, per_step=False)[1]
        except CalibrationError as exc:  # e.g. a feature equal in every step, collinear with that overhead
            warnings.append(f"the fit with one overhead across steps is not determined ({exc}); only the "
                            "per-step fit is given")
        for name in [k for k, col in columns.items() if not within_steps(col, step_of).any()]:
            warnings.append(f"{feature_of[name]} never differs between the replicas of a step: {name} is not"
                            " observable with per-step overheads, set to 0")
            del columns[name]
    elif intercept:
        # a feature equal in every observation (every replica carried as many images) is the
        # overhead under another name: dropped, as the per-step fit drops one that never differs
        for name in [k for k, col in columns.items() if k != first and np.ptp(col) == 0]:
            warnings.append(f"{feature_of[name]} is the same in every step: {name} cannot be told from the"
                            " overhead, set to 0")
            del columns[name]
    overhead = "per_step" if per_step else "one" if intercept else "none"
    names = list(columns) + (["overhead"] if overhead == "one" else [])
    x = np.column_stack([columns[k] for k in columns])
    try:
        fitted = fit_costs(x, y, overhead=overhead, steps=step_of)
    except SingularDesign as exc:
        raise CalibrationError(_singular_message(run, exc, names, spec.labels, what)) from None
    w, pred, rss, r2 = fitted.solution, fitted.predicted, fitted.rss, fitted.r2
    rmse = math.sqrt(rss / n)
    mean_time = float(y.mean())
    se = fitted.standard_errors()
    means = np.r_[x.mean(axis=0), 1.0] if overhead == "one" else x.mean(axis=0)
    mean_pred = float(pred.mean())
    terms: dict[str, dict[str, Any]] = {}
    for i, name in enumerate(names):
        tval = float(w[i] / se[i]) if w[i] > 0 and math.isfinite(se[i]) and se[i] > 0 else (
            math.inf if w[i] > 0 and se[i] == 0 else 0.0)
        terms[name] = {
            "coef": float(w[i]),
            "stderr": None if not math.isfinite(se[i]) else float(se[i]),
            "t": None if not math.isfinite(tval) or w[i] == 0 else tval,
            "significant": bool(w[i] > 0 and tval > _T_SIGNIFICANT),
            "share": float(w[i] * means[i] / mean_pred) if mean_pred > 0 else 0.0,
            "fitted": True,
        }
    if per_step:
        level = fitted.overhead
        terms["overhead"] = {"coef": level, "stderr": None, "t": None, "significant": False,
                             "share": level / mean_pred if mean_pred > 0 else 0.0, "fitted": True,
                             "per_step": fitted.step_overheads}
    for coef in spec.coefficients:
        if coef not in terms:
            terms[coef] = {"coef": 0.0, "stderr": None, "t": None, "significant": False, "share": 0.0,
                           "fitted": False}
    coefs = {k: terms[k]["coef"] for k in spec.coefficients}
    if not any(coefs.values()):
        raise CalibrationError(
            f"{run.directory}: the fit gives every feature a zero coefficient ({what} time does not grow with"
            f" {', '.join(feature_of[c] for c in spec.coefficients)} in these steps); profile steps whose"
            f" {what} load varies")
    for coef in spec.coefficients:
        if terms[coef]["fitted"] and not terms[coef]["significant"]:
            warnings.append(f"{coef} ({spec.units[coef]}) is not significant (t <= {_T_SIGNIFICANT:g})")
    if r2 < 0.9:
        where = " within steps" if per_step else ""
        warnings.append(f"R²{where} = {r2:.3f}: the model explains the {what} time poorly; check the run for noise")
    a, b = coefs["a"], coefs["b"]
    stats = {
        "n": n,
        "ranks": obs["ranks"],
        "r2": r2,
        "rmse": rmse,
        "rel_rmse": rmse / mean_time if mean_time > 0 else None,
        "mean_time": mean_time,
        "sq": use_sq,
        "intercept": intercept,
        "overhead_s": terms["overhead"]["coef"] if "overhead" in terms else 0.0,
        "terms": terms,
        "b_over_a": b / a if a > 0 else None,
        "skipped_warmup": obs["skipped_warmup"],
        "warnings": warnings,
        "run": str(run.directory),
        "per_step": per_step,
    }
    if per_step:
        stats["steps"] = len(groups)
        stats["r2_across_steps"] = across["r2"] if across is not None else None
    meta = {
        "r2": r2, "n": n, "rmse": rmse, "rel_rmse": stats["rel_rmse"], "units": "seconds",
        "overhead_s": stats["overhead_s"], "sq": use_sq, "intercept": intercept,
        "run": str(run.directory), "warmup": warmup, "per_step": per_step,
        **({"r2_across_steps": stats["r2_across_steps"]} if per_step else {}),
        "significant": [k for k in spec.coefficients if terms[k]["significant"]],
    }
    return coefs, stats, meta



def fit_modules(run: Run, *, warmup: int = 1, intercept: bool = True, per_step: bool = False,
                modules: Sequence[str] | None = None) -> tuple[CostModel, dict[str, dict[str, Any]]]:
    """Fit every module of ``run`` from its own measured times: per encoder m, ``<m>_fwd_s +
    <m>_bwd_s`` against ``<m>_rows``, ``<m>_sq_rows``, ``<m>_items`` (``a·rows + b·sq_rows +
    k·items``); the language model, ``language_fwd_s + language_bwd_s`` against ``tokens`` and
    ``sq_tokens`` (``a·tokens + b·tokens²``). Returns the v2 :class:`CostModel` (every fitted
    module in its ``modules`` table; ``a``, ``b`` are the first encoder's, in rank order) and each
    module's stats: ``n``, ``ranks``, ``r2``, ``rmse``, ``rel_rmse``, ``mean_time``, ``sq`` (whether
    the attention term was fitted), ``intercept``, ``overhead_s``, ``terms`` ({coefficient or
    overhead: {coef, stderr, t, significant, share, fitted}}), ``b_over_a``, ``skipped_warmup``,
    ``warnings``; with ``per_step`` also ``steps`` and ``r2_across_steps``, and ``r2`` is the
    within-step R². Raises :class:`CalibrationError` for a run that times no module, with fewer
    than 3 usable steps of a module, or whose steps cannot separate a module's features."""
    names = list(modules) if modules is not None else modules_in(run)
    if not names:
        raise CalibrationError(
            f"{run.directory}: no module is timed in the run (no step line has <module>_fwd_s with its "
            "<module>_rows, or language_fwd_s); profile a run with mimo_accel's profiler on (profile=DIR)")
    table, stats, metas = {}, {}, {}
    for m in names:
        spec = language_spec(m) if m == LANGUAGE else encoder_spec(m)
        coefs, stats[m], metas[m] = _fit_spec(run, spec, warmup=warmup, intercept=intercept, per_step=per_step)
        table[m] = ModuleCost(coefs["a"], coefs["b"], coefs.get("k", 0.0))
    encoders = [m for m in names if m != LANGUAGE]
    lead = encoders[0] if encoders else None  # the default encoder: the layout's first (rank order)
    a, b = (table[lead].a, table[lead].b) if lead is not None else (CostModel().a, CostModel().b)
    meta = {"units": "seconds", "run": str(run.directory), "warmup": warmup, "per_step": per_step,
            "intercept": intercept, "modules": metas}
    return CostModel(a=a, b=b, fit=meta, modules=table), stats



def _varies_within_steps(columns: dict[str, np.ndarray], step_of: np.ndarray) -> bool:
    """Whether some step has two observations (replicas) whose features differ."""
    for s in np.unique(step_of):
        m = step_of == s
        if m.sum() > 1 and any(np.ptp(col[m]) > 0 for col in columns.values()):
            return True
    return False


def _singular_message(run: Run, exc: SingularDesign, names: list[str], label: dict, what: str) -> str:
    if exc.rows < len(names):
        return (f"{run.directory}: singular design: {exc.rows} steps cannot determine {len(names)} terms"
                f" ({', '.join(label[k] for k in names)}); profile more steps")
    # the direction of the smallest singular value names the collinear features
    involved = [label[names[i]] for i in exc.columns]
    hint = " or pass --no-intercept" if "overhead" in names else ""
    return (
        f"{run.directory}: singular design: {' and '.join(involved)} are collinear across the {exc.rows} steps"
        + (" (e.g. every step carried the same images), so their coefficients cannot be told apart;"
           f" profile a run whose batches vary in image sizes and counts{hint}" if what == "vision" else
           f", so their coefficients cannot be told apart; profile a run whose {what} batches vary{hint}")
    )
