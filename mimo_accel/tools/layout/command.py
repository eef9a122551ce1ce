"""``mimo-accel layout``: the command line, checked, into :func:`~mimo_accel.tools.layout.advice.advise`."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console

from mimo_accel.tools.arguments import UsageError, fail, nonnegative_int, output_file, parse, peak_tflops, positive_int
from mimo_accel.tools.layout.advice import OBJECTIVES, advise
from mimo_accel.tools.layout.console import render_advice
from mimo_accel.tools.layout.machine import CPU, GPUS
from mimo_accel.tools.layout.models import PRESETS
from mimo_accel.tools.layout.spec import parse_layout
from mimo_accel.workloads import ProfileError

PROG = "mimo-accel layout"


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number > 0, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number > 0, got {text}")
    return value


def _share(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a share in [0, 1), e.g. 0.1, got {text!r}") from None
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"must be a share in [0, 1), e.g. 0.1, got {text}")
    return value


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG,
        description="The non-colocated layouts (each module's TP/PP/DP, the micro-batch) of a MegatronMIMO model "
                    "within a GPU budget that fit in memory, priced with mimo_accel's step model with and without "
                    "mimo_accel, best first, and the settings that run the recommended one.")
    src = p.add_argument_group("costs and model")
    src.add_argument("--model", metavar="NAME|FILE",
                     help=f"the model: a preset ({', '.join(PRESETS)}) or a YAML model file; with --from, it "
                          "replaces the configs the profile holds")
    src.add_argument("--from", dest="profile", metavar="DIR",
                     help="a profiled run (profile=DIR): its learnt costs, module configs, parallel sizes, GPUs, batch")
    src.add_argument("--calibration", metavar="FILE",
                     help="a `mimo-accel calibrate-gpu --points FILE` file: each module's measured efficiency "
                          "(default: 0.40 of the peak)")
    mach = p.add_argument_group("machine")
    mach.add_argument("--gpus", type=positive_int, metavar="N", help="the GPU budget (default: the profiled run's)")
    mach.add_argument("--gpu", metavar="NAME", help=f"the GPU: {', '.join([*GPUS, CPU])} (cpu: the rehearsal's "
                                                    "CPU ranks, memory unbounded, communication 0); default h100, "
                                                    "or the profiled run's device")
    mach.add_argument("--gpus-per-node", type=positive_int, default=8, metavar="N", help="GPUs a node (default 8)")
    mach.add_argument("--peak-tflops", type=peak_tflops, metavar="T", help="dense BF16 TFLOP/s per GPU (the table's)")
    mach.add_argument("--memory-gib", type=_positive_float, metavar="G", help="memory per GPU in GiB (the table's)")
    mach.add_argument("--intra-node-gbps", type=_positive_float, metavar="B", help="NVLink GB/s per GPU and direction")
    mach.add_argument("--inter-node-gbps", type=_positive_float, metavar="B", help="network GB/s per GPU")
    mach.add_argument("--memory-reserve", type=_share, metavar="F",
                      help="share of each GPU's memory kept free for what the estimate leaves out (default 0.1)")
    mach.add_argument("--no-distributed-optimizer", action="store_true",
                      help="optimizer states unsharded (18 bytes a parameter, not 6 + 12/dp)")
    data = p.add_argument_group("data")
    data.add_argument("--workload", metavar="NAME|PATH", help="workload profile the steps are drawn from "
                                                               "(default receipts)")
    data.add_argument("--index", metavar="FILE", help="a `mimo-accel index` cost index the steps are drawn from")
    data.add_argument("--rehearsal", action="store_true", help="draw the workload's CPU-sized [rehearsal] samples "
                                                               "(to price with a CPU rehearsal's profile)")
    data.add_argument("--gbs", type=positive_int, metavar="N", help="global batch (default: --current's, the "
                                                                    "profile's or the model's)")
    data.add_argument("--mbs", metavar="N[,N...]", help="global micro-batch sizes to try (default: every divisor "
                                                         "of the global batch)")
    data.add_argument("--seq-length", type=positive_int, metavar="N", help="sequence length (default: the model's)")
    data.add_argument("--frozen", metavar="NAME[,NAME]", help="encoders that do not train")
    data.add_argument("--steps", type=positive_int, default=4, help="global batches drawn to price (default 4)")
    data.add_argument("--seed", type=nonnegative_int, default=0)
    out = p.add_argument_group("output")
    out.add_argument("--objective", choices=OBJECTIVES, default="throughput",
                     help="throughput: the job's samples/s (ties by tokens/s per GPU); per-gpu: tokens/s per "
                          "active GPU, the tutorial's metric")
    out.add_argument("--top", type=positive_int, default=5, help="layouts shown per table (default 5)")
    out.add_argument("--current", metavar="SPEC",
                     help="the layout run today, priced beside them: 'images=tp1,pp1,dp1 language=tp4,pp2,dp2 mbs=2 "
                          "gbs=32' or a preset (reference-27b)")
    out.add_argument("--all", dest="include_unfit", action="store_true",
                     help="also list the layouts that do not fit, and why")
    out.add_argument("--json", metavar="FILE", help="write the answer (format mimo-accel-layout/1)")
    return p


def _sizes(text: str | None) -> list[int] | None:
    if text is None:
        return None
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise UsageError(f"--mbs {text}: give global micro-batch sizes as positive whole numbers, e.g. 2 or 2,4,8")
    return values


def _checked(args) -> dict:
    """The advise() options of a command line, every input checked before any work."""
    output_file("--json", args.json)
    if args.model is None and args.profile is None:
        raise UsageError(f"give --model (a preset: {', '.join(PRESETS)}, or a YAML model file) or --from DIR (a "
                         "profiled run)")
    if args.profile is not None and not Path(args.profile).is_dir():
        raise UsageError(f"--from {args.profile}: no such directory; give the DIR of a job run with profile=DIR")
    for flag, path in (("--calibration", args.calibration), ("--index", args.index)):
        if path is not None and not Path(path).is_file():
            raise UsageError(f"{flag} {path}: no such file")
    if args.model is not None and args.model not in PRESETS and not Path(args.model).is_file():
        raise UsageError(f"--model {args.model}: no such preset or file; give one of {', '.join(PRESETS)}, or a YAML "
                         "model file")
    if args.workload is not None and args.index is not None:
        raise UsageError("--workload and --index both give the samples; give one")
    if args.rehearsal and args.index is not None:
        raise UsageError("--rehearsal draws a workload's [rehearsal] samples; drop it with --index")
    if args.gpus is None and args.profile is None:
        raise UsageError("give --gpus N, the GPU budget")
    current = parse_layout(args.current, "--current") if args.current is not None else None
    if args.gbs is not None and current is not None and current.gbs != args.gbs:
        raise UsageError(f"--gbs {args.gbs} and --current's gbs={current.gbs} differ; give one global batch")
    workload = None
    if args.workload is not None:
        from mimo_accel.workloads import load_profile

        workload = load_profile(args.workload)
    frozen = tuple(f for f in (args.frozen or "").split(",") if f)
    source = args.profile if args.profile is not None else args.model
    return dict(source=source, budget=args.gpus, mbs=_sizes(args.mbs), objective=args.objective, top=args.top,
                current=current, include_unfit=args.include_unfit,
                model=args.model if args.profile is not None else None, gpu=args.gpu,
                peak_tflops=args.peak_tflops, memory_gib=args.memory_gib, gpus_per_node=args.gpus_per_node,
                intra_node_gbps=args.intra_node_gbps, inter_node_gbps=args.inter_node_gbps,
                reserve=args.memory_reserve, calibration=args.calibration, workload=workload, index=args.index,
                rehearsal=args.rehearsal, gbs=args.gbs, seq_length=args.seq_length, steps=args.steps, seed=args.seed,
                frozen=frozen, distributed_optimizer=not args.no_distributed_optimizer)


def main(argv: Sequence[str] | None = None, *, console: Console | None = None) -> int:
    """``mimo-accel layout``. Returns 0, or 2 (one ``error:`` line) on bad input."""
    args = parse(_parser(), argv)
    if isinstance(args, int):
        return args
    try:
        options = _checked(args)
        advice = advise(**options)
    except (ProfileError, ValueError, OSError) as e:
        return fail(PROG, e)
    render_advice(advice, console or (Console() if sys.stdout.isatty() else Console(width=200)))
    if args.json:
        Path(args.json).write_text(json.dumps(advice.to_doc(), indent=2, allow_nan=False) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
