"""A profiler run's figures (one side of a report, :func:`summarize`), as the JSON holds them.

Definitions (also in the JSON, per side). Every module of the layout is reported alike — each
encoder under its config name (``vision``, or upstream's ``images`` / ``audios``) and the language
model (``language``):

* **module time** of a rank in a step: ``<module>_fwd_s + <module>_bwd_s`` (a missing part counts
  0).
* **replica** of a module: its ranks with the same ``dp_rank`` (TP/PP peers); its time in a step is
  the max over its ranks.
* **straggler ratio** (``<module>_max_over_mean``) of a step: max / mean of the module's replica
  times, over the steps every replica logged; reported as p50 / p99 / mean over steps, for every
  module (``images_max_over_mean_p50``, ``language_max_over_mean_p50``, ...). 1.0 is perfect
  balance. Every module's headline: ``<module>_max_over_mean_p50`` / ``_p99`` / ``_mean``,
  ``<module>_time_mean`` (time per rank) and ``<module>_max_mean`` (time of its slowest replica);
  ``per_module`` holds each module's table (replicas, time per rank, slowest replica).
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
* each module's throughput (``per_module.<m>.samples_per_s_p50``, ``.tokens_per_s_per_gpu_p50``,
  ``.tflops_per_gpu_p50``, ``.mfu_p50``; ``peak_tflops`` / ``peak_source``): :mod:`~.throughput`.
* the step on a device per rank (``step_time_replayed_p50``) and the plan's (``step_time_predicted_p50``),
  each module's busy and wait shares of it (``per_module.<m>.busy_share_p50``, ``.busy_share_max_p50``,
  ``.wait_share_p50``) and the module that bounds it (``bound_module``, ``bound_steps``): :mod:`~.replayed`.
* the run: ``run_id`` (every rank's header's; None for older files), ``features`` (what acted, as
  the header records it, the profiler left out; None where the header does not say),
  ``reorder_mode``; ``work`` and ``equal_work``: what the run computed each step, :mod:`~.work`.
* a module's DP replicas: ``per_module.<m>.replicas_present`` (with a counted step line; the count
  every warning gives) of ``dp_size``, ``replicas`` (timed).
* The first ``--warmup`` step numbers (default 1) are excluded from every statistic.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from mimo_accel.modules import LANGUAGE
from mimo_accel.profiler import json_safe, module_seconds
from mimo_accel.profiler.run import Run
from mimo_accel.profiler import record_number as _num
from mimo_accel.profiler.recorder import UNNAMED_ENCODER
from mimo_accel.profiler.replayed import replayed_steps, run_steps
from mimo_accel.tools.report.throughput import module_throughput, peak_of
from mimo_accel.tools.report.work import per_replica, step_work


REPORT_FORMAT = "mimo-accel-report/2"

# The keys of a side (``before`` / ``after``) that scripts may rely on across versions, beside
# each module's ``<module>_max_over_mean_p50`` / ``_p99`` (the modules: ``module_order``). A JSON
# file of this format (``mimo-accel report --json``, ``mimo-accel rehearse --json``) has
# ``format``, ``before``, ``after``, ``change`` and ``warnings`` at its top level.
STABLE_KEYS = ("module_order", "per_module", "step_time_p50", "step_time_p99", "samples_per_s",
               "samples_read_per_rank")

# metric key -> (label, kind, lower_is_better); kind picks the formatter. The summary: the run's
# rows, every module's headline rows (module_rows), then the data movement and plan-wait rows.
RUN_ROWS: tuple[tuple[str, str, str, bool], ...] = (
    ("step_time_p50", "step time p50", "s", True),
    ("step_time_p90", "step time p90", "s", True),
    ("step_time_p99", "step time p99", "s", True),
    ("samples_per_s", "throughput (samples/s)", "rate", False),
    ("step_time_replayed_p50", "step time replayed, a device per rank, p50", "s", True),
    ("step_time_predicted_p50", "step time predicted by the plan (model units), p50", "s", True),
    ("step_time_predicted_error_p50_last_half", "|predicted / replayed step - 1| p50, last half", "ratio", True),
)
TAIL_ROWS: tuple[tuple[str, str, str, bool], ...] = (
    ("samples_read_per_step", "samples read per step, all ranks", "count", True),
    ("bytes_read_per_step", "bytes read per step, all ranks", "bytes", True),
    ("bytes_exchanged_per_step", "bytes exchanged per step, all ranks", "bytes", True),
    ("plan_wait_p50", "wait for the plan per step, slowest rank, p50", "s", True),
    ("plan_wait_max", "wait for the plan per step, slowest rank, max", "s", True),
)
CHANGE_KEYS = (*(k for k, *_ in (*RUN_ROWS, *TAIL_ROWS)), "predicted_spread_mean", "step_time_mean")
#: Every module's headline figures, as ``<module>_<key>`` in a side.
MODULE_KEYS = ("max_over_mean_p50", "max_over_mean_p99", "max_over_mean_mean", "time_mean", "max_mean")


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
    return {"n": len(values), "mean": _mean(values), "p50": _pct(values, 50), "p90": _pct(values, 90),
            "p99": _pct(values, 99), "max": max(values) if values else None}


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
                 warnings: list[str]) -> dict[str, Any]:
    """One module's time statistics over ``ranks`` (see the module docstring): per rank, per DP
    replica (max over its TP/PP ranks), the per-step straggler ratio and the slowest replica."""
    per_rank: dict[str, Any] = {}
    for rank in ranks:
        regions = run.ranks[rank].module_regions
        recs = steps_of[rank].values()
        times = [v for r in recs if (v := module_seconds(r, regions)) is not None]
        fwd = [v for r in recs if (v := _num(r, f"{regions[0]}_s")) is not None]
        bwd = [v for r in recs if (v := _num(r, f"{regions[1]}_s")) is not None]
        per_rank[str(rank)] = {**_stats(times), "dp_rank": run.ranks[rank].dp_rank, "fwd_mean": _mean(fwd),
                               "bwd_mean": _mean(bwd)}
    timed_ranks = [r for r in ranks if per_rank[str(r)]["n"]]
    if ranks and not timed_ranks:
        warnings.append(f"the {name} ranks recorded no {name}_fwd_s/{name}_bwd_s; {name} statistics unavailable")
    # one count of a module's replicas for every message: those with a counted step line
    present = sorted({run.ranks[r].dp_rank for r in ranks if steps_of[r]})
    dp_size = max((run.ranks[r].dp_size for r in ranks), default=0)
    if present and len(present) < dp_size:
        absent = [d for d in range(dp_size) if d not in present]
        warnings.append(f"only {len(present)} of {dp_size} {name} DP replicas have data (missing: "
                        f"{'replica' if len(absent) == 1 else 'replicas'} {', '.join(map(str, absent))}); its "
                        "straggler ratio covers those present and its global samples are scaled up from them")

    replicas: dict[int, list[int]] = defaultdict(list)
    for rank in timed_ranks:
        replicas[run.ranks[rank].dp_rank].append(rank)
    replica_time: dict[int, dict[int, float]] = {}
    for dp, members in replicas.items():
        per_step: dict[int, float] = {}
        for rank in members:
            regions = run.ranks[rank].module_regions
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
    untimed = [d for d in present if d not in replica_time]
    if replica_time and untimed:
        warnings.append(f"{name} DP {'replica' if len(untimed) == 1 else 'replicas'} {', '.join(map(str, untimed))} "
                        f"logged steps without {name} time; the straggler ratio covers the {len(replica_time)} "
                        "timed")
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
                 if (v := module_seconds(r, run.ranks[rank].module_regions)) is not None]
    return {
        "ranks": list(ranks),
        "replicas": len(replica_time),
        "replicas_present": len(present),
        "dp_size": dp_size,
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
    by_dp = per_replica(run, steps_of, ranks, key)
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


def summarize(run: Run, *, warmup: int = 1, peak_tflops: float | None = None) -> dict[str, Any]:
    """Statistics of one run (see the module docstring for definitions). JSON-serialisable.
    ``peak_tflops``: the device's peak MFU is over (default: the device table's, where known)."""
    warnings = list(run.warnings)
    steps_of, modules, _, skipped = run_steps(run, warmup)
    if warmup > 0 and not skipped:
        recorded = len({int(r["step"]) for log in run.ranks.values() for r in log.steps})
        warnings.append(f"only {recorded} step(s) recorded; warm-up step(s) not excluded")

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

    per_module: dict[str, Any] = {}
    for name in order:
        per_module[name] = _module_time(run, steps_of, name, modules[name], warnings)

    # ---- the plan's predicted spreads, per module (or one figure: the worst module's)
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
        predicted_spreads = {next((m for m in order if m != LANGUAGE), UNNAMED_ENCODER): _mean(spreads)}
    _add_last_half(per_module, lines)
    replayed = replayed_steps(run, steps_of, modules, counted, lambda v: _pct(v, 50))
    for m, figures in replayed["shares"].items():
        if m in per_module:
            per_module[m].update(figures)
    peak, peak_source = peak_of(run, peak_tflops)
    for m, figures in module_throughput(run, steps_of, step_time, modules, order, peak,
                                        lambda v: _pct(v, 50)).items():
        per_module[m].update(figures)

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
        global_samples[mod] = per_step  # a replica short: said once with the module's time (_module_time)
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
        return sum(vals) if (vals := [v for v in per.values() if v is not None]) else None

    # ---- the training thread's wait for plans made ahead (the slowest rank's, per step)
    plan_wait: dict[int, float] = {}
    for recs in steps_of.values():
        for s, r in recs.items():
            if (w := _num(r, "plan_wait_s")) is not None:
                plan_wait[s] = max(plan_wait.get(s, 0.0), w)
    waits = [plan_wait[s] for s in sorted(plan_wait)]

    header = run.header
    config = header.get("config") if isinstance(header.get("config"), dict) else {}
    features = config.get("features")
    return json_safe(
        {
            "label": run.label,
            "directory": str(run.directory),
            "run_id": run.run_id,
            # what acted in the run (its header's), the profiler left out: every profile has it; None
            # where the header does not say
            "features": [f for f in features if f != "profile"] if isinstance(features, list) else None,
            "reorder_mode": config.get("reorder_mode"),
            **step_work(run, steps_of, modules),
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
            **{k: v for k, v in replayed.items() if k not in ("replayed_series", "shares")},
            "peak_tflops": peak,
            "peak_source": peak_source,
            # every module, the language model included: <module>_max_over_mean_p50 / _p99 / _mean,
            # <module>_time_mean, <module>_max_mean
            **{f"{m}_{k}": st[k] for m, st in per_module.items() for k in MODULE_KEYS},
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
                "modules": {m: st["series"] for m, st in per_module.items()},
                "replayed": replayed["replayed_series"],
            },
            "warnings": warnings,
        }
    )
