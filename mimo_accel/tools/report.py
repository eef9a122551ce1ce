"""Before/after report of profiler runs: rich tables, JSON/HTML export, PNG charts.

``mimo-accel report BEFORE_DIR [AFTER_DIR] [--json PATH] [--html PATH] [--png PATH] [--warmup N]``

Definitions (also in the JSON, per side). Every module of the layout is reported alike — each
encoder under its config name (``vision``, or upstream's ``images`` / ``audios``) and the language
model (``language``):

* **module time** of a rank in a step: ``<module>_fwd_s + <module>_bwd_s`` (a missing part counts
  0). Format-1 files (before per-module timing) timed every encoder as ``vision_fwd_s`` /
  ``vision_bwd_s`` and the language model not at all; they report those regions as one encoder's.
* **replica** of a module: its ranks with the same ``dp_rank`` (TP/PP peers); its time in a step is
  the max over its ranks.
* **straggler ratio** (``<module>_max_over_mean``) of a step: max / mean of the module's replica
  times, over the steps every replica logged; reported as p50 / p99 / mean over steps, for every
  module (``images_max_over_mean_p50``, ``language_max_over_mean_p50``, ...). 1.0 is perfect
  balance. Every module's headline: ``<module>_max_over_mean_p50`` / ``_p99`` / ``_mean``,
  ``<module>_time_mean`` (time per rank) and ``<module>_max_mean`` (time of its slowest replica);
  ``per_module`` holds each module's table (replicas, time per rank, slowest replica).
* **vision_* aliases**: ``vision_replicas``, ``vision_steps``, ``vision_max_over_mean_*``,
  ``vision_time_mean``, ``vision_max_mean``, ``vision_per_rank``, ``slowest`` and the series'
  ``vision_step`` / ``vision_max_over_mean`` are aliases (``STABLE_KEYS``), kept for one release (docs/compatibility.md): the figures of the module ``vision_module`` names —
  the module named ``vision``; else the module whose ranks timed format 1's ``vision_*`` regions, or
  the only encoder (said in a warning). ``vision_module`` is null where those ranks are in no module.
* **predicted spread** (``predicted_spreads_mean``): the mean over step lines of what the plan
  predicted for each module (the lines' ``predicted_spreads``; format 1's single
  ``predicted_spread`` was the layout's first encoder's); ``predicted_spread_mean``: of the worst
  module's.
* **real tokens per language replica** (``language_tokens_per_replica``): mean ``tokens`` per step
  of each language DP replica (with packing on, what the replica computes);
  ``language_tokens_max_over_mean_p50``: per-step max / mean of them over the replicas.
* **slowest replica**: the replica with the max time in a step (ties are nobody's); the report
  names the replica slowest most often and in what share of the steps (like Megatron's
  StragglerDetector and HTA).
* **step time** of a step: the max ``step_time_s`` (wall) over the ranks that logged it.
* **throughput** (``samples_per_s``): global samples over all counted steps / their summed step
  time. Global samples of a step = sum over the DP replicas of one module (``samples_module``: the
  language module if present, else the layout's first module) of the replica's ``samples``; every
  other module's count is checked against it.
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from mimo_accel.modules import LANGUAGE
from mimo_accel.profiler import FORMAT_V1, REGIONS, NoProfileData, Run, module_seconds, read_run
from mimo_accel.profiler.recorder import FORMAT_V1_ENCODER
from mimo_accel.tools.arguments import UsageError, fail, nonnegative_int, output_file, parse, require_extra
from mimo_accel.profiler import json_safe
from mimo_accel.profiler import record_number as _num

__all__ = ["REPORT_FORMAT", "STABLE_KEYS", "build", "compare", "main", "render", "summarize", "write_html",
           "write_json", "write_png"]

REPORT_FORMAT = "mimo-accel-report/1"

# The keys of a side (``before`` / ``after``) that scripts may rely on across versions. A JSON file
# of this format (``mimo-accel report --json``, ``mimo-accel rehearse --json``) has ``format``,
# ``before``, ``after``, ``change`` and ``warnings`` at its top level.
STABLE_KEYS = ("vision_max_over_mean_p50", "vision_max_over_mean_p99", "step_time_p50", "step_time_p99",
               "samples_per_s", "samples_read_per_rank")

# metric key -> (label, kind, lower_is_better); kind picks the formatter. The summary: the run's
# rows, every module's headline rows (_module_rows), then the data movement and plan-wait rows.
_RUN_ROWS: tuple[tuple[str, str, str, bool], ...] = (
    ("step_time_p50", "step time p50", "s", True),
    ("step_time_p90", "step time p90", "s", True),
    ("step_time_p99", "step time p99", "s", True),
    ("samples_per_s", "throughput (samples/s)", "rate", False),
)
_TAIL_ROWS: tuple[tuple[str, str, str, bool], ...] = (
    ("samples_read_per_step", "samples read per step, all ranks", "count", True),
    ("bytes_read_per_step", "bytes read per step, all ranks", "bytes", True),
    ("bytes_exchanged_per_step", "bytes exchanged per step, all ranks", "bytes", True),
    ("plan_wait_p50", "wait for the plan per step, slowest rank, p50", "s", True),
    ("plan_wait_max", "wait for the plan per step, slowest rank, max", "s", True),
)
#: The vision_* headline keys: aliases of one module's (``vision_module``), kept for one release.
VISION_KEYS = ("vision_max_over_mean_p50", "vision_max_over_mean_p99", "vision_max_over_mean_mean", "vision_time_mean",
               "vision_max_mean")
_CHANGE_KEYS = (*(k for k, *_ in (*_RUN_ROWS, *_TAIL_ROWS)), *VISION_KEYS, "predicted_spread_mean", "step_time_mean")
#: Every module's headline figures, as ``<module>_<key>`` in a side.
_MODULE_KEYS = ("max_over_mean_p50", "max_over_mean_p99", "max_over_mean_mean", "time_mean", "max_mean")


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
    return module_seconds(rec, REGIONS)


def _module_order(run: Run, modules: dict[str, list[int]]) -> list[str]:
    """The run's modules in the layout's order (its ``dp`` table, or its keys), encoders before the
    language model; modules only the rank headers name come after, sorted."""
    layout = run.layout
    named = layout.get("dp") if isinstance(layout.get("dp"), dict) else layout
    order = [m for m in named if m in modules] if isinstance(named, dict) else []
    order += sorted(m for m in modules if m not in order)
    order = [m for m in order if m != "unknown"]
    return [m for m in order if m != LANGUAGE] + [m for m in order if m == LANGUAGE]


def _module_time(run: Run, steps_of: dict[int, dict[int, dict[str, Any]]], name: str, ranks: list[int],
                 regions_of, warnings: list[str], warn_untimed: bool) -> dict[str, Any]:
    """One module's time statistics over ``ranks`` (see the module docstring): per rank, per DP
    replica (max over its TP/PP ranks), the per-step straggler ratio and the slowest replica."""
    per_rank: dict[str, Any] = {}
    for rank in ranks:
        regions = regions_of(rank)
        recs = steps_of[rank].values()
        times = [v for r in recs if (v := module_seconds(r, regions)) is not None]
        fwd = [v for r in recs if (v := _num(r, f"{regions[0]}_s")) is not None]
        bwd = [v for r in recs if (v := _num(r, f"{regions[1]}_s")) is not None]
        per_rank[str(rank)] = {**_stats(times), "dp_rank": run.ranks[rank].dp_rank, "fwd_mean": _mean(fwd),
                               "bwd_mean": _mean(bwd)}
    timed_ranks = [r for r in ranks if per_rank[str(r)]["n"]]
    if ranks and not timed_ranks and warn_untimed:
        warnings.append(f"the {name} ranks recorded no {name}_fwd_s/{name}_bwd_s; {name} statistics unavailable")

    replicas: dict[int, list[int]] = defaultdict(list)
    for rank in timed_ranks:
        replicas[run.ranks[rank].dp_rank].append(rank)
    replica_time: dict[int, dict[int, float]] = {}
    for dp, members in replicas.items():
        per_step: dict[int, float] = {}
        for rank in members:
            regions = regions_of(rank)
            for st, r in steps_of[rank].items():
                v = module_seconds(r, regions)
                if v is not None:
                    per_step[st] = max(per_step.get(st, 0.0), v)
        replica_time[dp] = per_step
    common = sorted(set.intersection(*(set(t) for t in replica_time.values()))) if replica_time else []
    if replica_time and len(common) < max(len(t) for t in replica_time.values()):
        warnings.append(
            f"{name} replicas logged different steps; straggler statistics use the {len(common)} step(s) all "
            f"{len(replica_time)} replica(s) logged"
        )
    dp_size = max((run.ranks[r].dp_size for r in ranks), default=0)
    if replica_time and len(replica_time) < dp_size:
        warnings.append(
            f"only {len(replica_time)} of {dp_size} {name} DP replicas have data; the straggler ratio "
            "covers those present"
        )
    ratios: list[float] = []
    ratio_steps: list[int] = []  # the steps of ``ratios`` (a step whose replicas all took 0 s has none)
    maxes: list[float] = []
    slow_counts: dict[int, int] = defaultdict(int)
    ties = 0
    order = sorted(replica_time)
    for st in common:
        times = [replica_time[dp][st] for dp in order]
        m, mx = sum(times) / len(times), max(times)
        maxes.append(mx)
        if m > 0:
            ratios.append(mx / m)
            ratio_steps.append(st)
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
    all_times = [v for rank in timed_ranks for r in steps_of[rank].values()
                 if (v := module_seconds(r, regions_of(rank))) is not None]
    return {
        "ranks": list(ranks),
        "replicas": len(replica_time),
        "steps": len(common),
        "max_over_mean_p50": _pct(ratios, 50),
        "max_over_mean_p99": _pct(ratios, 99),
        "max_over_mean_mean": _mean(ratios),
        "time_mean": _mean(all_times),
        "max_mean": _mean(maxes),
        "per_rank": per_rank,
        "slowest": slowest,
        "series": {"step": ratio_steps, "max_over_mean": ratios},
    }


def _add_last_half(per_module: dict[str, Any], lines: list[dict[str, Any]]) -> None:
    """Each module's straggler over the last half of its counted steps (``max_over_mean_p50_last_half``:
    where an online calibration has had time to act), and there the median of how far the plan's
    predicted straggler was from the measured one (``predicted_error_p50_last_half``; the step
    lines' ``predicted_spreads``, the same on every data rank)."""
    predicted: dict[str, dict[int, float]] = defaultdict(dict)
    for r in lines:
        table = r.get("predicted_spreads")
        if isinstance(table, dict):
            for m in table:
                if (v := _num(table, m)) is not None:
                    predicted[str(m)][int(r["step"])] = v
    for m, st in per_module.items():
        steps, ratios = st["series"]["step"], st["series"]["max_over_mean"]
        half = len(steps) // 2
        late = list(zip(steps[half:], ratios[half:]))
        st["max_over_mean_p50_last_half"] = _pct([x for _, x in late], 50)
        errors = [abs(predicted[m][s] - x) for s, x in late if s in predicted.get(m, {})]
        st["predicted_error_p50_last_half"] = _pct(errors, 50)


def _replica_counter(run: Run, steps_of, ranks: list[int], key: str) -> dict[str, Any]:
    """A counter per DP replica of ``ranks`` (max over its TP/PP ranks, which all see the same
    batch): its mean per step (``{dp_rank: mean}``), the mean over replicas, and the per-step
    max / mean over the replicas (p50)."""
    by_dp: dict[int, dict[int, float]] = defaultdict(dict)
    for rank in ranks:
        dp = run.ranks[rank].dp_rank
        for st, r in steps_of[rank].items():
            v = _num(r, key)
            if v is not None:
                by_dp[dp][st] = max(by_dp[dp].get(st, 0.0), v)
    means = {str(dp): _mean(list(v.values())) for dp, v in sorted(by_dp.items())}
    common = sorted(set.intersection(*(set(v) for v in by_dp.values()))) if by_dp else []
    ratios = []
    for st in common:
        vals = [by_dp[dp][st] for dp in sorted(by_dp)]
        m = sum(vals) / len(vals)
        if m > 0 and len(vals) > 1:
            ratios.append(max(vals) / m)
    if not any(means.values()):
        return {"mean": {}, "replica_mean": None, "max_over_mean_p50": None}
    return {"mean": means, "replica_mean": _mean([v for v in means.values() if v is not None]),
            "max_over_mean_p50": _pct(ratios, 50)}


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

    # ---- every module's time
    order = _module_order(run, modules)

    def own_regions(rank: int) -> tuple[str, ...]:
        return run.ranks[rank].module_regions

    per_module: dict[str, Any] = {}
    for name in order:
        ranks = modules[name]
        v1 = all(run.ranks[r].format == FORMAT_V1 for r in ranks)
        # format 1 timed every encoder (as "vision") and the language model not at all
        per_module[name] = _module_time(run, steps_of, name, ranks, own_regions, warnings,
                                        warn_untimed=not v1 or name != LANGUAGE)

    # ---- the vision_* keys every version of this report has had (STABLE_KEYS): aliases of a module's
    vision_ranks = list(modules.get("vision", []))
    if vision_ranks:
        vision = per_module["vision"]
    else:
        vision_ranks = [r for r, recs in steps_of.items() if any(_vision_time(x) is not None for x in recs.values())]
        encoders = [m for m in order if m != LANGUAGE]
        if vision_ranks:
            warnings.append(
                f"no rank header says module='vision'; using the ranks that timed the vision encoder: {vision_ranks}"
            )
            vision = _module_time(run, steps_of, "vision", vision_ranks, lambda r: REGIONS, warnings, True)
        elif len(encoders) == 1 and per_module[encoders[0]]["replicas"]:
            vision_ranks = modules[encoders[0]]
            vision = per_module[encoders[0]]
            warnings.append(f"no module is named 'vision'; the vision_* figures are those of the only encoder, "
                            f"{encoders[0]!r}")
        else:
            vision = _module_time(run, steps_of, "vision", [], lambda r: REGIONS, warnings, False)
    vision_module = next((m for m in order if vision_ranks and modules[m] == vision_ranks), None)

    # ---- the plan's predicted spreads, per module (format 1: the one figure was vision's)
    lines = [r for recs in steps_of.values() for r in recs.values()]
    spreads = [v for r in lines if (v := _num(r, "predicted_spread")) is not None]
    by_module: dict[str, list[float]] = defaultdict(list)
    for r in lines:
        table = r.get("predicted_spreads")
        if isinstance(table, dict):
            for m, v in table.items():
                if (f := _num(table, m)) is not None:
                    by_module[str(m)].append(f)
    predicted_spreads = {m: _mean(v) for m, v in by_module.items()}
    if not by_module and spreads:  # the plan priced one encoder: the layout's first
        predicted_spreads = {next((m for m in order if m != LANGUAGE), FORMAT_V1_ENCODER): _mean(spreads)}
    _add_last_half(per_module, lines)

    # ---- online calibration: the refits the fitting rank accepted, in order
    refits = [dict(r) for log in run.ranks.values() for line in log.steps
              for r in (line.get("online_refits") or ()) if isinstance(r, dict)]

    # ---- real tokens per language replica
    language_tokens = _replica_counter(run, steps_of, modules.get(LANGUAGE, []), "tokens")
    language_sq_tokens = _replica_counter(run, steps_of, modules.get(LANGUAGE, []), "sq_tokens")

    # ---- samples and throughput: counted on the language module, else on the layout's first module
    samples_module = LANGUAGE if LANGUAGE in modules else next(iter(order), None)
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
    for mod in (m for m in order if m != samples_module and samples_module in global_samples):
        v, ref = global_samples[mod], global_samples[samples_module]
        differ = [s for s in counted if v.get(s) and ref.get(s) and abs(v[s] - ref[s]) > 1e-9]
        if differ:
            warnings.append(
                f"{mod} and {samples_module} ranks count different global samples in {len(differ)} step(s) "
                f"(first: step {differ[0]}: {mod} {v[differ[0]]:g}, {samples_module} {ref[differ[0]]:g})"
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

    # ---- the training thread's wait for plans made ahead (the slowest rank's, per step)
    plan_wait: dict[int, float] = {}
    for recs in steps_of.values():
        for s, r in recs.items():
            if (w := _num(r, "plan_wait_s")) is not None:
                plan_wait[s] = max(plan_wait.get(s, 0.0), w)
    waits = [plan_wait[s] for s in sorted(plan_wait)]

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
            "vision_replicas": vision["replicas"],
            "vision_steps": vision["steps"],
            "vision_max_over_mean_p50": vision["max_over_mean_p50"],
            "vision_max_over_mean_p99": vision["max_over_mean_p99"],
            "vision_max_over_mean_mean": vision["max_over_mean_mean"],
            "vision_time_mean": vision["time_mean"],
            "vision_max_mean": vision["max_mean"],
            "vision_per_rank": vision["per_rank"],
            "slowest": vision["slowest"],
            "vision_module": vision_module,
            # every module, the language model included: <module>_max_over_mean_p50 / _p99 / _mean,
            # <module>_time_mean, <module>_max_mean (for a module named vision: its vision_* keys)
            **{f"{m}_{k}": st[k] for m, st in per_module.items() for k in _MODULE_KEYS},
            "module_order": order,
            "per_module": {m: {k: v for k, v in st.items() if k != "series"} for m, st in per_module.items()},
            "predicted_spreads_mean": predicted_spreads,
            "language_tokens_per_replica": language_tokens["mean"],
            "language_tokens_max_over_mean_p50": language_tokens["max_over_mean_p50"],
            "language_tokens_per_replica_step_mean": language_tokens["replica_mean"],
            "language_sq_tokens_per_replica": language_sq_tokens["mean"],
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
            "online_calibration": {"refits": refits},
            "plan_wait_p50": _pct(waits, 50),
            "plan_wait_max": max(waits) if waits else None,
            # what a feature said once about the data it got (notices.say_once), in step order
            "notes": list(dict.fromkeys(n for log in run.ranks.values() for r in log.steps
                                        for n in (r.get("notes") or ()) if isinstance(n, str))),
            "series": {
                "step": counted,
                "step_time_s": st_values,
                "vision_step": vision["series"]["step"],
                "vision_max_over_mean": vision["series"]["max_over_mean"],
                "modules": {m: st["series"] for m, st in per_module.items()},
            },
            "warnings": warnings,
        }
    )


