"""``mimo-accel layout``: the command line, checked, into a :class:`~mimo_accel.tools.layout.problem.Request`
and a :class:`~mimo_accel.tools.layout.advice.Search`. With a budget (``--gpus``, or a profile's) it
searches and recommends; with ``--current SPEC`` alone it prices that layout: what the job will do.
``mimo-accel simulate --layout SPEC`` is the latter, spelled as before."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console

from mimo_accel.tools.arguments import UsageError, fail, nonnegative_int, output_file, parse, peak_tflops, positive_int
from mimo_accel.tools.layout.advice import ADVICE_FORMAT, MAX_BUDGET, Objective, Search, advise, price
from mimo_accel.tools.layout.console import render_advice, render_row
from mimo_accel.tools.layout.continuation import continuation, render_continuation
from mimo_accel.tools.layout.machine import CPU, GPUS
from mimo_accel.tools.layout.memory import RECOMPUTE, JobSettings
from mimo_accel.tools.layout.models import MODEL_PRESETS
from mimo_accel.tools.layout.problem import DEFAULT_STEPS, MAX_STEPS, DataRequest, MachineRequest, Request, build
from mimo_accel.tools.layout.spec import LAYOUT_PRESETS, parse_layout
from mimo_accel.workloads import ProfileError

PROG = "mimo-accel layout"


def _number(low: float, high: float, what: str):
    def check(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}") from None
        if not low <= value < high:
            raise argparse.ArgumentTypeError(f"must be {what}, got {text}")
        return value
    return check


def _at_most(top: int, what: str):
    def check(text: str) -> int:
        value = positive_int(text)
        if value > top:
            raise argparse.ArgumentTypeError(f"{value} is more than {top} {what}; give at most {top}")
        return value
    return check


def _parser(prog: str = PROG, current_flag: str = "--current") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog,
        description=f"What a MegatronMIMO job will do and what it should run: the current layout ({current_flag}) "
                    "priced with mimo_accel's step model under upstream as shipped, upstream's own packing and "
                    "mimo_accel; with a GPU budget, every non-colocated layout that fits (each module's TP/PP/DP, "
                    "the language model's PP split, the micro-batch), best first, and the settings of the "
                    "recommended one (a change only where it is faster on every draw).")
    src = p.add_argument_group("costs and model")
    src.add_argument("--model", metavar="NAME|FILE",
                     help=f"the model: a preset ({', '.join(MODEL_PRESETS)}, the default) or a YAML model file; with "
                          "--from, it replaces the configs the profile holds")
    src.add_argument("--from", dest="profile", metavar="DIR",
                     help="a profiled run (MIMO_ACCEL=profile, a few steps on your GPUs): its learnt costs, module "
                          "configs, parallel sizes, GPUs, batch; without it an encoder is priced from its FLOPs, "
                          "which is not its GPU cost")
    mach = p.add_argument_group("machine")
    mach.add_argument("--gpus", type=_at_most(MAX_BUDGET, "GPUs"), metavar="N",
                      help="the GPU budget: search and recommend (default: the profiled run's)")
    mach.add_argument("--gpu", metavar="NAME", help=f"the GPU: {', '.join([*GPUS, CPU])} (cpu: the rehearsal's "
                                                    "CPU ranks, memory unbounded, communication 0); default h100, "
                                                    "or the profiled run's device")
    mach.add_argument("--gpus-per-node", type=_at_most(64, "GPUs a node"), default=8, metavar="N",
                      help="GPUs a node (default 8)")
    mach.add_argument("--peak-tflops", type=peak_tflops, metavar="T", help="dense BF16 TFLOP/s per GPU (the table's)")
    mach.add_argument("--memory-gib", type=_number(1e-9, float("inf"), "a number > 0"), metavar="G",
                      help="memory per GPU in GiB (the table's)")
    mach.add_argument("--intra-node-gbps", type=_number(1e-9, float("inf"), "a number > 0"), metavar="B",
                      help="NVLink GB/s per GPU and direction")
    mach.add_argument("--inter-node-gbps", type=_number(1e-9, float("inf"), "a number > 0"), metavar="B",
                      help="network GB/s per GPU")
    mach.add_argument("--memory-reserve", type=_number(0, 1, "a share in [0, 1), e.g. 0.1"), metavar="F",
                      help="share of each GPU's memory kept free for what the estimate leaves out (default 0.1)")
    job = p.add_argument_group("the job's settings (default: upstream's Qwen3.5-VL MIMO launcher's, or the "
                               "profiled run's)")
    job.add_argument("--sequence-parallel", action=argparse.BooleanOptionalAction, default=None,
                     help="sequence parallelism on / off (the launcher: off)")
    job.add_argument("--recompute", choices=RECOMPUTE, help="activation recompute (the launcher: none)")
    job.add_argument("--distributed-optimizer", action=argparse.BooleanOptionalAction, default=None,
                     help="optimizer states sharded over DP (6 + 12/dp bytes a parameter; the launcher: on) or not (18)")
    job.add_argument("--fp32", dest="precision", action="store_const", const="fp32",
                     help="fp32 training (the launcher's --fp32), not bf16")
    job.add_argument("--bf16", dest="precision", action="store_const", const="bf16", help="bf16 training (the launcher's)")
    data = p.add_argument_group("data")
    data.add_argument("--workload", metavar="NAME|PATH", help="workload profile the steps are drawn from "
                                                               "(default receipts)")
    data.add_argument("--index", metavar="FILE", help="a `mimo-accel index` cost index the steps are drawn from")
    data.add_argument("--rehearsal", action="store_true", help="draw the workload's CPU-sized [rehearsal] samples "
                                                               "(to price with a CPU rehearsal's profile)")
    data.add_argument("--gbs", type=positive_int, metavar="N", help=f"global batch (default: {current_flag}'s, the "
                                                                    "profile's or the model's)")
    data.add_argument("--mbs", metavar="N[,N...]", help="global micro-batch sizes to try (default: every divisor "
                                                         "of the global batch)")
    data.add_argument("--seq-length", type=positive_int, metavar="N", help="sequence length (default: the model's)")
    data.add_argument("--frozen", metavar="NAME[,NAME]", help="encoders that do not train")
    data.add_argument("--steps", type=_at_most(MAX_STEPS, "draws"), default=DEFAULT_STEPS,
                      help=f"global batches drawn, each a draw every layout is priced on (default {DEFAULT_STEPS})")
    data.add_argument("--seed", type=nonnegative_int, default=0)
    out = p.add_argument_group("output")
    out.add_argument("--objective", choices=[o.value for o in Objective], default=Objective.THROUGHPUT.value,
                     help="throughput: the job's samples/s (ties by tokens/s per GPU); per-gpu: tokens/s per "
                          "active GPU, the tutorial's metric")
    out.add_argument("--top", type=positive_int, default=5, help="layouts shown per table (default 5)")
    out.add_argument(current_flag, dest="current", metavar="SPEC",
                     help="the layout run today: 'images=tp1,pp1,dp1 language=tp4,pp2,dp2 mbs=2 gbs=32' or a preset "
                          f"({', '.join(LAYOUT_PRESETS)}); alone, it is priced; with a budget, beside the others")
    out.add_argument("--all", dest="include_unfit", action="store_true",
                     help="also list the layouts that do not fit, and why")
    out.add_argument("--json", metavar="FILE", help=f"write the answer (format {ADVICE_FORMAT})")
    return p


def _sizes(text: str | None) -> tuple[int, ...] | None:
    if text is None:
        return None
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise UsageError(f"--mbs {text}: give global micro-batch sizes as positive whole numbers, e.g. 2 or 2,4,8")
    return tuple(values)


def request_of(args, current_flag: str = "--current") -> tuple[Request, Search]:
    """The request and the search of a command line, every input checked before any work
    (``current_flag``: what the layout's flag is called where the error names it)."""
    output_file("--json", args.json)
    if args.profile is not None and not Path(args.profile).is_dir():
        raise UsageError(f"--from {args.profile}: no such directory; give the DIR of a job run with profile=DIR")
    if args.index is not None and not Path(args.index).is_file():
        raise UsageError(f"--index {args.index}: no such file")
    if args.model is not None and args.model not in MODEL_PRESETS and not Path(args.model).is_file():
        raise UsageError(f"--model {args.model}: no such preset or file; give one of {', '.join(MODEL_PRESETS)}, or a "
                         "YAML model file")
    if args.workload is not None and args.index is not None:
        raise UsageError("--workload and --index both give the samples; give one")
    if args.rehearsal and args.index is not None:
        raise UsageError("--rehearsal draws a workload's [rehearsal] samples; drop it with --index")
    if args.gpus is None and args.profile is None and args.current is None:
        raise UsageError(f"give --gpus N (the GPU budget: search), or {current_flag} SPEC (price the layout run today)")
    current = parse_layout(args.current, current_flag) if args.current is not None else None
    if args.gbs is not None and current is not None and current.gbs != args.gbs:
        raise UsageError(f"--gbs {args.gbs} and {current_flag}'s gbs={current.gbs} differ; give one global batch")
    model = args.model
    if model is None and current is not None and current.preset is not None and args.profile is None:
        model = LAYOUT_PRESETS[current.preset][1]
    given = {k: v for k, v in (("sequence_parallel", args.sequence_parallel), ("recompute", args.recompute),
                               ("distributed_optimizer", args.distributed_optimizer), ("precision", args.precision))
             if v is not None}  # each over the profile's (or the launcher's) where given
    settings = JobSettings(**given, source="the command line") if given else JobSettings()
    request = Request(
        model=model, profile=args.profile,
        machine=MachineRequest(args.gpu, args.peak_tflops, args.memory_gib, args.gpus_per_node, args.intra_node_gbps,
                               args.inter_node_gbps, args.memory_reserve),
        data=DataRequest(args.workload, args.index, args.rehearsal, args.gbs or (current.gbs if current else None),
                         args.seq_length or (current.seq_length if current else None), args.steps, args.seed),
        frozen=tuple(f for f in (args.frozen or "").split(",") if f), settings=settings, settings_given=tuple(given))
    return request, Search(args.gpus, _sizes(args.mbs), Objective(args.objective), args.top, current,
                           args.include_unfit)


def main(argv: Sequence[str] | None = None, *, console: Console | None = None, prog: str = PROG,
         current_flag: str = "--current") -> int:
    """``mimo-accel layout`` (``prog``: the command that asks). Returns 0, or 2 (one ``error:`` line) on bad input."""
    args = parse(_parser(prog, current_flag), argv)
    if isinstance(args, int):
        return args
    try:
        request, search = request_of(args, current_flag)
        problem = build(request)
        if search.budget is None and problem.gpus is None:
            row = price(search.current, problem)
            doc = {"format": ADVICE_FORMAT, "current": row.to_doc(), "assumptions": problem.settings.to_doc(),
                   "data": {"source": problem.draws.source, "gbs": problem.gbs, "steps": problem.draws.steps},
                   "costs": {"source": problem.seconds.describe()}, "notes": list(problem.notes)}
            show = lambda c: render_row(row, problem, c)  # noqa: E731
        else:
            advice = advise(problem, search)
            doc, show = advice.to_doc(), lambda c: render_advice(advice, c)  # noqa: E731
            if request.profile is not None:  # the profiled run, continued on the recommended layout
                way = continuation(request.profile, advice.recommended, advice.current)
                doc["continue"], advised = way.to_doc(), show
                show = lambda c: (advised(c), render_continuation(way, c))  # noqa: E731
    except (ProfileError, ValueError, OSError) as e:
        return fail(prog, e)
    show(console or (Console() if sys.stdout.isatty() else Console(width=200)))
    if args.json:
        Path(args.json).write_text(json.dumps(doc, indent=2, allow_nan=False) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
