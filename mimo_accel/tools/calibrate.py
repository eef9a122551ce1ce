"""Fit each module's cost model from profiler logs.

``mimo-accel calibrate RUN_DIR [--out cost.json] [--warmup N] [--no-intercept | --per-step] [--json PATH]``

Every module is fitted from its own measured times, per step and replica (one rank-step is one
observation; a module of PP stages, one replica-step: its stages summed, each its slowest rank),
with the profiler's per-module names:

- an encoder ``m``: ``<m>_fwd_s + <m>_bwd_s`` against ``<m>_rows`` (its encoder rows),
  ``<m>_sq_rows`` (Σ rows² over its items: the attention term) and ``<m>_items``, giving
  ``a·rows + b·sq_rows + k·items``;
- the language model: ``language_fwd_s + language_bwd_s`` against ``tokens`` (the replica's real
  tokens) and ``sq_tokens`` (Σ over its samples of L²), giving ``a·tokens + b·tokens²``.

The result is a v2 cost-model file with every fitted module in its ``modules`` table (see
:class:`~mimo_accel.costs.CostModel`). A run of the vision-only profiler (``vision_fwd_s``,
``patches``, ``sq_patches``, ``images``: format-1 profile files) is fitted for its vision
encoder's ``(a, b, c)``, as described below; everything said there (the overhead, ``--per-step``,
a missing attention counter, the fit quality) holds for each module alike.

Each step line of a vision rank (``rank<N>.jsonl`` from :class:`mimo_accel.profiler.Recorder`) is
one observation: the rank's vision time in that step, ``vision_fwd_s + vision_bwd_s`` (a missing
part counts 0, as in ``mimo-accel report``), against what its encoder saw: ``patches`` (Σp),
``sq_patches`` (Σp² over the images: the attention term) and ``tokens``. A non-negative least
squares fit of

    time ≈ a·Σp + b·Σp² + c·tokens + overhead

gives the :class:`~mimo_accel.costs.CostModel` ``(a, b, c)`` in seconds (``a`` is seconds per
patch). ``overhead`` is a fixed per-step time (kernel launches, the merger's fixed work): it is
the same on every replica, so it cannot change a balancing decision and is not part of the model;
fitting it keeps it from inflating ``a`` or ``c``. ``--no-intercept`` drops it.

``--per-step`` fits one overhead per step instead (a step fixed effect): what every vision
replica of a step shares — the step's fixed work, and the machine's speed while it ran. On a
shared machine the same work can take 20 % longer in one step than in the next, on every replica
at once (measured on the 2-core VM: identical forward+backward passes took 122-237 ms over a
minute); a single overhead leaves that drift in the residual, although it cannot change which
replica is slowest. The coefficients are then fitted on how replicas differ *within* a step —
the only thing a balancing plan uses — and ``r2`` is the share of that within-step variation the
model explains; ``r2_across_steps`` is the plain fit's R² (one overhead), reported beside it.
With one vision replica there is no within-step variation, and the fit falls back to one
overhead (and says so).

``sq_patches`` is an optional step field. When the logs do not carry it the fit falls back to
``a`` and ``c`` only (``b = 0``) and says so: the model then weighs an image by its patch count,
not by its attention cost.

Fit quality, printed and stored in the model file's ``fit`` metadata: ``r2`` (on the vision
time), ``rmse`` (s), ``rel_rmse`` (rmse / mean time), ``n`` (observations), and per feature the
standard error and t-value (on the features NNLS kept; a feature is *significant* if t > 2).

Rank logs whose header says ``module = "language"`` are skipped; so are steps without a vision
time and the first ``--warmup`` step numbers (default 1: the first step pays for allocation and
compilation).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from mimo_accel.costs import CostModel, ModuleCost
from mimo_accel.costs.nnls import nnls
from mimo_accel.modules import LANGUAGE, replica_seconds
from mimo_accel.profiler import NoProfileData, Run, read_run
from mimo_accel.tools.arguments import UsageError, fail, nonnegative_int, output_file, parse
from mimo_accel.profiler import record_number as _num

__all__ = ["FEATURES", "CalibrationError", "encoder_spec", "fit", "fit_modules", "language_spec", "main",
           "modules_in", "nnls", "observations", "render", "render_modules"]

#: Step fields the model is fitted on, with the coefficient each one gives.
FEATURES = (("patches", "a"), ("sq_patches", "b"), ("tokens", "c"))
_UNITS = {"a": "s / patch", "b": "s / patch²", "c": "s / token", "overhead": "s / step"}
_MIN_STEPS = 3
_MAX_CONDITION = 1e10  # of the column-normalised design; above it the fit is meaningless
_T_SIGNIFICANT = 2.0


class CalibrationError(ValueError):
    """A run that cannot be calibrated from; the message says why and what to record instead."""


# ---------------------------------------------------------------------------------- fitting


@dataclass(frozen=True)
class _Spec:
    """What one module's fit reads from the step lines and says in its messages."""

    module: str  # the module's name (the model's key); "" for the v1 vision fit
    regions: tuple[str, str]  # the forward and backward time fields
    features: tuple[tuple[str, str], ...]  # (step field, coefficient); the first is required, the others too
    optional: str  # the attention field that older logs may lack (fitted only where every step has it)
    what: str  # "vision" / "audio" / "language": how messages name the module's steps
    labels: dict  # coefficient -> feature label in messages
    units: dict  # coefficient -> units
    nothing: str  # why the first feature must be observed
    skip_language_logs: bool = False  # the v1 fit pools every rank log but the language ones

    @property
    def coefficients(self) -> tuple[str, ...]:
        return tuple(c for _, c in self.features)


