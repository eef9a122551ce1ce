"""Before/after report of profiler runs: rich tables, JSON/HTML export, PNG charts.

``mimo-accel report BEFORE_DIR [AFTER_DIR] [--json PATH] [--html PATH] [--png PATH] [--warmup N]``

Definitions (also in the JSON, per side):

* **vision time** of a rank in a step: ``vision_fwd_s + vision_bwd_s`` (a missing part counts 0).
* **vision replica**: the vision ranks with the same ``dp_rank`` (TP/PP peers); its time in a step is
  the max over its ranks.
* **straggler ratio** (``vision_max_over_mean``) of a step: max / mean of the replica times, over
  the steps every replica logged; reported as p50 / p99 / mean over steps. 1.0 is perfect balance.
* **slowest replica**: the replica with the max time in a step (ties are nobody's); the report
  names the replica slowest most often and in what share of the steps (like Megatron's
  StragglerDetector and HTA).
* **step time** of a step: the max ``step_time_s`` (wall) over the ranks that logged it.
* **throughput** (``samples_per_s``): global samples over all counted steps / their summed step
  time. Global samples of a step = sum over the DP replicas of one module (the language module if
  present, else vision) of the replica's ``samples``.
* per-rank I/O (``samples_read``, ``bytes_read``, ``bytes_exchanged``): mean per counted step.
* The first ``--warmup`` step numbers (default 1) are excluded from every statistic.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from mimo_accel.profiler import NoProfileData, Run, read_run
from mimo_accel.profiler import json_safe
from mimo_accel.profiler import record_number as _num

__all__ = ["REPORT_FORMAT", "STABLE_KEYS", "build", "compare", "main", "render", "summarize", "write_json",
           "write_png"]

REPORT_FORMAT = "mimo-accel-report/1"

# The keys of a side (``before`` / ``after``) that scripts may rely on across versions. A JSON file
# of this format (``mimo-accel report --json``, ``mimo-accel rehearse --json``) has ``format``,
# ``before``, ``after``, ``change`` and ``warnings`` at its top level.
STABLE_KEYS = ("vision_max_over_mean_p50", "vision_max_over_mean_p99", "step_time_p50", "step_time_p99",
               "samples_per_s", "samples_read_per_rank")

# metric key -> (label, kind, lower_is_better); kind picks the formatter.
_SUMMARY_ROWS: tuple[tuple[str, str, str, bool], ...] = (
    ("step_time_p50", "step time p50", "s", True),
    ("step_time_p90", "step time p90", "s", True),
    ("step_time_p99", "step time p99", "s", True),
    ("samples_per_s", "throughput (samples/s)", "rate", False),
    ("vision_max_over_mean_p50", "vision straggler max/mean p50", "ratio", True),
    ("vision_max_over_mean_p99", "vision straggler max/mean p99", "ratio", True),
    ("vision_max_over_mean_mean", "vision straggler max/mean, mean", "ratio", True),
    ("predicted_spread_mean", "vision straggler the plan predicted, mean", "ratio", True),
    ("vision_time_mean", "vision time per rank, mean", "s", True),
    ("vision_max_mean", "vision time of slowest replica, mean", "s", True),
    ("samples_read_per_step", "samples read per step, all ranks", "count", True),
    ("bytes_read_per_step", "bytes read per step, all ranks", "bytes", True),
    ("bytes_exchanged_per_step", "bytes exchanged per step, all ranks", "bytes", True),
)
_CHANGE_KEYS = (*(k for k, *_ in _SUMMARY_ROWS), "step_time_mean")


# ------------------------------------------------------------------------------------ numbers


def _pct(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    # linear interpolation between closest ranks (numpy's default), without numpy
    pos = (len(s) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _stats(values: Sequence[float]) -> dict[str, float | int | None]:
    return {
        "n": len(values),
        "mean": _mean(values),
        "p50": _pct(values, 50),
        "p90": _pct(values, 90),
        "p99": _pct(values, 99),
        "max": max(values) if values else None,
    }


def _vision_time(rec: dict[str, Any]) -> float | None:
    fwd, bwd = _num(rec, "vision_fwd_s"), _num(rec, "vision_bwd_s")
    if fwd is None and bwd is None:
        return None
    return (fwd or 0.0) + (bwd or 0.0)


# ---------------------------------------------------------------------------------- summarize


def summarize(run: Run, *, warmup: int = 1) -> dict[str, Any]:
    """Statistics of one run (see the module docstring for definitions). JSON-serialisable."""
    warnings = list(run.warnings)
    all_steps = sorted({int(r["step"]) for log in run.ranks.values() for r in log.steps})
    skipped: list[int] = []
    if warmup > 0:
        if len(all_steps) > warmup:
            skipped = all_steps[:warmup]
        else:
            warnings.append(f"only {len(all_steps)} step(s) recorded; warm-up step(s) not excluded")
    skip = set(skipped)
    steps_of: dict[int, dict[int, dict[str, Any]]] = {
        rank: {int(r["step"]): r for r in log.steps if int(r["step"]) not in skip} for rank, log in run.ranks.items()
    }
    modules: dict[str, list[int]] = defaultdict(list)
    for rank in sorted(run.ranks):
        modules[run.ranks[rank].module].append(rank)

    # ---- step time
    step_time: dict[int, float] = {}
    for recs in steps_of.values():
        for s, r in recs.items():
            t = _num(r, "step_time_s")
            if t is not None:
                step_time[s] = max(step_time.get(s, 0.0), t)
    counted = sorted(step_time)
    st_values = [step_time[s] for s in counted]

    # ---- vision
    vision_ranks = list(modules.get("vision", []))
    if not vision_ranks:
        vision_ranks = [r for r, recs in steps_of.items() if any(_vision_time(x) is not None for x in recs.values())]
        if vision_ranks:
            warnings.append(
                f"no rank header says module='vision'; using the ranks that timed the vision encoder: {vision_ranks}"
            )
    vision_per_rank: dict[str, Any] = {}
    for rank in vision_ranks:
        recs = steps_of[rank].values()
        vt = [v for r in recs if (v := _vision_time(r)) is not None]
        fwd = [v for r in recs if (v := _num(r, "vision_fwd_s")) is not None]
        bwd = [v for r in recs if (v := _num(r, "vision_bwd_s")) is not None]
        vision_per_rank[str(rank)] = {
            **_stats(vt),
            "dp_rank": run.ranks[rank].dp_rank,
            "fwd_mean": _mean(fwd),
            "bwd_mean": _mean(bwd),
        }
    timed_ranks = [r for r in vision_ranks if vision_per_rank[str(r)]["n"]]
    if vision_ranks and not timed_ranks:
        warnings.append("the vision ranks recorded no vision_fwd_s/vision_bwd_s; vision statistics unavailable")

    replicas: dict[int, list[int]] = defaultdict(list)
    for rank in timed_ranks:
        replicas[run.ranks[rank].dp_rank].append(rank)
    replica_time: dict[int, dict[int, float]] = {}
    for dp, ranks in replicas.items():
        per_step: dict[int, float] = {}
        for rank in ranks:
            for s, r in steps_of[rank].items():
                v = _vision_time(r)
                if v is not None:
                    per_step[s] = max(per_step.get(s, 0.0), v)
        replica_time[dp] = per_step
    common = sorted(set.intersection(*(set(t) for t in replica_time.values()))) if replica_time else []
    if replica_time and len(common) < max(len(t) for t in replica_time.values()):
        warnings.append(
            f"vision replicas logged different steps; straggler statistics use the {len(common)} step(s) all "
            f"{len(replica_time)} replica(s) logged"
        )
    vision_dp_size = max((run.ranks[r].dp_size for r in vision_ranks), default=0)
    if replica_time and len(replica_time) < vision_dp_size:
        warnings.append(
            f"only {len(replica_time)} of {vision_dp_size} vision DP replicas have data; the straggler ratio "
            "covers those present"
        )
    ratios: list[float] = []
    maxes: list[float] = []
    slow_counts: dict[int, int] = defaultdict(int)
    ties = 0
    order = sorted(replica_time)
    for s in common:
        times = [replica_time[dp][s] for dp in order]
        m, mx = sum(times) / len(times), max(times)
        maxes.append(mx)
        if m > 0:
            ratios.append(mx / m)
        if len(times) > 1:
            if mx - min(times) <= 1e-12 * max(mx, 1e-30):
                ties += 1
            else:
                slow_counts[order[times.index(mx)]] += 1
    slowest = None
    if slow_counts and common:
        dp = max(sorted(slow_counts), key=lambda d: slow_counts[d])
        slowest = {
            "rank": min(replicas[dp]),
            "ranks": sorted(replicas[dp]),
            "dp_rank": dp,
            "fraction": slow_counts[dp] / len(common),
            "steps": len(common),
            "ties": ties,
            "counts": {str(min(replicas[d])): slow_counts[d] for d in sorted(slow_counts)},
        }
    all_vt = [v for rank in timed_ranks for r in steps_of[rank].values() if (v := _vision_time(r)) is not None]

    # ---- samples and throughput
    samples_module = next((m for m in ("language", "vision") if m in modules), None)
    if samples_module is None and modules:
        samples_module = sorted(modules)[0]
    global_samples: dict[str, dict[int, float]] = {}
    for mod, ranks in modules.items():
        by_dp: dict[int, dict[int, float]] = defaultdict(dict)
        for rank in ranks:
            for s, r in steps_of[rank].items():
                v = _num(r, "samples") or 0.0
                by_dp[run.ranks[rank].dp_rank][s] = max(by_dp[run.ranks[rank].dp_rank].get(s, 0.0), v)
        dp_size = max(run.ranks[r].dp_size for r in ranks)
        per_step: dict[int, float] = {}
        for s in counted:
            vals = [d[s] for d in by_dp.values() if s in d]
            if vals:
                per_step[s] = sum(vals) * (dp_size / len(vals) if len(vals) < dp_size else 1.0)
        if len(by_dp) < dp_size and any(per_step.values()):
            warnings.append(
                f"module {mod!r}: {len(by_dp)} of {dp_size} DP replicas have data; its global samples per step are "
                "estimated from those present"
            )
        global_samples[mod] = per_step
    samples_per_s = samples_per_step = None
    if samples_module is not None:
        gs = global_samples[samples_module]
        total = sum(gs.get(s, 0.0) for s in counted)
        if total > 0 and sum(st_values) > 0:
            samples_per_s = total / sum(st_values)
            samples_per_step = total / len(counted)
        else:
            warnings.append("no rank recorded 'samples'; throughput unavailable")
    if "vision" in global_samples and "language" in global_samples:
        v, lang = global_samples["vision"], global_samples["language"]
        differ = [s for s in counted if v.get(s) and lang.get(s) and abs(v[s] - lang[s]) > 1e-9]
        if differ:
            warnings.append(
                f"vision and language ranks count different global samples in {len(differ)} step(s) "
                f"(first: step {differ[0]}: vision {v[differ[0]]:g}, language {lang[differ[0]]:g})"
            )

    # ---- per-rank I/O
    def per_rank(key: str) -> tuple[dict[str, float | None], dict[str, float]]:
        mean, total = {}, {}
        for rank in sorted(run.ranks):
            vals = [_num(r, key) or 0.0 for r in steps_of[rank].values()]
            mean[str(rank)] = _mean(vals)
            total[str(rank)] = sum(vals)
        return mean, total

    samples_read, samples_read_total = per_rank("samples_read")
    bytes_read, bytes_read_total = per_rank("bytes_read")
    bytes_exchanged, bytes_exchanged_total = per_rank("bytes_exchanged")

    def cluster(per: dict[str, float | None]) -> float | None:
        vals = [v for v in per.values() if v is not None]
        return sum(vals) if vals else None

    spreads = [v for recs in steps_of.values() for r in recs.values() if (v := _num(r, "predicted_spread")) is not None]
    header = run.header
    return json_safe(
        {
            "label": run.label,
            "directory": str(run.directory),
            "world_size": run.world_size,
            "ranks_present": sorted(r for r, log in run.ranks.items() if log.steps),
            "modules": {m: rs for m, rs in sorted(modules.items())},
            "layout": run.layout,
            "device": header.get("device"),
            "clock": header.get("clock"),
            "steps_counted": len(counted),
            "warmup_skipped": skipped,
            "step_time_mean": _mean(st_values),
            "step_time_p50": _pct(st_values, 50),
            "step_time_p90": _pct(st_values, 90),
            "step_time_p99": _pct(st_values, 99),
            "samples_module": samples_module,
            "samples_per_step": samples_per_step,
            "samples_per_s": samples_per_s,
            "vision_replicas": len(replica_time),
            "vision_steps": len(common),
            "vision_max_over_mean_p50": _pct(ratios, 50),
            "vision_max_over_mean_p99": _pct(ratios, 99),
            "vision_max_over_mean_mean": _mean(ratios),
            "vision_time_mean": _mean(all_vt),
            "vision_max_mean": _mean(maxes),
            "vision_per_rank": vision_per_rank,
            "slowest": slowest,
            "samples_read_per_rank": samples_read,
            "samples_read_total_per_rank": samples_read_total,
            "bytes_read_per_rank": bytes_read,
            "bytes_exchanged_per_rank": bytes_exchanged,
            "bytes_read_total_per_rank": bytes_read_total,
            "bytes_exchanged_total_per_rank": bytes_exchanged_total,
            "samples_read_per_step": cluster(samples_read),
            "bytes_read_per_step": cluster(bytes_read),
            "bytes_exchanged_per_step": cluster(bytes_exchanged),
            "predicted_spread_mean": _mean(spreads),
            # what a feature said once about the data it got (notices.say_once), in step order
            "notes": list(dict.fromkeys(n for log in run.ranks.values() for r in log.steps
                                        for n in (r.get("notes") or ()) if isinstance(n, str))),
            "series": {
                "step": counted,
                "step_time_s": st_values,
                "vision_step": common,
                "vision_max_over_mean": ratios,
            },
            "warnings": warnings,
        }
    )


def _module_dp(summary: dict[str, Any]) -> dict[str, int]:
    return {m: len(r) for m, r in summary.get("modules", {}).items()}


def compare(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """Relative change (after / before) of the headline metrics, and what makes them not comparable."""
    change = {}
    for key in _CHANGE_KEYS:
        b, a = before.get(key), after.get(key)
        change[key] = (a / b) if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b else None
    warnings = []
    if before.get("layout") != after.get("layout"):
        warnings.append(
            f"before and after have different layouts (before {json.dumps(before.get('layout'), sort_keys=True)}, "
            f"after {json.dumps(after.get('layout'), sort_keys=True)}); the comparison is not like for like"
        )
    if before.get("world_size") != after.get("world_size"):
        warnings.append(f"before has world size {before.get('world_size')}, after {after.get('world_size')}")
    if _module_dp(before) != _module_dp(after) and before.get("layout") == after.get("layout"):
        warnings.append(f"ranks per module differ: before {_module_dp(before)}, after {_module_dp(after)}")
    if before.get("device") != after.get("device"):
        warnings.append(f"before ran on {before.get('device')}, after on {after.get('device')}")
    b_sps, a_sps = before.get("samples_per_step"), after.get("samples_per_step")
    if b_sps and a_sps and abs(b_sps - a_sps) > 1e-9:
        warnings.append(
            f"global samples per step differ (before {b_sps:g}, after {a_sps:g}); "
            "compare throughput rather than step time"
        )
    return {"change": change, "warnings": warnings}


# ------------------------------------------------------------------------------------- render


def _fmt(value: Any, kind: str) -> str:
    if value is None:
        return "—"
    if kind == "s":
        return f"{value * 1e3:.2f} ms" if abs(value) < 1 else f"{value:.3f} s"
    if kind == "ratio":
        return f"{value:.3f}"
    if kind == "rate":
        return f"{value:,.1f}"
    if kind == "count":
        return f"{value:,.1f}" if value != int(value) else f"{int(value):,}"
    if kind == "bytes":
        for unit, div in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
            if abs(value) >= div:
                return f"{value / div:.2f} {unit}"
        return f"{value:.0f} B"
    return str(value)


def _change_text(ratio: float | None, lower_is_better: bool) -> Text:
    if ratio is None:
        return Text("—", style="dim")
    pct = (ratio - 1.0) * 100
    better = ratio < 0.98 if lower_is_better else ratio > 1.02
    worse = ratio > 1.02 if lower_is_better else ratio < 0.98
    style = "green" if better else "red" if worse else ""
    return Text(f"×{ratio:.2f} ({pct:+.0f}%)", style=style)


def _slowest_line(s: dict[str, Any]) -> str:
    slow = s.get("slowest")
    if not slow:
        if s.get("vision_replicas", 0) == 1:
            return "one vision replica: no straggler to name"
        return "no slowest vision replica (no vision timing, or all replicas tied)"
    ranks = slow["ranks"]
    who = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {','.join(map(str, ranks))}"
    return f"vision DP replica {slow['dp_rank']} ({who}) slowest in {slow['fraction']:.0%} of {slow['steps']} steps"


def render(
    before: dict[str, Any],
    after: dict[str, Any] | None = None,
    console: Console | None = None,
) -> None:
    """Print the report of one summary, or of a before/after pair with a change column."""
    console = console or Console()
    two = after is not None
    cmp = compare(before, after) if after is not None else {"change": {}, "warnings": []}
    console.rule("[bold]mimo-accel profile report")

    src = Table(title="Runs", show_header=True, header_style="bold")
    src.add_column("")
    src.add_column("label")
    src.add_column("directory", overflow="fold")
    src.add_column("ranks")
    src.add_column("steps")
    src.add_column("device / clock")
    for name, s in (("before", before), ("after", after)) if two else (("run", before),):
        assert s is not None
        clock = s.get("clock") or {}
        present = len(s.get("ranks_present", []))
        src.add_row(
            name,
            str(s.get("label", "")),
            str(s.get("directory", "")),
            f"{present}/{s.get('world_size') or '?'} "
            + " ".join(f"{m}:{len(r)}" for m, r in s.get("modules", {}).items()),
            f"{s.get('steps_counted', 0)}"
            + (f" (skipped {len(s['warmup_skipped'])} warm-up)" if s.get("warmup_skipped") else ""),
            f"{s.get('device') or '?'} / {clock.get('regions', '?') if isinstance(clock, dict) else clock}",
        )
    console.print(src)

    warnings = [*(f"before: {w}" if two else w for w in before.get("warnings", []))]
    if after is not None:
        warnings += [f"after: {w}" for w in after.get("warnings", [])]
        warnings += cmp["warnings"]
    for w in warnings:
        console.print(Text(f"⚠ {w}", style="yellow"))
    for side, s in (("before", before), ("after", after)):
        for note in (s or {}).get("notes", []):
            console.print(Text(f"note ({side}): {note}" if two else f"note: {note}", style="cyan"))

    table = Table(title="Summary", header_style="bold")
    table.add_column("metric")
    table.add_column("before" if two else "value", justify="right")
    if two:
        table.add_column("after", justify="right")
        table.add_column("after/before", justify="right")
    for key, label, kind, lower in _SUMMARY_ROWS:
        row = [label, _fmt(before.get(key), kind)]
        if after is not None:
            row += [_fmt(after.get(key), kind), _change_text(cmp["change"].get(key), lower)]
        table.add_row(*row)
    console.print(table)
    console.print(f"slowest: {_slowest_line(before)}" if not two else f"slowest before: {_slowest_line(before)}")
    if after is not None:
        console.print(f"slowest after:  {_slowest_line(after)}")

    _render_vision(console, before, after)
    _render_io(console, before, after)


def _render_vision(console: Console, before: dict[str, Any], after: dict[str, Any] | None) -> None:
    ranks = sorted({int(r) for s in (before, after) if s for r in s.get("vision_per_rank", {})})
    if not ranks:
        return
    t = Table(title="Vision encoder time per rank (fwd + bwd per step)", header_style="bold")
    t.add_column("rank", justify="right")
    t.add_column("dp", justify="right")
    sides = [("", before)] if after is None else [("before ", before), ("after ", after)]
    for prefix, _ in sides:
        for stat in ("mean", "p50", "p99"):
            t.add_column(f"{prefix}{stat}", justify="right")
    if after is not None:
        t.add_column("mean after/before", justify="right")
    for rank in ranks:
        row: list[Any] = [str(rank)]
        dp = None
        means = []
        for _, s in sides:
            st = s.get("vision_per_rank", {}).get(str(rank))
            if st:
                dp = st.get("dp_rank")
            means.append(st.get("mean") if st else None)
            row += [_fmt(st.get(k) if st else None, "s") for k in ("mean", "p50", "p99")]
        row.insert(1, "—" if dp is None else str(dp))
        if after is not None:
            b, a = means
            row.append(_change_text(a / b if a is not None and b else None, True))
        t.add_row(*row)
    console.print(t)


def _render_io(console: Console, before: dict[str, Any], after: dict[str, Any] | None) -> None:
    keys = (("samples_read_per_rank", "samples read", "count"), ("bytes_read_per_rank", "bytes read", "bytes"),
            ("bytes_exchanged_per_rank", "bytes exchanged", "bytes"))
    sides = [s for s in (before, after) if s]
    keys = tuple(k for k in keys if any(v for s in sides for v in s.get(k[0], {}).values()))
    if not keys:
        return
    ranks = sorted({int(r) for s in sides for r in s.get("samples_read_per_rank", {})})
    modules = {int(r): m for s in sides for m, rs in s.get("modules", {}).items() for r in rs}
    t = Table(title="Data movement per rank (mean per step)", header_style="bold")
    t.add_column("rank", justify="right")
    t.add_column("module")
    for _, label, _ in keys:
        if after is None:
            t.add_column(label, justify="right")
        else:
            t.add_column(f"{label} before", justify="right")
            t.add_column(f"{label} after", justify="right")
    for rank in ranks:
        row = [str(rank), modules.get(rank, "?")]
        for key, _, kind in keys:
            for s in sides:
                row.append(_fmt(s.get(key, {}).get(str(rank)), kind))
        t.add_row(*row)
    console.print(t)


# ---------------------------------------------------------------------------------------- PNG


def write_png(before: dict[str, Any], after: dict[str, Any] | None, path: str | Path) -> None:
    """Per-rank vision time bars (before/after) and a step-time CDF, as one PNG. Needs matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise RuntimeError("--png needs matplotlib: pip install matplotlib") from e

    sides = [("before", before)] + ([("after", after)] if after is not None else [])
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    ranks = sorted({int(r) for _, s in sides for r in s.get("vision_per_rank", {})})
    width = 0.8 / len(sides)
    for i, (name, s) in enumerate(sides):
        per = s.get("vision_per_rank", {})
        xs = [j + (i - (len(sides) - 1) / 2) * width for j in range(len(ranks))]
        means = [((per.get(str(r)) or {}).get("mean") or 0.0) * 1e3 for r in ranks]
        p99 = [((per.get(str(r)) or {}).get("p99") or 0.0) * 1e3 for r in ranks]
        ax1.bar(xs, means, width=width, label=f"{name} mean")
        ax1.scatter(xs, p99, marker="_", s=120, color="black", zorder=3, label="p99" if i == 0 else None)
    ax1.set_xticks(range(len(ranks)))
    ax1.set_xticklabels([str(r) for r in ranks], fontsize=8 if len(ranks) > 16 else 10)
    ax1.set_xlabel("vision rank")
    ax1.set_ylabel("vision fwd+bwd per step (ms)")
    ax1.set_title("Vision encoder time per rank")
    if ranks:
        ax1.legend()
    else:
        ax1.text(0.5, 0.5, "no vision timing", ha="center", va="center", transform=ax1.transAxes)
    for name, s in sides:
        times = sorted(v * 1e3 for v in s.get("series", {}).get("step_time_s", []))
        if times:
            ys = [(i + 1) / len(times) for i in range(len(times))]
            ax2.step([times[0], *times], [0.0, *ys], where="post", label=f"{name} ({s.get('label', '')})")
    ax2.set_xlabel("step time (ms)")
    ax2.set_ylabel("fraction of steps")
    ax2.set_title("Step time CDF")
    ax2.set_ylim(0, 1.02)
    ax2.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# --------------------------------------------------------------------------------------- main


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="mimo-accel report",
        description="Report profiler runs (directories of rank<N>.jsonl): one run, or before vs after.",
    )
    p.add_argument("before", metavar="BEFORE_DIR", help="profile directory (the baseline in a comparison)")
    p.add_argument("after", metavar="AFTER_DIR", nargs="?", help="profile directory to compare against BEFORE_DIR")
    p.add_argument("--json", metavar="PATH", help="write the statistics as JSON")
    p.add_argument("--html", metavar="PATH", help="write the report as HTML")
    p.add_argument("--png", metavar="PATH", help="write charts (needs matplotlib)")
    p.add_argument("--warmup", metavar="N", type=int, default=1, help="exclude the first N steps (default 1)")
    return p


