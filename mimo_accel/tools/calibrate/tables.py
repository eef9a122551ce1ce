"""``mimo-accel calibrate``'s tables: each module's fitted terms and the fit's quality (rich)."""

from __future__ import annotations

import math
from typing import Any

from rich.console import Console
from rich.table import Table

from mimo_accel.costs import CostModel
from mimo_accel.modules import LANGUAGE
from mimo_accel.profiler.observations import ProfileSpec, encoder_spec, language_spec

__all__ = ["render_modules"]


def _fmt(v: float | None, spec: str = ".3g") -> str:
    if v is None:
        return "—"
    if isinstance(v, float) and math.isinf(v):
        return "∞"
    return format(v, spec)


def render_modules(model: CostModel, stats: dict[str, dict[str, Any]], console: Console | None = None) -> None:
    """Print every module's fit (:func:`fit_modules`) as rich tables, one per module."""
    console = console or Console()
    for m, st in stats.items():
        if m == LANGUAGE:
            spec = language_spec(m)
            labels = {"a": "a · tokens", "b": "b · Σ tokens² (per sample)"}
            default = 1 / 8192  # the built-in language cost L + L²/8192
        else:
            spec = encoder_spec(m)
            labels = {"a": "a · rows", "b": "b · Σ rows² (per item)", "k": "k · items"}
            default = CostModel().b / CostModel().a
        _render_one(spec, f"{m}: cost-model fit — {st['run']}", labels, st, default, console)


def _render_one(spec: ProfileSpec, title: str, labels: dict, stats: dict[str, Any], default_ratio: float,
                console: Console) -> None:
    what = spec.what
    t = Table(title=title, title_justify="left")
    for col in ("term", "coefficient", "units", "std err", "t", "significant", "share of time"):
        t.add_column(col, justify="right" if col not in ("term", "units") else "left")
    label = {**labels,
             "overhead": "overhead per step, mean (not in model)" if stats.get("per_step") else "overhead (not in model)"}
    sq = stats["sq"]
    for key in (*spec.coefficients, "overhead"):
        term = stats["terms"].get(key)
        if term is None:
            continue
        if not term["fitted"]:
            reason = f"no {spec.optional} in logs" if key == "b" and not sq else "not observed"
            t.add_row(label[key], "0", spec.units[key], "—", "—", f"[yellow]not fitted ({reason})[/]", "—")
            continue
        sig = "[green]yes[/]" if term["significant"] else ("no (clamped to 0)" if term["coef"] == 0 else "[yellow]no[/]")
        if "per_step" in term:
            sig = "—"
        t.add_row(label[key], _fmt(term["coef"], ".4g"), spec.units[key], _fmt(term["stderr"]),
                  _fmt(term["t"], ".1f"), sig, f"{term['share']:.1%}")
    console.print(t)
    q = Table(title=f"Fit quality ({spec.module})", title_justify="left",
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