def _v1_spec() -> _Spec:
    return _Spec("", ("vision_fwd_s", "vision_bwd_s"), FEATURES, "sq_patches", "vision",
                 {"a": "patches", "b": "sq_patches", "c": "tokens", "overhead": "the per-step overhead"},
                 _UNITS, "no usable vision step has any patches (the encoder saw no images), so no cost can be "
                 "fitted; profile steps with images", skip_language_logs=True)


def encoder_spec(module: str) -> _Spec:
    """An encoder ``module``'s fit: ``<m>_fwd_s + <m>_bwd_s`` against ``<m>_rows``, ``<m>_sq_rows``
    (Σ rows² over its items: the attention term) and ``<m>_items``."""
    return _Spec(module, (f"{module}_fwd_s", f"{module}_bwd_s"),
                 ((f"{module}_rows", "a"), (f"{module}_sq_rows", "b"), (f"{module}_items", "k")),
                 f"{module}_sq_rows", module,
                 {"a": f"{module}_rows", "b": f"{module}_sq_rows", "k": f"{module}_items",
                  "overhead": "the per-step overhead"},
                 {"a": "s / row", "b": "s / row²", "k": "s / item", "overhead": "s / step"},
                 f"no usable {module} step has any rows (the encoder saw no input), so no cost can be fitted; "
                 f"profile steps where the {module} encoder has work")


def language_spec(module: str = LANGUAGE) -> _Spec:
    """The language model's fit: ``language_fwd_s + language_bwd_s`` against ``tokens`` (the
    replica's real tokens) and ``sq_tokens`` (Σ over its samples of L²)."""
    return _Spec(module, (f"{module}_fwd_s", f"{module}_bwd_s"), (("tokens", "a"), ("sq_tokens", "b")),
                 "sq_tokens", module, {"a": "tokens", "b": "sq_tokens", "overhead": "the per-step overhead"},
                 {"a": "s / token", "b": "s / token²", "overhead": "s / step"},
                 f"no usable {module} step has any tokens, so no cost can be fitted")


