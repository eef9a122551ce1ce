"""``mimo-accel report RUN_DIR [RUN_DIR ...] [--run ID] [--floor DIR] [--json PATH] [--html PATH]
[--png PATH] [--warmup N] [--peak-tflops T]``:
the report document (:func:`build`), its JSON, and the command."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console

from mimo_accel.profiler.run import MixedRuns, ProfileError, Run, UnknownRun, read_run
from mimo_accel.profiler import json_safe
from mimo_accel.tools.arguments import (UsageError, add_peak_option, fail, nonnegative_int, output_file, parse,
                                        require_extra)
from mimo_accel.tools.report.charts import write_png
from mimo_accel.tools.report.comparison import compare
from mimo_accel.tools.report.console import render_runs, sides_of
from mimo_accel.tools.report.floor import floor_of, with_floor
from mimo_accel.tools.report.html import write_html
from mimo_accel.tools.report.like import gains, verdict, warnings
from mimo_accel.tools.report.summary import REPORT_FORMAT, summarize


# --------------------------------------------------------------------------------------- main


PROG = "mimo-accel report"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Report profiler runs (directories of rank<N>.jsonl): one run, before vs after, or several runs "
                    "in order, each over the one before it (one feature added a run shows each feature's gain).",
    )
    p.add_argument("runs", metavar="RUN_DIR", nargs="+",
                   help="profile directory; two or more: compared in the order given (the first is the baseline)")
    p.add_argument("--run", metavar="ID", action="append", default=[],
                   help="of a directory holding the rank files of several runs, report the run ID (its id or the "
                        "start of it, as the refusal names them); repeat for several directories")
    p.add_argument("--json", metavar="PATH", help="write the statistics as JSON")
    p.add_argument("--html", metavar="PATH", help="write the report as HTML")
    p.add_argument("--png", metavar="PATH", help="write charts (needs matplotlib)")
    p.add_argument("--warmup", metavar="N", type=nonnegative_int, default=1,
                   help="exclude the first N steps (default 1)")
    p.add_argument("--floor", metavar="DIR",
                   help="profile of a run where every replica trained the same samples (the example's --equal-work): "
                        "its straggler, the machine's floor, beside each module's")
    add_peak_option(p)
    return p


def build(before: Run, after: Run | None = None, *, warmup: int = 1,
          peak_tflops: float | None = None, floor: Run | None = None) -> dict[str, Any]:
    """The JSON document of a report of ``before`` (and ``after``): :func:`build_runs`."""
    return build_runs([r for r in (before, after) if r is not None], warmup=warmup, peak_tflops=peak_tflops,
                      floor=floor)


def build_runs(runs: Sequence[Run], *, warmup: int = 1, peak_tflops: float | None = None,
               floor: Run | None = None) -> dict[str, Any]:
    """The JSON document of a report of ``runs``, in order: ``{format, before, after, change, verdict,
    gains, warnings}`` — ``before`` the first run's summary, ``after`` the last one's (null for one run),
    ``change`` after / before of the headline figures, ``verdict`` the one line the console prints,
    ``gains`` each run's over the one before it and over the first (:func:`~.like.gains`); of three
    runs or more, ``runs``: every run's summary in order. With an equal-work run, ``floor``
    (:mod:`~mimo_accel.tools.report.floor`). ``peak_tflops``: what MFU is over (default: the device
    table's peak of the GPU each profile names)."""
    summaries = [summarize(r, warmup=warmup, peak_tflops=peak_tflops) for r in runs]
    sides = sides_of(*summaries)
    first, last = summaries[0], summaries[-1]
    two_or_more = len(summaries) > 1
    doc = {"format": REPORT_FORMAT, "before": first, "after": last if two_or_more else None,
           "change": compare(first, last)["change"] if two_or_more else None, "verdict": verdict(sides),
           "gains": gains(sides) if two_or_more else [], "warnings": warnings(sides)}
    if len(summaries) > 2:
        doc["runs"] = summaries
    return with_floor(doc, floor_of(floor, warmup=warmup) if floor is not None else None)


def write_json(path: str | Path, doc: dict[str, Any], **extra: Any) -> None:
    """Write a report document (:func:`build`) as strict JSON, its keys at the top level, with
    ``extra`` fields beside them (``mimo-accel rehearse`` adds its own). Non-finite floats become
    null; an ``extra`` key that is already a report key is refused."""
    clash = sorted(set(extra) & set(doc))
    if clash:
        raise ValueError(f"report JSON: extra fields {clash} would replace report keys")
    text = json.dumps(json_safe({**doc, **extra}), indent=2, allow_nan=False, default=str)
    Path(path).write_text(text + "\n", encoding="utf-8")


def _read(directory: str, runs: list[str]) -> Run:
    """The run in ``directory``: all its rank files, or, where they belong to several runs, the one
    of ``runs`` that names one of them (a directory of one run ignores ``runs``)."""
    try:
        return read_run(directory)
    except MixedRuns as mixed:
        for run in runs:
            try:
                return read_run(directory, run=run)
            except UnknownRun:
                continue
        if runs:
            raise ProfileError(f"{mixed}; --run {', '.join(runs)} names none of them") from None
        raise


def main(argv: Sequence[str] | None = None, *, console: Console | None = None) -> int:
    """``mimo-accel report``. Returns 0, or 2 (one ``mimo-accel report: error:`` line) on a bad command
    line, an input without readable data or of several runs, or a failed export."""
    args = parse(_parser(), argv)
    if isinstance(args, int):
        return args
    try:
        for flag in ("--json", "--html", "--png"):
            output_file(flag, getattr(args, flag[2:]))
        if args.png:
            require_extra("--png", "matplotlib", "charts")
        runs = [_read(d, args.run) for d in args.runs]
        floor = _read(args.floor, args.run) if args.floor else None
    except (UsageError, ProfileError) as e:
        return fail(PROG, e)
    doc = build_runs(runs, warmup=args.warmup, peak_tflops=args.peak_tflops, floor=floor)
    for w in doc["warnings"]:
        print(f"mimo-accel report: warning: {w}", file=sys.stderr)

    render_runs(doc.get("runs") or [s for s in (doc["before"], doc["after"]) if s is not None], console=console,
                said=doc["warnings"])

    if args.json:
        write_json(args.json, doc)
    if args.html:
        for w in write_html(doc, args.html):
            print(f"mimo-accel report: warning: {w}", file=sys.stderr)
    if args.png:
        try:
            write_png(sides_of(*(doc.get("runs") or (doc["before"], doc["after"]))), args.png)
        except RuntimeError as e:
            return fail(PROG, e)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
