"""What every ``mimo-accel rehearse`` prints and writes: where its ranks run, its output directory
and log, its progress bars, and the losses side by side before the report."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Optional

from mimo_accel.costs.online import SCALE_ONLY  # a refit that only put the start in seconds
from mimo_accel_dev.rehearse import rehearsal

#: The largest relative difference between two runs' per-step losses that still counts as the same
#: computation (the same samples, weights and math, summed in another order).
LOSS_TOLERANCE = 1e-2


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
    if worst > LOSS_TOLERANCE:
        raise rehearsal.InvariantViolation(f"per-{unit} losses differ by {worst:.1e} relative: not the same "
                                           "computation")
    doc = report.build(read_run(out / before_label), read_run(out / after_label), peak_tflops=peak_tflops,
                       floor=read_run(floor) if floor is not None else None)
    report.render_runs([doc["before"], doc["after"]], console, said=doc["warnings"])  # the floor's warnings too
    console.print(f"before = {before_label}: {before_note}. Plan costs: {cost_note}. "
                  f"Wall time of the rehearsal: {elapsed:.0f}s.")
    return doc


# ------------------------------------------------------------------------- the demo's headline



def first_calibrated_plan(refits: list) -> Optional[int]:
    """The first iteration planned with a cost learnt while training: the earliest ``announced_for``
    of an accepted refit that learnt coefficients (not one that only put the start in seconds)."""
    planned = [r["announced_for"] for r in refits if r.get("announced_for") is not None
               and r.get("accepted", True) and not str(r.get("reason", "")).startswith(SCALE_ONLY)]
    return min(planned) if planned else None


def _median(values: list) -> Optional[float]:
    import statistics

    return statistics.median(values) if values else None


def headline(doc: dict, peer: Optional[dict], module: str = "vision") -> dict:
    """What ``make demo`` closes with: each module's straggler p50 beside the machine's floor (the
    gap), and ``module``'s straggler in the steps before mimo_accel's first calibrated plan (the
    first steps, planned from the start model), mimo_accel's against upstream's and the peer's in
    the same steps (a step's number is its iteration − 1: the profiler's count)."""
    after = doc["after"]
    floor = (doc.get("floor") or {}).get("modules") or {}
    gaps = {}
    for m in after.get("module_order", []):
        p50 = (after.get("per_module", {}).get(m) or {}).get("max_over_mean_p50")
        if p50 is not None:
            gaps[m] = {"p50": p50, "floor": floor.get(m), "gap": p50 - floor[m] if m in floor else None}
    first = first_calibrated_plan((after.get("online_calibration") or {}).get("refits") or [])
    sides = {"upstream": doc.get("before"), "mimo_accel": after, **({"peer": peer} if peer else {})}
    series = {}
    for name, side in sides.items():
        s = ((side or {}).get("series") or {}).get("modules", {}).get(module) or {}
        series[name] = dict(zip(s.get("step", []), s.get("max_over_mean", [])))
    steps = sorted(s for s in series["mimo_accel"] if first is None or s + 1 < first)
    medians = {name: _median([v[s] for s in steps if s in v]) for name, v in series.items()}
    return {"modules": gaps, "first_steps": {"module": module, "first_calibrated_plan": first,
                                             "iterations": [s + 1 for s in steps], "straggler_p50": medians}}


def headline_lines(head: dict, peer_name: Optional[str]) -> list[str]:
    """The closing lines of :func:`headline`'s figures."""
    parts = []
    for m, v in head["modules"].items():
        floor = (f", {v['gap']:+.3f} from this machine's floor ({v['floor']:.3f})" if v["gap"] is not None
                 else " (no floor measured)")
        parts.append(f"{m} straggler p50 {v['p50']:.3f}{floor}")
    lines = ["mimo_accel: " + "; ".join(parts) + "."]
    first = head["first_steps"]
    its, med = first["iterations"], first["straggler_p50"]
    if its and med.get("mimo_accel") is not None:
        span = f"iterations {its[0]}-{its[-1]}"
        when = (f"before its first calibrated plan ({span}, planned from the start model)"
                if first["first_calibrated_plan"] is not None else f"with no calibrated plan ({span})")
        peer = f", {peer_name} {med['peer']:.3f}" if peer_name and med.get("peer") is not None else ""
        upstream = f", upstream as shipped {med['upstream']:.3f}" if med.get("upstream") is not None else ""
        lines.append(f"{first['module']} straggler p50 {when}: mimo_accel {med['mimo_accel']:.3f}{peer}{upstream}.")
    return lines