def _observe(run: Run, spec: _Spec, *, warmup: int = 1) -> dict[str, Any]:
    """The usable steps of ``spec``'s module in ``run`` (one entry per rank-step)."""
    fwd_key, bwd_key = spec.regions
    logs = [log for log in run.ranks.values() if not (spec.skip_language_logs and log.module == LANGUAGE)]
    timed = [(log.rank, rec) for log in logs for rec in log.steps
             if _num(rec, fwd_key) is not None or _num(rec, bwd_key) is not None]
    if not timed:
        modules = sorted({log.module for log in run.ranks.values()})
        raise CalibrationError(
            f"{run.directory}: no {spec.what} steps in the run (no step line has {fwd_key}/{bwd_key};"
            f" modules seen: {', '.join(modules)}); profile a run with the {spec.what}"
            f"{' encoder' if spec.what != LANGUAGE else ' model'} timed"
            f" (mimo_accel profiler on the {spec.what} ranks)"
        )
    timed = _stages_summed(run, spec, timed)
    numbers = sorted({int(rec["step"]) for _, rec in timed})
    skipped = numbers[:warmup] if warmup > 0 and len(numbers) > warmup else []
    skip = set(skipped)
    required = [f for f, _ in spec.features if f != spec.optional]
    y, steps, ranks, columns = [], [], set(), {f: [] for f, _ in spec.features}
    dropped = 0
    for rank, rec in timed:
        if int(rec["step"]) in skip:
            continue
        seconds = (_num(rec, fwd_key) or 0.0) + (_num(rec, bwd_key) or 0.0)
        values = {f: _num(rec, f) for f in required}
        if seconds < 0 or any(v is None or v < 0 for v in values.values()):
            dropped += 1
            continue
        y.append(seconds)
        for f in required:
            columns[f].append(values[f])
        sq = _num(rec, spec.optional)
        first = values[spec.features[0][0]]
        # Σx² >= Σx > 0 whenever there is work: a 0 there is a log that did not record it.
        columns[spec.optional].append(sq if sq is not None and sq >= 0 and not (sq == 0 and first > 0) else None)
        steps.append(int(rec["step"]))
        ranks.add(rank)
    out = {f: (np.asarray(v, dtype=np.float64) if f != spec.optional else v) for f, v in columns.items()}
    out.update({"y": np.asarray(y, dtype=np.float64), "steps": np.asarray(steps, dtype=np.int64),
                "ranks": sorted(ranks), "skipped_warmup": skipped, "dropped": dropped})
    return out