def _timed_modules(*sides: dict[str, Any] | None) -> list[str]:
    """The modules with time on either side, in the first side's order."""
    order: list[str] = []
    for s in sides:
        for m in (s or {}).get("module_order", []):
            if m not in order:
                order.append(m)
    return [m for m in order if any(((s or {}).get("per_module", {}).get(m) or {}).get("replicas") for s in sides)]


def _headline_modules(before: dict[str, Any], after: dict[str, Any] | None) -> list[str]:
    """The modules the report shows figures for: every timed module in the layout's order, and
    ahead of them "vision" where a side's vision_* figures are those of ranks in no module (format
    1 files whose headers name no module ``vision``)."""
    modules = _timed_modules(before, after)
    if "vision" not in modules and any(x.get("vision_replicas") and x.get("vision_module") is None
                                       for x in (before, after) if x):
        modules = ["vision", *modules]
    return modules


def _module_rows(before: dict[str, Any], after: dict[str, Any] | None) -> list[tuple[str, str, str, bool]]:
    """The summary rows: every module's headline (its straggler p50, p99 and mean, the plan's
    predicted spread, its time per rank and of its slowest replica), in the layout's order."""
    rows: list[tuple[str, str, str, bool]] = list(_RUN_ROWS)
    for m in _headline_modules(before, after):
        rows += [(f"{m}_max_over_mean_p50", f"{m} straggler max/mean p50", "ratio", True),
                 (f"{m}_max_over_mean_p99", f"{m} straggler max/mean p99", "ratio", True),
                 (f"{m}_max_over_mean_mean", f"{m} straggler max/mean, mean", "ratio", True),
                 (f"predicted_spreads_mean.{m}", f"{m} straggler the plan predicted, mean", "ratio", True),
                 (f"per_module.{m}.max_over_mean_p50_last_half", f"{m} straggler p50, last half of the steps",
                  "ratio", True),
                 (f"per_module.{m}.predicted_error_p50_last_half",
                  f"{m} |predicted - measured| straggler p50, last half", "ratio", True),
                 (f"{m}_time_mean", f"{m} time per rank, mean", "s", True),
                 (f"{m}_max_mean", f"{m} time of slowest replica, mean", "s", True)]
    if any(len((s or {}).get("predicted_spreads_mean") or {}) > 1 for s in (before, after)):
        rows.append(("predicted_spread_mean", "worst module's straggler the plan predicted, mean", "ratio", True))
    if any((s or {}).get("language_tokens_per_replica") for s in (before, after)):
        rows += [("language_tokens_per_replica_step_mean", "language real tokens per replica per step, mean",
                  "count", True),
                 ("language_tokens_max_over_mean_p50", "language real tokens max/mean over replicas p50", "ratio",
                  True)]
    rows += list(_TAIL_ROWS)
    return rows


