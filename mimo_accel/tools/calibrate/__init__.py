"""Fit each module's cost model from profiler logs.

``mimo-accel calibrate RUN_DIR [--run ID] [--out cost.json] [--warmup N] [--no-intercept | --per-step] [--json PATH]``

Every module is fitted from its own measured times, per step and replica (one rank-step is one
observation; a module of PP stages, one replica-step: its stages summed, each its slowest rank),
with the profiler's per-module names:

- an encoder ``m``: ``<m>_fwd_s + <m>_bwd_s`` against ``<m>_rows`` (its encoder rows),
  ``<m>_sq_rows`` (Σ rows² over its items: the attention term) and ``<m>_items``, giving
  ``a·rows + b·sq_rows + k·items``;
- the language model: ``language_fwd_s + language_bwd_s`` against ``tokens`` (the replica's real
  tokens) and ``sq_tokens`` (Σ over its samples of L²), giving ``a·tokens + b·tokens²``.

The result is a v2 cost-model file with every fitted module in its ``modules`` table (see
:class:`~mimo_accel.costs.CostModel`).

Each module's step lines are its observations (one per rank-step, or per replica-step for PP
stages), fitted by non-negative least squares, e.g. for an encoder

    time ≈ a·rows + b·sq_rows + k·items + overhead

in seconds. ``overhead`` is a fixed per-step time (kernel launches, the merger's fixed work): it is
the same on every replica, so it cannot change a balancing decision and is not part of the model;
fitting it keeps it from inflating the other terms. ``--no-intercept`` drops it.

``--per-step`` fits one overhead per step instead (a step fixed effect): what every replica of a
step shares — the step's fixed work, and the machine's speed while it ran. On a shared machine the
same work can take 20 % longer in one step than in the next, on every replica at once (measured on
the 2-core VM: identical forward+backward passes took 122-237 ms over a minute); a single overhead
leaves that drift in the residual, although it cannot change which replica is slowest. The
coefficients are then fitted on how replicas differ *within* a step — the only thing a balancing
plan uses — and ``r2`` is the share of that within-step variation the model explains;
``r2_across_steps`` is the plain fit's R² (one overhead), reported beside it. With one replica
there is no within-step variation, and the fit falls back to one overhead (and says so).

The attention counter (``<m>_sq_rows``, ``sq_tokens``) is optional. When the logs do not carry it
the fit falls back to the linear terms (``b = 0``) and says so.

Fit quality, printed and stored in the model file's ``fit`` metadata per module: ``r2``, ``rmse``
(s), ``rel_rmse`` (rmse / mean time), ``n`` (observations), and per feature the standard error and
t-value (on the features NNLS kept; a feature is *significant* if t > 2).

Steps without the module's time and the first ``--warmup`` step numbers (default 1: the first step
pays for allocation and compilation) are skipped.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console

from mimo_accel.modules import LANGUAGE
from mimo_accel.profiler.run import ProfileError, read_run
from mimo_accel.tools.arguments import UsageError, fail, nonnegative_int, output_file, parse
from mimo_accel.profiler.fitting import fit_modules
from mimo_accel.profiler.observations import CalibrationError, modules_in
from mimo_accel.tools.calibrate.tables import render_modules

__all__ = ["PROG", "main"]

PROG = "mimo-accel calibrate"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG,
                                description="Fit each module's cost model from its own measured times in a profiler run.")
    p.add_argument("run_dir", metavar="RUN_DIR", help="profile directory (rank<N>.jsonl files)")
    p.add_argument("--out", metavar="PATH", help="write the cost-model file (use it as cost_model=PATH or "
                                                 "MIMO_ACCEL_COST_MODEL=PATH)")
    p.add_argument("--json", metavar="PATH", help="write the fit statistics as JSON")
    p.add_argument("--warmup", type=nonnegative_int, default=1, metavar="N",
                   help="skip the first N step numbers (default 1)")
    p.add_argument("--no-intercept", action="store_true", help="fit without a per-step overhead term")
    p.add_argument("--per-step", action="store_true",
                   help="one overhead per step (what all replicas of a step share: its fixed work, the machine's "
                        "speed at the time); R² is then the share of the within-step variation explained")
    p.add_argument("--run", metavar="ID", help="of a directory holding the rank files of several runs, fit the run ID "
                                               "(its id or the start of it, as the refusal names them)")
    return p


def _use(path: str) -> str:
    return f"use: cost_model={path} or MIMO_ACCEL_COST_MODEL={path}"


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
        run = read_run(args.run_dir, run=args.run)
        modules = modules_in(run)
        model, per_module = fit_modules(run, warmup=args.warmup, intercept=not args.no_intercept,
                                        per_step=args.per_step, modules=modules)
    except (UsageError, ProfileError, CalibrationError) as e:
        return fail(PROG, e)
    if console is None:
        # Piped output: rich would wrap the tables at 80 columns; give them room instead.
        console = Console() if sys.stdout.isatty() else Console(width=120)
    for w in run.warnings:  # the run's, once (each module's fit lists its own)
        console.print(f"[yellow]warning:[/] {w}")
    render_modules(model, per_module, console)
    if args.out:
        model.to_file(args.out)
        fitted = "; ".join(f"{m}: " + " ".join(f"{k}={v:.4g}" for k, v in model.of(m).to_dict().items()
                                              if not (m == LANGUAGE and k == "k"))
                           for m in modules)
        console.print(f"wrote {args.out}: {fitted} ({_use(args.out)})")
    else:
        console.print("pass --out cost.json to write the model")
    if args.json:
        doc = {"model": model.to_doc(), "modules": per_module, "warnings": list(run.warnings)}
        Path(args.json).write_text(json.dumps(doc, indent=2, default=_json_default) + "\n", encoding="utf-8")
    return 0


def _json_default(obj: Any) -> Any:
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return str(obj)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