def _stages_summed(run: Run, spec: _Spec, timed: list) -> list:
    """Where the module runs PP stages (the header's ``layout["pp"]``), one observation per replica
    and step (:func:`~mimo_accel.modules.replica_seconds`), its features the largest any of its
    ranks counted. Without PP stages, one observation per rank-step."""
    stages = int((run.layout.get("pp") or {}).get(spec.module) or 1) if spec.module else 1
    if stages <= 1:
        return timed
    fwd_key, bwd_key = spec.regions
    members: dict = {}
    for rank, rec in timed:
        members.setdefault((run.ranks[rank].dp_rank, int(rec["step"])), []).append((rank, rec))
    out = []
    for (_, step), group in sorted(members.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        times = {rank: (_num(rec, fwd_key) or 0.0) + (_num(rec, bwd_key) or 0.0) for rank, rec in group}
        rec = {"step": step, fwd_key: replica_seconds(times, stages)}
        for f, _ in spec.features:
            values = [v for _, r in group if (v := _num(r, f)) is not None]
            rec[f] = max(values) if len(values) == len(group) else None
        out.append((min(times), rec))
    return out


def observations(run: Run, *, warmup: int = 1) -> dict[str, Any]:
    """The usable vision steps of ``run``: ``{y, patches, sq_patches (None where missing), tokens,
    ranks, skipped_warmup, dropped}`` (arrays are float64, one entry per rank-step)."""
    return _observe(run, _v1_spec(), warmup=warmup)


def fit(run: Run, *, warmup: int = 1, intercept: bool = True,
        per_step: bool = False) -> tuple[CostModel, dict[str, Any]]:
    """Fit the cost model to ``run``'s vision steps; returns ``(model, stats)``.

    ``stats`` (JSON-serialisable): ``n``, ``ranks``, ``r2``, ``rmse``, ``rel_rmse``,
    ``mean_time``, ``sq_patches`` (whether Σp² was fitted), ``intercept``, ``overhead_s``,
    ``terms`` ({a, b, c, overhead: {coef, stderr, t, significant, share, fitted}}), ``b_over_a``,
    ``skipped_warmup``, ``warnings``; with ``per_step`` (one overhead per step, see the module
    docstring) also ``per_step``, ``steps`` and ``r2_across_steps``, and ``r2`` is the within-step
    R². Raises :class:`CalibrationError` for a run without vision
    steps, with fewer than 3 usable steps, or whose steps cannot separate the features.
    """
    coefs, stats, meta = _fit_spec(run, _v1_spec(), warmup=warmup, intercept=intercept, per_step=per_step)
    stats["sq_patches"] = stats.pop("sq")
    meta["sq_patches"] = meta.pop("sq")
    return CostModel(a=coefs["a"], b=coefs["b"], c=coefs["c"], fit=meta), stats


def _fit_spec(run: Run, spec: _Spec, *, warmup: int, intercept: bool,
              per_step: bool) -> tuple[dict[str, float], dict[str, Any], dict[str, Any]]:
    """(coefficients, stats, model-file metadata) of one module's fit."""
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup must be an integer >= 0, got {warmup!r}")
    if per_step and not intercept:
        raise ValueError("per_step fits one overhead per step: it needs the intercept (drop intercept=False)")
    what = spec.what
    obs = _observe(run, spec, warmup=warmup)
    warnings = list(run.warnings)
    if obs["dropped"]:
        counters = "/".join(f for f, _ in spec.features if f != spec.optional)
        counters = "patches/tokens" if not spec.module else counters
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
        if not spec.module:
            warnings.append(
                "the logs carry no sq_patches (Σ patches² per step), so the attention term cannot be fitted:"
                " b = 0 and the model weighs images by patch count only. Record sq_patches (the profiler hook"
                " of this version does) and calibrate again."
            )
        else:
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
        warnings.append(f"no step has two {what} replicas with different "
                        f"{'images' if not spec.module else 'work'}, so per-step overheads cannot be"
                        " told from the features: fitted one overhead across steps")
        per_step = False
    across = None
    if per_step:
        # the within transformation: each step's mean taken out of y and every feature is the
        # least-squares fit with one free intercept per step
        across = None
        try:  # the same fit with one overhead across steps, for comparison only
            across = _fit_spec(run, spec, warmup=warmup, intercept=True, per_step=False)[1]
        except CalibrationError as exc:  # e.g. a feature equal in every step, collinear with that overhead
            warnings.append(f"the fit with one overhead across steps is not determined ({exc}); only the "
                            "per-step fit is given")
        y_all = y
        means = {s: step_of == s for s in groups}
        y = y - _step_means(y, step_of, means)
        raw_columns = columns
        columns = {k: col - _step_means(col, step_of, means) for k, col in columns.items()}
        for name in [k for k, col in columns.items() if not col.any()]:
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
        columns["overhead"] = np.ones(n)
    names = list(columns)
    x = np.column_stack([columns[k] for k in names])
    scale = np.linalg.norm(x, axis=0)
    scale[scale == 0] = 1.0
    xs = x / scale
    sv = np.linalg.svd(xs, compute_uv=False)
    if n < len(names) or sv[-1] <= sv[0] / _MAX_CONDITION:
        raise CalibrationError(_singular_message(run, xs, names, n, spec.labels, what))

    w = nnls(xs, y) / scale
    pred = x @ w
    resid = y - pred
    rss = float(resid @ resid)
    tss = float(((y - y.mean()) ** 2).sum()) if not per_step else float(y @ y)
    r2 = 1.0 - rss / tss if tss > 0 else (1.0 if rss <= 1e-30 else 0.0)
    rmse = math.sqrt(rss / n)
    x_fit = x
    if per_step:
        # the step intercepts: what each step's mean time leaves over the features' share
        raw = np.column_stack([raw_columns[k] for k in names])
        step_overhead = {int(s): float(y_all[m].mean() - raw[m].mean(axis=0) @ w) for s, m in means.items()}
        x, y = raw, y_all
        pred = x @ w + np.array([step_overhead[int(s)] for s in step_of])
    mean_time = float(y.mean())

    active = [i for i in range(len(names)) if w[i] > 0]
    dof = n - len(active) - (len(groups) if per_step else 0)
    se = np.full(len(names), math.nan)
    if active and dof > 0:
        xa = x_fit[:, active]
        try:
            cov = (rss / dof) * np.linalg.inv(xa.T @ xa)
            se[active] = np.sqrt(np.clip(np.diag(cov), 0, None))
        except np.linalg.LinAlgError:  # pragma: no cover - excluded by the condition check
            pass
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
            "share": float(w[i] * x[:, i].mean() / mean_pred) if mean_pred > 0 else 0.0,
            "fitted": True,
        }
    if per_step:
        level = float(np.mean([step_overhead[int(s)] for s in step_of]))
        terms["overhead"] = {"coef": level, "stderr": None, "t": None, "significant": False,
                             "share": level / float(pred.mean()) if pred.mean() > 0 else 0.0, "fitted": True,
                             "per_step": step_overhead}
    for coef in spec.coefficients:
        if coef not in terms:
            terms[coef] = {"coef": 0.0, "stderr": None, "t": None, "significant": False, "share": 0.0,
                           "fitted": False}
    coefs = {k: terms[k]["coef"] for k in spec.coefficients}
    if not any(coefs.values()):
        if not spec.module:
            raise CalibrationError(
                f"{run.directory}: the fit gives every feature a zero coefficient (vision time does not grow"
                " with patches or tokens in these steps); profile steps whose image load varies"
            )
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