def build(before: Run, after: Run | None = None, *, warmup: int = 1) -> dict[str, Any]:
    """The JSON document of a report: ``{format, before, after, change, warnings}``."""
    b = summarize(before, warmup=warmup)
    a = summarize(after, warmup=warmup) if after is not None else None
    cmp = compare(b, a) if a is not None else {"change": None, "warnings": []}
    warnings = [f"before: {w}" if a is not None else w for w in b["warnings"]]
    if a is not None:
        warnings += [f"after: {w}" for w in a["warnings"]] + cmp["warnings"]
    return {"format": REPORT_FORMAT, "before": b, "after": a, "change": cmp["change"], "warnings": warnings}


def write_json(path: str | Path, doc: dict[str, Any], **extra: Any) -> None:
    """Write a report document (:func:`build`) as strict JSON, its keys at the top level, with
    ``extra`` fields beside them (``mimo-accel rehearse`` adds its own). Non-finite floats become
    null; an ``extra`` key that is already a report key is refused."""
    clash = sorted(set(extra) & set(doc))
    if clash:
        raise ValueError(f"report JSON: extra fields {clash} would replace report keys")
    text = json.dumps(json_safe({**doc, **extra}), indent=2, allow_nan=False, default=str)
    Path(path).write_text(text + "\n", encoding="utf-8")


def main(argv: Sequence[str] | None = None, *, console: Console | None = None) -> int:
    """``mimo-accel report``. Returns 0, 1 if an export failed, 2 if an input has no readable data."""
    args = _parser().parse_args(argv)
    if args.warmup < 0:
        print("mimo-accel report: error: --warmup must be >= 0", file=sys.stderr)
        return 2
    try:
        before = read_run(args.before)
        after = read_run(args.after) if args.after else None
    except NoProfileData as e:
        print(f"mimo-accel report: error: {e}", file=sys.stderr)
        return 2
    doc = build(before, after, warmup=args.warmup)
    for w in doc["warnings"]:
        print(f"mimo-accel report: warning: {w}", file=sys.stderr)

    if console is None:
        console = Console(record=bool(args.html))
    elif args.html and not console.record:
        console.record = True
    render(doc["before"], doc["after"], console=console)

    rc = 0
    if args.json:
        write_json(args.json, doc)
    if args.html:
        console.save_html(args.html)
    if args.png:
        try:
            write_png(doc["before"], doc["after"], args.png)
        except RuntimeError as e:
            print(f"mimo-accel report: error: {e}", file=sys.stderr)
            rc = 1
    return rc


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
