"""What every ``mimo-accel rehearse`` prints and writes: where its ranks run, its output directory
and log, its progress bars, and the losses side by side before the report."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Optional

from mimo_accel_dev.rehearse import rehearsal


def cpus_for_ranks(pin_one_cpu: bool, console) -> Optional[tuple[int, ...]]:
    """The CPUs the ranks are pinned to (None: not pinned), said on the console."""
    cpus = rehearsal.one_cpu() if pin_one_cpu else None
    if cpus:
        console.print(f"all ranks on CPU {cpus[0]} (thread-CPU times comparable across ranks; "
                      "--all-cpus spreads them)", highlight=False)
    return cpus


def start_output(out_dir, log_path, title: str, console, banner) -> tuple[Path, Path]:
    """The rehearsal's output directory and log file (started with ``title``); says both on the
    console (``banner(out)`` first)."""
    out = Path(out_dir or tempfile.mkdtemp(prefix="mimo-accel-rehearsal-"))
    out.mkdir(parents=True, exist_ok=True)
    log = Path(log_path) if log_path else out / "rehearsal.log"
    log.write_text(f"{title}, {time.strftime('%Y-%m-%d %H:%M:%S')}\n"
                   "(third-party import output, then each run's rank logs)\n", encoding="utf-8")
    console.print(banner(out))
    console.print(f"third-party warnings and rank logs: {log}", highlight=False, soft_wrap=True)
    return out, log


def progress_bar(console):
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total} steps"),
                    TimeElapsedColumn(), console=console, transient=False)


def compare_and_report(console, title: str, unit: str, rows, out: Path, before_label: str, before_note: str,
                       cost_note: str, elapsed: float, peak_tflops: Optional[float] = None,
                       floor: Optional[Path] = None, after_label: str = "accelerated") -> dict:
    """Print the losses side by side (rows: name, before loss sum, tokens, after loss sum, tokens),
    refusing different token counts or losses, then the report of the runs ``out/before_label`` and
    ``out/after_label`` (with the machine's ``floor``, an equal-work run's profile); returns the
    report document."""
    from rich.table import Table

    from mimo_accel.profiler.run import read_run
    from mimo_accel.tools import report

    losses = Table(title=title)
    for col in (unit, f"{before_label} loss", "accelerated loss", "tokens", "rel. diff"):
        losses.add_column(col, justify="right")
    worst = 0.0
    for name, lb, tb, la, ta in rows:
        if tb != ta:
            raise rehearsal.InvariantViolation(f"{unit} {name}: {tb} loss tokens before vs {ta} after")
        rel = abs(la - lb) / max(abs(lb), 1e-12)
        worst = max(worst, rel)
        losses.add_row(name, f"{lb / tb:.6f}", f"{la / ta:.6f}", f"{int(tb)}", f"{rel:.1e}")
    console.print(losses)
    if worst > 1e-2:
        raise rehearsal.InvariantViolation(f"per-{unit} losses differ by {worst:.1e} relative: not the same "
                                           "computation")
    doc = report.build(read_run(out / before_label), read_run(out / after_label), peak_tflops=peak_tflops,
                       floor=read_run(floor) if floor is not None else None)
    report.render(doc["before"], doc["after"], console=console)
    console.print(f"before = {before_label}: {before_note}. Plan costs: {cost_note}. "
                  f"Wall time of the rehearsal: {elapsed:.0f}s.")
    return doc