# ------------------------------------------------------------------------------ every module


def modules_in(run: Run) -> list[str]:
    """The modules whose own counters the run records (``<m>_rows`` for an encoder, ``tokens`` with
    ``language_fwd_s``/``language_bwd_s`` for the language model), in rank order; empty for a run
    of the vision-only profiler (its ``patches``/``vision_fwd_s`` names)."""
    found: dict[str, None] = {}
    for r in sorted(run.ranks):
        log = run.ranks[r]
        for rec in log.steps:
            for key in rec:
                if key.endswith("_rows") and not key.endswith("_sq_rows"):
                    m = key[:-len("_rows")]
                    if _num(rec, f"{m}_fwd_s") is not None or _num(rec, f"{m}_bwd_s") is not None:
                        found.setdefault(m, None)
            if _num(rec, f"{LANGUAGE}_fwd_s") is not None or _num(rec, f"{LANGUAGE}_bwd_s") is not None:
                found.setdefault(LANGUAGE, None)
    if found and LANGUAGE in found and len(found) == 1:
        return [LANGUAGE]
    return list(found)


def fit_modules(run: Run, *, warmup: int = 1, intercept: bool = True, per_step: bool = False,
                modules: Sequence[str] | None = None) -> tuple[CostModel, dict[str, dict[str, Any]]]:
    """Fit every module of ``run`` from its own measured times: per encoder m, ``<m>_fwd_s +
    <m>_bwd_s`` against ``<m>_rows``, ``<m>_sq_rows``, ``<m>_items`` (``a·rows + b·sq_rows +
    k·items``); the language model, ``language_fwd_s + language_bwd_s`` against ``tokens`` and
    ``sq_tokens`` (``a·tokens + b·tokens²``). Returns the v2 :class:`CostModel` (every fitted
    module in its ``modules`` table; ``a``, ``b`` are the first encoder's, in rank order) and each
    module's stats (as :func:`fit` gives them). A run with the vision-only
    profiler's names fits the vision encoder as :func:`fit` does."""
    names = list(modules) if modules is not None else modules_in(run)
    if not names:
        model, stats = fit(run, warmup=warmup, intercept=intercept, per_step=per_step)
        return model, {"vision": stats}
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
    return CostModel(a=a, b=b, c=0.0, fit=meta, modules=table), stats


def _step_means(col: np.ndarray, step_of: np.ndarray, masks: dict) -> np.ndarray:
    out = np.empty_like(col)
    for m in masks.values():
        out[m] = col[m].mean()
    return out


def _varies_within_steps(columns: dict[str, np.ndarray], step_of: np.ndarray) -> bool:
    """Whether some step has two observations (replicas) whose features differ."""
    for s in np.unique(step_of):
        m = step_of == s
        if m.sum() > 1 and any(np.ptp(col[m]) > 0 for col in columns.values()):
            return True
    return False