def _get(summary: dict[str, Any] | None, key: str) -> Any:
    """``summary[key]``; a dotted key walks into nested tables (``per_module.language.time_mean``),
    the first part being a key of the summary."""
    if summary is None:
        return None
    if key in summary:
        return summary[key]
    head, _, rest = key.partition(".")
    value: Any = summary.get(head)
    for part in rest.split(".") if rest else ():
        if not isinstance(value, dict):
            return None
        if part in value:
            value = value[part]
            continue
        value = None
    return value


def _module_dp(summary: dict[str, Any]) -> dict[str, int]:
    return {m: len(r) for m, r in summary.get("modules", {}).items()}


def compare(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """Relative change (after / before) of the headline metrics, and what makes them not comparable."""
    change = {}
    module_keys = [f"{m}_{k}" for m in _timed_modules(before, after) for k in _MODULE_KEYS]
    for key in dict.fromkeys((*_CHANGE_KEYS, *module_keys, "language_tokens_per_replica_step_mean",
                              "language_tokens_max_over_mean_p50")):
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
# The report is one list of blocks — tables (:class:`_Table`), messages, lines — that the terminal
# (rich, :func:`render`) and the HTML page (:func:`write_html`) render alike.


@dataclass
class _Table:
    title: str
    columns: list[tuple[str, bool]]  # (header, right-justified)
    rows: list[list[Any]] = field(default_factory=list)  # cells: str, or (str, style) — see _STYLES


# a cell's style -> (rich style, HTML class)
_STYLES = {"better": ("green", "better"), "worse": ("red", "worse"), "dim": ("dim", "dim"), "": ("", "")}


def _fmt(value: Any, kind: str) -> str:
    if value is None:
        return "—"
    if kind == "s":
        return f"{value * 1e3:.2f} ms" if abs(value) < 1 else f"{value:.3f} s"
    if kind == "ratio":
        return f"{value:.3f}"
    if kind == "sci":
        return f"{value:.3g}"
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


def _change_cell(ratio: float | None, lower_is_better: bool) -> tuple[str, str]:
    if ratio is None:
        return "—", "dim"
    pct = (ratio - 1.0) * 100
    better = ratio < 0.98 if lower_is_better else ratio > 1.02
    worse = ratio > 1.02 if lower_is_better else ratio < 0.98
    return f"×{ratio:.2f} ({pct:+.0f}%)", "better" if better else "worse" if worse else ""


def _slowest_line(s: dict[str, Any], module: str) -> str:
    """``s``: one module's ``per_module`` entry, or a summary (its vision_* figures)."""
    slow = s.get("slowest")
    if not slow:
        if s.get("vision_replicas", s.get("replicas", 0)) == 1:
            return f"one {module} replica: no straggler to name"
        return f"no slowest {module} replica (no {module} timing, or all replicas tied)"
    ranks = slow["ranks"]
    who = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {','.join(map(str, ranks))}"
    return f"{module} DP replica {slow['dp_rank']} ({who}) slowest in {slow['fraction']:.0%} of {slow['steps']} steps"


def _runs_table(before: dict[str, Any], after: dict[str, Any] | None) -> _Table:
    t = _Table("Runs", [("", False), ("label", False), ("directory", False), ("ranks", False), ("steps", False),
                        ("device / clock", False)])
    for name, s in (("before", before), ("after", after)) if after is not None else (("run", before),):
        assert s is not None
        clock = s.get("clock") or {}
        present = len(s.get("ranks_present", []))
        t.rows.append([
            name,
            str(s.get("label", "")),
            str(s.get("directory", "")),
            f"{present}/{s.get('world_size') or '?'} "
            + " ".join(f"{m}:{len(r)}" for m, r in s.get("modules", {}).items()),
            f"{s.get('steps_counted', 0)}"
            + (f" (skipped {len(s['warmup_skipped'])} warm-up)" if s.get("warmup_skipped") else ""),
            f"{s.get('device') or '?'} / {clock.get('regions', '?') if isinstance(clock, dict) else clock}",
        ])
    return t


def _messages(before: dict[str, Any], after: dict[str, Any] | None) -> list[tuple[str, str]]:
    """``(kind, text)``: the warnings (kind ``warning``) and the notes the features gave (``note``)."""
    two = after is not None
    warnings = [*(f"before: {w}" if two else w for w in before.get("warnings", []))]
    if after is not None:
        warnings += [f"after: {w}" for w in after.get("warnings", [])]
        warnings += compare(before, after)["warnings"]
    out = [("warning", w) for w in warnings]
    for side, s in (("before", before), ("after", after)):
        for note in (s or {}).get("notes", []):
            out.append(("note", f"note ({side}): {note}" if two else f"note: {note}"))
    return out


def _summary_table(before: dict[str, Any], after: dict[str, Any] | None) -> _Table:
    two = after is not None
    change = compare(before, after)["change"] if after is not None else {}
    columns = [("metric", False), ("before" if two else "value", True)]
    if two:
        columns += [("after", True), ("after/before", True)]
    t = _Table("Summary", columns)
    for key, label, kind, lower in _module_rows(before, after):
        b = _get(before, key)
        row: list[Any] = [label, _fmt(b, kind)]
        if after is not None:
            a = _get(after, key)
            ratio = change.get(key)
            if ratio is None and isinstance(a, (int, float)) and isinstance(b, (int, float)) and b:
                ratio = a / b
            row += [_fmt(a, kind), _change_cell(ratio, lower)]
        t.rows.append(row)
    return t


def _module_figures(s: dict[str, Any] | None, module: str) -> dict[str, Any] | None:
    """A side's table of ``module`` (its ``per_module`` entry; a summary itself for the vision_*
    figures of ranks in no module)."""
    st = ((s or {}).get("per_module") or {}).get(module)
    if st is None and module == "vision" and s and s.get("vision_module") is None and s.get("vision_replicas"):
        return {**s, "per_rank": s.get("vision_per_rank", {})}
    return st


def _slowest_lines(before: dict[str, Any], after: dict[str, Any] | None) -> list[str]:
    two = after is not None
    lines = []
    for m in _headline_modules(before, after):
        for side, s in (("before", before), ("after", after)) if two else (("", before),):
            st = _module_figures(s, m)
            if st:
                lines.append(f"slowest {m}{' ' + side if side else ''}: {_slowest_line(st, m)}")
    return lines


def _per_rank_table(title: str, per_rank: list[dict[str, Any]], two: bool) -> _Table | None:
    before_pr, after_pr = per_rank[0], per_rank[1] if two else None
    ranks = sorted({int(r) for pr in (before_pr, after_pr) if pr for r in pr})
    if not ranks:
        return None
    sides = [("", before_pr)] if after_pr is None else [("before ", before_pr), ("after ", after_pr)]
    columns = [("rank", True), ("dp", True)]
    for prefix, _ in sides:
        columns += [(f"{prefix}{stat}", True) for stat in ("mean", "p50", "p99")]
    if after_pr is not None:
        columns.append(("mean after/before", True))
    t = _Table(title, columns)
    for rank in ranks:
        row: list[Any] = [str(rank)]
        dp = None
        means = []
        for _, s in sides:
            st = (s or {}).get(str(rank))
            if st:
                dp = st.get("dp_rank")
            means.append(st.get("mean") if st else None)
            row += [_fmt(st.get(k) if st else None, "s") for k in ("mean", "p50", "p99")]
        row.insert(1, "—" if dp is None else str(dp))
        if after_pr is not None:
            b, a = means
            row.append(_change_cell(a / b if a is not None and b else None, True))
        t.rows.append(row)
    return t


def _module_time_tables(before: dict[str, Any], after: dict[str, Any] | None) -> list[_Table]:
    two = after is not None
    tables = []
    for module in _headline_modules(before, after):
        title = ("Language model time per rank (fwd + bwd per step)" if module == LANGUAGE
                 else f"{module.capitalize()} encoder time per rank (fwd + bwd per step)")
        per = [(_module_figures(s, module) or {}).get("per_rank", {}) for s in (before, after)]
        tables.append(_per_rank_table(title, per, two))
    return [t for t in tables if t is not None]


def _tokens_table(before: dict[str, Any], after: dict[str, Any] | None) -> _Table | None:
    sides = [("", before)] if after is None else [("before ", before), ("after ", after)]
    dps = sorted({int(d) for _, s in sides for d in (s or {}).get("language_tokens_per_replica", {})})
    if not dps:
        return None
    t = _Table("Language real tokens per replica per step, mean",
               [("dp", True), *((f"{prefix}tokens", True) for prefix, _ in sides)])
    for dp in dps:
        t.rows.append([str(dp), *(_fmt((s or {}).get("language_tokens_per_replica", {}).get(str(dp)), "count")
                                  for _, s in sides)])
    return t


def _io_table(before: dict[str, Any], after: dict[str, Any] | None) -> _Table | None:
    keys = (("samples_read_per_rank", "samples read", "count"), ("bytes_read_per_rank", "bytes read", "bytes"),
            ("bytes_exchanged_per_rank", "bytes exchanged", "bytes"))
    sides = [s for s in (before, after) if s]
    keys = tuple(k for k in keys if any(v for s in sides for v in s.get(k[0], {}).values()))
    if not keys:
        return None
    ranks = sorted({int(r) for s in sides for r in s.get("samples_read_per_rank", {})})
    modules = {int(r): m for s in sides for m, rs in s.get("modules", {}).items() for r in rs}
    columns = [("rank", True), ("module", False)]
    for _, label, _ in keys:
        columns += ([(label, True)] if after is None else [(f"{label} before", True), (f"{label} after", True)])
    t = _Table("Data movement per rank (mean per step)", columns)
    for rank in ranks:
        row = [str(rank), modules.get(rank, "?")]
        for key, _, kind in keys:
            for s in sides:
                row.append(_fmt(s.get(key, {}).get(str(rank)), kind))
        t.rows.append(row)
    return t


def _calibration_table(side: dict[str, Any] | None) -> _Table | None:
    """The refits an online calibration accepted (the accelerated side's)."""
    refits = ((side or {}).get("online_calibration") or {}).get("refits") or []
    if not refits:
        return None
    t = _Table("Online calibration: accepted refits (s per row / row² / item; per token / token²)",
               [("step", True), ("module", False), ("a", True), ("b", True), ("k", True),
                ("held-out error", True), ("planned from", True)])
    for r in refits:
        c = r.get("coefficients") or {}
        t.rows.append([str(r.get("step")), str(r.get("module")), *(_fmt(c.get(x), "sci") for x in ("a", "b", "k")),
                       f"{_fmt(r.get('held_out_error_before'), 'ratio')} → {_fmt(r.get('held_out_error_after'), 'ratio')}",
                       str(r.get("announced_for", "—"))])
    return t


def _detail_tables(before: dict[str, Any], after: dict[str, Any] | None) -> list[_Table]:
    """The tables after the summary: every module's time per rank, tokens, data movement, and what
    an online calibration learnt."""
    tables = _module_time_tables(before, after)
    tables += [t for t in (_tokens_table(before, after), _io_table(before, after),
                           _calibration_table(after if after is not None else before))
               if t is not None]
    return tables


def _rich_table(t: _Table) -> Table:
    table = Table(title=t.title, header_style="bold")
    for header, right in t.columns:
        table.add_column(header, justify="right" if right else "left",
                         overflow="fold" if header == "directory" else "ellipsis")
    for row in t.rows:
        table.add_row(*(Text(c[0], style=_STYLES[c[1]][0]) if isinstance(c, tuple) else c for c in row))
    return table


def render(
    before: dict[str, Any],
    after: dict[str, Any] | None = None,
    console: Console | None = None,
) -> None:
    """Print the report of one summary, or of a before/after pair with a change column."""
    console = console or Console()
    console.rule("[bold]mimo-accel profile report")
    console.print(_rich_table(_runs_table(before, after)))
    for kind, text in _messages(before, after):
        console.print(Text(f"⚠ {text}", style="yellow") if kind == "warning" else Text(text, style="cyan"))
    console.print(_rich_table(_summary_table(before, after)))
    for line in _slowest_lines(before, after):
        console.print(line)
    for t in _detail_tables(before, after):
        console.print(_rich_table(t))


# ---------------------------------------------------------------------------------------- charts


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise RuntimeError("charts need matplotlib: pip install 'mimo-accel[charts]' (or pip install "
                           "matplotlib)") from e
    return plt


def _sides(before: dict[str, Any], after: dict[str, Any] | None) -> list[tuple[str, dict[str, Any]]]:
    return [("before", before)] + ([("after", after)] if after is not None else [])


def _plot_module_time(ax, before: dict[str, Any], after: dict[str, Any] | None) -> None:
    """Per-rank module time bars (every timed module's ranks, before/after), p99 ticks."""
    sides = _sides(before, after)

    def per_rank(s: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for m in _timed_modules(s):
            out.update(s["per_module"][m]["per_rank"])
        return out or s.get("vision_per_rank", {})

    module_of = {int(r): m for _, s in sides for m in _timed_modules(s) for r in s["per_module"][m]["per_rank"]}
    ranks = sorted({int(r) for _, s in sides for r in per_rank(s)})
    width = 0.8 / len(sides)
    for i, (name, s) in enumerate(sides):
        per = per_rank(s)
        xs = [j + (i - (len(sides) - 1) / 2) * width for j in range(len(ranks))]
        means = [((per.get(str(r)) or {}).get("mean") or 0.0) * 1e3 for r in ranks]
        p99 = [((per.get(str(r)) or {}).get("p99") or 0.0) * 1e3 for r in ranks]
        ax.bar(xs, means, width=width, label=f"{name} mean")
        ax.scatter(xs, p99, marker="_", s=120, color="black", zorder=3, label="p99" if i == 0 else None)
    ax.set_xticks(range(len(ranks)))
    small = len(ranks) > 16
    ax.set_xticklabels([f"{r}\n{module_of.get(r, '')}" if not small else str(r) for r in ranks],
                       fontsize=8 if small else 9)
    ax.set_xlabel("rank (module)")
    ax.set_ylabel("module fwd+bwd per step (ms)")
    ax.set_title("Module time per rank")
    if ranks:
        ax.legend()
    else:
        ax.text(0.5, 0.5, "no module timing", ha="center", va="center", transform=ax.transAxes)


def _plot_step_time_cdf(ax, before: dict[str, Any], after: dict[str, Any] | None) -> None:
    for name, s in _sides(before, after):
        times = sorted(v * 1e3 for v in s.get("series", {}).get("step_time_s", []))
        if times:
            ys = [(i + 1) / len(times) for i in range(len(times))]
            ax.step([times[0], *times], [0.0, *ys], where="post", label=f"{name} ({s.get('label', '')})")
    ax.set_xlabel("step time (ms)")
    ax.set_ylabel("fraction of steps")
    ax.set_title("Step time CDF")
    ax.set_ylim(0, 1.02)
    ax.legend()


def _straggler_modules(before: dict[str, Any], after: dict[str, Any] | None) -> list[str]:
    """The modules with a per-step straggler series on either side, in the layout's order."""
    return [m for m in _timed_modules(before, after)
            if any(((s.get("series") or {}).get("modules") or {}).get(m, {}).get("max_over_mean")
                   for _, s in _sides(before, after))]


def _plot_straggler(ax, module: str, before: dict[str, Any], after: dict[str, Any] | None) -> None:
    """One module's straggler ratio (max / mean over its replicas) per step, a line per side."""
    for name, s in _sides(before, after):
        series = ((s.get("series") or {}).get("modules") or {}).get(module) or {}
        steps, ratios = series.get("step") or [], series.get("max_over_mean") or []
        if ratios and len(steps) == len(ratios):
            ax.plot(steps, ratios, marker="o", markersize=3, label=f"{name} ({s.get('label', '')})")
    ax.axhline(1.0, color="grey", linewidth=0.8, linestyle=":")
    ax.set_xlabel("step")
    ax.set_ylabel("max / mean over replicas")
    ax.set_title(f"{module} straggler per step")
    ax.legend()


def _figures(before: dict[str, Any], after: dict[str, Any] | None) -> list[tuple[str, Any]]:
    """``(caption, figure)``: module time per rank and the step-time CDF; every module's straggler
    per step."""
    plt = _pyplot()
    out = []
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    _plot_module_time(ax1, before, after)
    _plot_step_time_cdf(ax2, before, after)
    fig.tight_layout()
    out.append(("Module time per rank (mean, p99) and step time CDF", fig))
    modules = _straggler_modules(before, after)
    if modules:
        fig, axes = plt.subplots(1, len(modules), figsize=(max(6.0, 4.5 * len(modules)), 3.8), squeeze=False)
        for ax, m in zip(axes[0], modules):
            _plot_straggler(ax, m, before, after)
        fig.tight_layout()
        out.append(("Straggler (max / mean of the replicas' fwd + bwd time) per step, per module", fig))
    return out


def _png_bytes(fig) -> bytes:
    import io

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    _pyplot().close(fig)
    return buf.getvalue()


def write_png(before: dict[str, Any], after: dict[str, Any] | None, path: str | Path) -> None:
    """Per-rank module time bars (every timed module's ranks, before/after), a step-time CDF and,
    below them, each module's straggler per step, as one PNG. Needs matplotlib."""
    plt = _pyplot()
    modules = _straggler_modules(before, after)
    rows = 2 if modules else 1
    cols = max(2, len(modules))
    fig = plt.figure(figsize=(max(12.0, 4.5 * cols), 4.5 * rows))
    grid = fig.add_gridspec(rows, cols)
    half = cols // 2
    _plot_module_time(fig.add_subplot(grid[0, :half]), before, after)
    _plot_step_time_cdf(fig.add_subplot(grid[0, half:]), before, after)
    for i, m in enumerate(modules):
        _plot_straggler(fig.add_subplot(grid[1, i]), m, before, after)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ------------------------------------------------------------------------------------------ HTML

_CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2em; color: #222; }
h1 { font-size: 1.4em; } h2 { font-size: 1.1em; margin-top: 1.6em; }
table { border-collapse: collapse; margin: 0.6em 0 1.2em; font-size: 0.9em; }
caption { text-align: left; font-weight: bold; padding: 0.3em 0; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; }
th { background: #f3f3f3; } td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
td.better { color: #11772d; } td.worse { color: #b3261e; } td.dim { color: #888; }
li.warning { color: #8a5a00; } li.note { color: #035e7b; }
figure { margin: 1em 0; } figure img { max-width: 100%; border: 1px solid #eee; }
figcaption { font-size: 0.85em; color: #555; }
"""


def _html_table(t: _Table) -> str:
    from html import escape

    def cls(right: bool, style: str = "") -> str:
        names = " ".join(n for n in (("num" if right else ""), _STYLES[style][1]) if n)
        return f' class="{names}"' if names else ""

    head = "".join(f"<th{cls(right)}>{escape(h)}</th>" for h, right in t.columns)
    body = []
    for row in t.rows:
        cells = []
        for (_, right), c in zip(t.columns, row):
            text, style = c if isinstance(c, tuple) else (c, "")
            cells.append(f"<td{cls(right, style)}>{escape(str(text))}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return (f"<table>\n<caption>{escape(t.title)}</caption>\n<thead><tr>{head}</tr></thead>\n<tbody>\n"
            + "\n".join(body) + "\n</tbody>\n</table>")


def write_html(doc: dict[str, Any], path: str | Path) -> list[str]:
    """The report (:func:`build`'s document) as one self-contained HTML page: the same tables as
    the terminal, as HTML tables, and the charts embedded as PNG data URIs (module time per rank,
    step-time CDF, each module's straggler per step). Without matplotlib the page has the tables
    and says the charts are missing; returns the warnings (that one)."""
    import base64
    from html import escape

    before, after = doc["before"], doc["after"]
    warnings: list[str] = []
    parts = ["<!DOCTYPE html>", '<html lang="en">', "<head>", '<meta charset="utf-8">',
             "<title>mimo-accel profile report</title>", f"<style>{_CSS}</style>", "</head>", "<body>",
             "<h1>mimo-accel profile report</h1>", _html_table(_runs_table(before, after))]
    messages = _messages(before, after)
    if messages:
        parts.append("<ul>" + "".join(f'<li class="{kind}">{escape(text)}</li>' for kind, text in messages)
                     + "</ul>")
    parts.append(_html_table(_summary_table(before, after)))
    lines = _slowest_lines(before, after)
    if lines:
        parts.append("<ul>" + "".join(f"<li>{escape(line)}</li>" for line in lines) + "</ul>")
    parts.append("<h2>Charts</h2>")
    try:
        figures = _figures(before, after)
    except RuntimeError as e:
        warnings.append(f"the HTML has no charts: {e}")
        parts.append(f"<p>{escape(warnings[-1])}</p>")
        figures = []
    for caption, fig in figures:
        data = base64.b64encode(_png_bytes(fig)).decode("ascii")
        parts.append(f'<figure><img src="data:image/png;base64,{data}" alt="{escape(caption)}">'
                     f"<figcaption>{escape(caption)}</figcaption></figure>")
    parts.append("<h2>Details</h2>")
    parts += [_html_table(t) for t in _detail_tables(before, after)]
    parts += ["</body>", "</html>"]
    Path(path).write_text("\n".join(parts) + "\n", encoding="utf-8")
    return warnings


# --------------------------------------------------------------------------------------- main


PROG = "mimo-accel report"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Report profiler runs (directories of rank<N>.jsonl): one run, or before vs after.",
    )
    p.add_argument("before", metavar="BEFORE_DIR", help="profile directory (the baseline in a comparison)")
    p.add_argument("after", metavar="AFTER_DIR", nargs="?", help="profile directory to compare against BEFORE_DIR")
    p.add_argument("--json", metavar="PATH", help="write the statistics as JSON")
    p.add_argument("--html", metavar="PATH", help="write the report as HTML")
    p.add_argument("--png", metavar="PATH", help="write charts (needs matplotlib)")
    p.add_argument("--warmup", metavar="N", type=nonnegative_int, default=1,
                   help="exclude the first N steps (default 1)")
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
    """``mimo-accel report``. Returns 0, or 2 (one ``mimo-accel report: error:`` line) on a bad command
    line, an input without readable data or a failed export."""
    args = parse(_parser(), argv)
    if isinstance(args, int):
        return args
    try:
        for flag in ("--json", "--html", "--png"):
            output_file(flag, getattr(args, flag[2:]))
        if args.png:
            require_extra("--png", "matplotlib", "charts")
        before = read_run(args.before)
        after = read_run(args.after) if args.after else None
    except (UsageError, NoProfileData) as e:
        return fail(PROG, e)
    doc = build(before, after, warmup=args.warmup)
    for w in doc["warnings"]:
        print(f"mimo-accel report: warning: {w}", file=sys.stderr)

    render(doc["before"], doc["after"], console=console)

    if args.json:
        write_json(args.json, doc)
    if args.html:
        for w in write_html(doc, args.html):
            print(f"mimo-accel report: warning: {w}", file=sys.stderr)
    if args.png:
        try:
            write_png(doc["before"], doc["after"], args.png)
        except RuntimeError as e:
            return fail(PROG, e)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
