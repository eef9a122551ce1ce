"""``mimo-accel simulate``: the command line, checked, into a :func:`~mimo_accel.tools.simulate.sweep.simulate` run."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console

from mimo_accel.costs import CostModel
from mimo_accel.tools.arguments import (UsageError, fail, nonnegative_int, output_file, parse, positive_int,
                                        require_extra)
from mimo_accel.tools.simulate.charts import write_png
from mimo_accel.tools.simulate.console import render
from mimo_accel.tools.simulate.inputs import dp_rule_value, parse_dp_list
from mimo_accel.tools.simulate.layout import parse_layout, render_layout, simulate_layout
from mimo_accel.tools.simulate.sweep import simulate
from mimo_accel.workloads import AUDIO, ProfileError, load_profile


# --------------------------------------------------------------------------------------- main


PROG = "mimo-accel simulate"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Simulate the planners (contiguous, LPT, balanced) and sharded reads at cluster scale, or "
                    "(--layout) the step a pipeline layout runs under each planner.",
    )
    p.add_argument("--workload", default=None,
                   help="workload profile name (mimo_accel/workloads/<name>.toml) or path; default receipts "
                        "(with --layout: every shipped profile)")
    p.add_argument("--layout", metavar="SPEC",
                   help="model the step a pipeline layout runs instead of the DP sweep: the preset reference-27b "
                        "(upstream's Qwen3.5-VL tutorial) or a spec such as 'images=tp1,pp1,dp1 "
                        "language=tp4,pp2,dp2 mbs=2 gbs=32 [frozen=images]'. Per workload: the modelled step time "
                        "of the original order, upstream's merged reorder, PR #4608, mimo_accel and the bound")
    p.add_argument("--dp", default=None, help="DP sizes of the workload's first encoder (vision), e.g. 2,4,8 or "
                                              "2,4,...,512 (default)")
    p.add_argument("--steps", type=positive_int, default=20,
                   help="steps per DP size, each of --reorder-window global micro-batches (default 20)")
    p.add_argument("--reorder-window", type=positive_int, default=None, metavar="W",
                   help="global micro-batches per step planned together (AccelConfig's reorder_window, "
                        "MIMO_ACCEL_REORDER_WINDOW); default 1: each micro-batch alone. Above 1 adds the "
                        "window table")
    p.add_argument("--per-replica", type=positive_int, default=None, metavar="K",
                   help="samples per replica of the first encoder (default: the workload's micro_batch_size / "
                        "that encoder's dp)")
    p.add_argument("--seed", type=nonnegative_int, default=0)
    p.add_argument("--cost-model", metavar="FILE",
                   help="cost-model file from `mimo-accel calibrate` (AccelConfig's cost_model, "
                        "MIMO_ACCEL_COST_MODEL; default: built-in)")
    p.add_argument("--language-dp", default=None, metavar="ratio|equal|R",
                   help="language DP per first-encoder DP: the workload's ratio (default), equal, or R language "
                        "replicas per first-encoder replica (0.5: fan-in, 2: fan-out)")
    p.add_argument("--audio-dp", default=None, metavar="ratio|equal|R",
                   help="audio DP per first-encoder DP, where the workload has an [audio] encoder (as --language-dp)")
    p.add_argument("--model", metavar="NAME|FILE",
                   help="with --layout: price in seconds from this model's FLOPs (a preset: qwen35-vl-27b, or a "
                        "YAML model file, as `mimo-accel layout --model`); default: the preset layout's own model")
    p.add_argument("--gpu", metavar="NAME", help="with --layout and a model: the GPU it is priced on (h100, h200, "
                                                 "a100, a100-40, b200; default h100)")
    p.add_argument("--seq-length", type=positive_int, metavar="N",
                   help="with --layout: the sequence length a padded batch computes and real tokens are cut at "
                        "(default: the spec's seq=, the model's, else the workload's)")
    p.add_argument("--json", metavar="PATH", help="write the results as JSON")
    p.add_argument("--png", metavar="PATH", help="write charts (needs matplotlib)")
    return p


def _cost_model(path: str | None) -> CostModel | None:
    if path is None:
        return None
    if not Path(path).exists():
        raise UsageError(f"--cost-model {path}: no such file; give the file `mimo-accel calibrate RUN_DIR --out "
                         "FILE` wrote, or leave --cost-model out for the built-in coefficients")
    return CostModel.from_file(path)


def _check_dp_rule(flag: str, rule: str, module: str) -> None:
    try:
        dp_rule_value(rule, module)
    except ValueError:
        raise UsageError(f"{flag} {rule}: give ratio (the workload's), equal, or a positive number of {module} "
                         "replicas per replica of the workload's first encoder (e.g. 0.5, 2)") from None


# the DP sweep's own flags: refused with --layout rather than ignored
_SWEEP_ONLY = (("--dp", "dp"), ("--reorder-window", "reorder_window"), ("--per-replica", "per_replica"),
               ("--language-dp", "language_dp"), ("--audio-dp", "audio_dp"), ("--png", "png"))


_LAYOUT_ONLY = (("--model", "model"), ("--gpu", "gpu"), ("--seq-length", "seq_length"))


def _layout_main(args: argparse.Namespace, console: Console | None) -> int:
    try:
        for flag, dest in _SWEEP_ONLY:
            if getattr(args, dest) is not None:
                raise UsageError(f"{flag} applies to the DP sweep, not --layout; drop {flag} (the layout gives "
                                 "every module's DP and the step's micro-batches)")
        if args.cost_model and (args.model or args.gpu):
            raise UsageError("--cost-model prices the layout as the file says; --model / --gpu price it from a "
                             "model's FLOPs: give one or the other")
        output_file("--json", args.json)
        layout = parse_layout(args.layout)
        workloads = [load_profile(args.workload)] if args.workload is not None else None
        if args.gpu and not args.model and layout.preset is None:
            raise UsageError("--gpu prices a model's FLOPs: give --model too (a preset or a model file)")
        doc = simulate_layout(layout, workloads, steps=args.steps, seed=args.seed,
                              cost_model=_cost_model(args.cost_model),
                              cost_source=str(args.cost_model) if args.cost_model else "default",
                              model=args.model, gpu=args.gpu, seq_length=args.seq_length)
    except (ProfileError, ValueError, OSError) as e:
        return fail(PROG, e)
    render_layout(doc, console or (Console() if sys.stdout.isatty() else Console(width=170)))
    if args.json:
        Path(args.json).write_text(json.dumps(doc, indent=2, allow_nan=False) + "\n", encoding="utf-8")
    return 0


def main(argv: Sequence[str] | None = None, *, console: Console | None = None) -> int:
    """``mimo-accel simulate``. Returns 0, or 2 (one ``error:`` line) on bad input or a failed export."""
    args = parse(_parser(), argv)
    if isinstance(args, int):
        return args
    if args.layout is not None:
        return _layout_main(args, console)
    for flag, dest in _LAYOUT_ONLY:
        if getattr(args, dest) is not None:
            return fail(PROG, f"{flag} applies to --layout; drop {flag}, or give --layout SPEC")
    args.workload = "receipts" if args.workload is None else args.workload
    args.dp = "2,4,...,512" if args.dp is None else args.dp
    args.reorder_window = 1 if args.reorder_window is None else args.reorder_window
    args.language_dp = "ratio" if args.language_dp is None else args.language_dp
    try:
        output_file("--json", args.json)
        output_file("--png", args.png)
        if args.png:
            require_extra("--png", "matplotlib", "charts")
        profile = load_profile(args.workload)
        dps = parse_dp_list(args.dp)
        model = _cost_model(args.cost_model)
        _check_dp_rule("--language-dp", args.language_dp, "language")
        if args.audio_dp is not None:
            if AUDIO not in profile.modules:
                raise UsageError(f"--audio-dp {args.audio_dp}: the workload {profile.name} has no [audio] "
                                 "encoder; drop --audio-dp, or pick a workload with one")
            _check_dp_rule("--audio-dp", args.audio_dp, "audio")
        doc = simulate(profile, dps, steps=args.steps, samples_per_replica=args.per_replica, seed=args.seed,
                       cost_model=model, language_dp=args.language_dp,
                       cost_source=str(args.cost_model) if args.cost_model else "default",
                       reorder_window=args.reorder_window, audio_dp=args.audio_dp or "ratio")
    except (ProfileError, ValueError, OSError) as e:
        return fail(PROG, e)
    if console is None:
        # Piped output: rich would wrap the tables at 80 columns; give them room instead.
        console = Console() if sys.stdout.isatty() else Console(width=170)
    render(doc, console)
    if args.json:
        Path(args.json).write_text(json.dumps(doc, indent=2, allow_nan=False) + "\n", encoding="utf-8")
    if args.png:
        try:
            write_png(doc, args.png)
        except RuntimeError as e:
            return fail(PROG, e)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