def _singular_message(run: Run, xs: np.ndarray, names: list[str], n: int, label: dict, what: str) -> str:
    if n < len(names):
        return (f"{run.directory}: singular design: {n} steps cannot determine {len(names)} terms"
                f" ({', '.join(label[k] for k in names)}); profile more steps")
    # the direction of the smallest singular value names the collinear features
    _, _, vt = np.linalg.svd(xs, full_matrices=False)
    v = np.abs(vt[-1])
    involved = [label[names[i]] for i in np.flatnonzero(v > 0.1 * v.max())]
    hint = " or pass --no-intercept" if "overhead" in names else ""
    return (
        f"{run.directory}: singular design: {' and '.join(involved)} are collinear across the {n} steps"
        + (" (e.g. every step carried the same images), so their coefficients cannot be told apart;"
           f" profile a run whose batches vary in image sizes and counts{hint}" if what == "vision" else
           f", so their coefficients cannot be told apart; profile a run whose {what} batches vary{hint}")
    )


# ------------------------------------------------------------------------------------- output


def _fmt(v: float | None, spec: str = ".3g") -> str:
    if v is None:
        return "—"
    if isinstance(v, float) and math.isinf(v):
        return "∞"
    return format(v, spec)


def render(model: CostModel, stats: dict[str, Any], console: Console | None = None) -> None:
    """Print the vision fit (:func:`fit`) as rich tables."""
    labels = {"a": "a · Σpatches", "b": "b · Σpatches²", "c": "c · tokens"}
    _render_one(_v1_spec(), f"Vision cost-model fit — {stats['run']}", labels, stats,
                CostModel().b / CostModel().a, "sq_patches", console or Console())


def render_modules(model: CostModel, stats: dict[str, dict[str, Any]], console: Console | None = None) -> None:
    """Print every module's fit (:func:`fit_modules`) as rich tables, one per module."""
    console = console or Console()
    for m, st in stats.items():
        if "sq_patches" in st:  # the vision-only profiler's names
            render(model, st, console)
            continue
        if m == LANGUAGE:
            spec = language_spec(m)
            labels = {"a": "a · tokens", "b": "b · Σ tokens² (per sample)"}
            default = 1 / 8192  # the built-in language cost L + L²/8192
        else:
            spec = encoder_spec(m)
            labels = {"a": "a · rows", "b": "b · Σ rows² (per item)", "k": "k · items"}
            default = CostModel().b / CostModel().a
        _render_one(spec, f"{m}: cost-model fit — {st['run']}", labels, st, default, spec.optional, console)


def _render_one(spec: _Spec, title: str, labels: dict, stats: dict[str, Any], default_ratio: float, sq_name: str,
                console: Console) -> None:
    what = spec.what
    t = Table(title=title, title_justify="left")
    for col in ("term", "coefficient", "units", "std err", "t", "significant", "share of time"):
        t.add_column(col, justify="right" if col not in ("term", "units") else "left")
    label = {**labels,
             "overhead": "overhead per step, mean (not in model)" if stats.get("per_step") else "overhead (not in model)"}
    sq = stats["sq_patches"] if "sq_patches" in stats else stats["sq"]
    for key in (*spec.coefficients, "overhead"):
        term = stats["terms"].get(key)
        if term is None:
            continue
        if not term["fitted"]:
            reason = f"no {sq_name} in logs" if key == "b" and not sq else "not observed"
            t.add_row(label[key], "0", spec.units[key], "—", "—", f"[yellow]not fitted ({reason})[/]", "—")
            continue
        sig = "[green]yes[/]" if term["significant"] else ("no (clamped to 0)" if term["coef"] == 0 else "[yellow]no[/]")
        if "per_step" in term:
            sig = "—"
        t.add_row(label[key], _fmt(term["coef"], ".4g"), spec.units[key], _fmt(term["stderr"]),
                  _fmt(term["t"], ".1f"), sig, f"{term['share']:.1%}")
    console.print(t)
    q = Table(title="Fit quality" + (f" ({spec.module})" if spec.module else ""), title_justify="left",
              show_header=False)
    q.add_column("metric")
    q.add_column("value", justify="right")
    if stats.get("per_step"):
        q.add_row("R² within steps (per-step overheads)", f"{stats['r2']:.4f}")
        q.add_row("R² across steps (one overhead)", f"{stats['r2_across_steps']:.4f}" if stats['r2_across_steps'] is not None else "not determined")
    else:
        q.add_row("R²", f"{stats['r2']:.4f}")
    q.add_row("relative RMSE", "—" if stats["rel_rmse"] is None else f"{stats['rel_rmse']:.2%}")
    q.add_row("RMSE", f"{stats['rmse'] * 1e3:.3g} ms (mean {what} time {stats['mean_time'] * 1e3:.3g} ms)")
    q.add_row("observations (rank-steps)", f"{stats['n']} from {len(stats['ranks'])} {what} rank(s)")
    skipped = stats["skipped_warmup"]
    q.add_row("warm-up steps skipped", f"step {', '.join(map(str, skipped))}" if skipped else "none")
    b_over_a = stats["b_over_a"]
    q.add_row("b / a (attention weight)", "—" if b_over_a is None else f"{b_over_a:.3g} (built-in default {default_ratio:.3g})")
    console.print(q)
    for w in stats["warnings"]:
        console.print(f"[yellow]warning:[/] {w}")


# --------------------------------------------------------------------------------------- main


PROG = "mimo-accel calibrate"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG,
                                description="Fit each module's cost model from its own measured times in a profiler "
                                            "run (the vision encoder's a, b, c from a run of the vision-only profiler).")
    p.add_argument("run_dir", metavar="RUN_DIR", help="profile directory (rank<N>.jsonl files)")
    p.add_argument("--out", metavar="PATH", help="write the cost-model file (use it as cost_model=PATH, "
                                                 "MIMO_ACCEL_COST_MODEL=PATH, or simulate --cost-model PATH)")
    p.add_argument("--json", metavar="PATH", help="write the fit statistics as JSON")
    p.add_argument("--warmup", type=nonnegative_int, default=1, metavar="N",
                   help="skip the first N step numbers (default 1)")
    p.add_argument("--no-intercept", action="store_true", help="fit without a per-step overhead term")
    p.add_argument("--per-step", action="store_true",
                   help="one overhead per step (what all replicas of a step share: its fixed work, the machine's "
                        "speed at the time); R² is then the share of the within-step variation explained")
    return p


def _use(path: str) -> str:
    return f"use: cost_model={path} or MIMO_ACCEL_COST_MODEL={path}, or mimo-accel simulate --cost-model {path}"


def main(argv: Sequence[str] | None = None, *, console: Console | None = None) -> int:
    """``mimo-accel calibrate``. Returns 0, or 2 (one ``mimo-accel calibrate: error:`` line) on a bad
    command line or a run that cannot be calibrated from."""
    args = parse(_parser(), argv)
    if isinstance(args, int):
        return args
    try:
        if args.per_step and args.no_intercept:
            raise UsageError("--per-step fits one overhead per step; drop --no-intercept")
        output_file("--out", args.out)
        output_file("--json", args.json)
        run = read_run(args.run_dir)
        modules = modules_in(run)
        if modules:
            model, per_module = fit_modules(run, warmup=args.warmup, intercept=not args.no_intercept,
                                            per_step=args.per_step, modules=modules)
        else:  # the vision-only profiler's names: one (a, b, c) fit of the vision encoder
            model, stats = fit(run, warmup=args.warmup, intercept=not args.no_intercept, per_step=args.per_step)
    except (UsageError, NoProfileData, CalibrationError) as e:
        return fail(PROG, e)
    if console is None:
        # Piped output: rich would wrap the tables at 80 columns; give them room instead.
        console = Console() if sys.stdout.isatty() else Console(width=120)
    if modules:
        render_modules(model, per_module, console)
    else:
        render(model, stats, console)
    if args.out:
        model.to_file(args.out)
        if modules:
            fitted = "; ".join(f"{m}: " + " ".join(f"{k}={v:.4g}" for k, v in model.of(m).to_dict().items()
                                                  if not (m == LANGUAGE and k == "k"))
                               for m in modules)
            console.print(f"wrote {args.out}: {fitted} ({_use(args.out)})")
        else:
            console.print(f"wrote {args.out}: a={model.a:.4g} b={model.b:.4g} c={model.c:.4g} ({_use(args.out)})")
    else:
        console.print("pass --out cost.json to write the model")
    if args.json:
        doc = ({"model": model.to_doc(), "modules": per_module} if modules else
               {"model": {"a": model.a, "b": model.b, "c": model.c}, **stats})
        Path(args.json).write_text(json.dumps(doc, indent=2, default=_json_default) + "\n", encoding="utf-8")
    return 0


def _json_default(obj: Any) -> Any:
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return str(obj)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
