"""Before against after: each headline figure's change, and what the comparison must warn of."""

from __future__ import annotations

import json
from typing import Any

from mimo_accel.modules import LANGUAGE
from mimo_accel.tools.report.summary import CHANGE_KEYS, MODULE_KEYS, RUN_ROWS, TAIL_ROWS


def timed_modules(*sides: dict[str, Any] | None) -> list[str]:
    """The modules with time on either side, in the first side's order."""
    order: list[str] = []
    for s in sides:
        for m in (s or {}).get("module_order", []):
            if m not in order:
                order.append(m)
    return [m for m in order if any(((s or {}).get("per_module", {}).get(m) or {}).get("replicas") for s in sides)]


def throughput_rows(module: str) -> list[tuple[str, str, str, bool]]:
    """A module's throughput rows (p50 over the steps): samples/s, tokens (an encoder: rows) per
    second per GPU, model TFLOP/s per GPU, MFU."""
    p, work = f"per_module.{module}", "real tokens" if module == LANGUAGE else "rows"
    return [(f"{p}.samples_per_s_p50", f"{module} samples/s p50", "rate", False),
            (f"{p}.tokens_per_s_per_gpu_p50", f"{module} {work}/s per GPU p50", "rate", False),
            (f"{p}.tflops_per_gpu_p50", f"{module} model TFLOP/s per GPU p50", "sci", False),
            (f"{p}.mfu_p50", f"{module} MFU p50", "pct", False)]


def module_rows(*sides: dict[str, Any] | None) -> list[tuple[str, str, str, bool]]:
    """The summary rows: every module's headline (its straggler p50, p99 and mean, the plan's
    predicted spread, its time per rank and of its slowest replica; its throughput figures that
    any side has), in the layout's order."""
    rows: list[tuple[str, str, str, bool]] = list(RUN_ROWS)
    for m in timed_modules(*sides):
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
        floor = (f"per_module.{m}.floor", f"{m} straggler of equal work (the machine's floor), p50", "ratio", True)
        rows += [r for r in (floor, *throughput_rows(m)) if any(lookup(s, r[0]) is not None for s in sides)]
    if any(len((s or {}).get("predicted_spreads_mean") or {}) > 1 for s in sides):
        rows.append(("predicted_spread_mean", "worst module's straggler the plan predicted, mean", "ratio", True))
    if any((s or {}).get("language_tokens_per_replica") for s in sides):
        rows += [("language_tokens_per_replica_step_mean", "language real tokens per replica per step, mean",
                  "count", True),
                 ("language_tokens_max_over_mean_p50", "language real tokens max/mean over replicas p50", "ratio",
                  True)]
    rows += list(TAIL_ROWS)
    return rows


def lookup(summary: dict[str, Any] | None, key: str) -> Any:
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


def replicas_text(summary: dict[str, Any]) -> str:
    """Each module's DP replicas with data, of its DP size (``images 2 of 2, language 3 of 4``): the
    count the side's own warnings give."""
    return ", ".join(f"{m} {t.get('replicas_present', t.get('replicas'))} of {t.get('dp_size', '?')}"
                     for m, t in (summary.get("per_module") or {}).items())


def compare(before: dict[str, Any], after: dict[str, Any], names: tuple[str, str] = ("before", "after")
            ) -> dict[str, Any]:
    """Relative change (after / before) of the headline metrics, and what makes them not comparable
    (the two runs called ``names`` in the warnings)."""
    change = {}
    module_keys = [f"{m}_{k}" for m in timed_modules(before, after) for k in MODULE_KEYS]
    for key in dict.fromkeys((*CHANGE_KEYS, *module_keys, "language_tokens_per_replica_step_mean",
                              "language_tokens_max_over_mean_p50")):
        b, a = before.get(key), after.get(key)
        change[key] = (a / b) if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b else None
    warnings = []
    bn, an = names
    if before.get("layout") != after.get("layout"):
        warnings.append(
            f"{bn} and {an} have different layouts ({bn} {json.dumps(before.get('layout'), sort_keys=True)}, "
            f"{an} {json.dumps(after.get('layout'), sort_keys=True)}); the comparison is not like for like"
        )
    if before.get("world_size") != after.get("world_size"):
        warnings.append(f"{bn} has world size {before.get('world_size')}, {an} {after.get('world_size')}")
    if replicas_text(before) != replicas_text(after) and before.get("layout") == after.get("layout"):
        warnings.append(f"DP replicas with data differ: {bn} {replicas_text(before)}; {an} {replicas_text(after)}")
    if before.get("device") != after.get("device"):
        warnings.append(f"{bn} ran on {before.get('device')}, {an} on {after.get('device')}")
    b_sps, a_sps = before.get("samples_per_step"), after.get("samples_per_step")
    if b_sps and a_sps and abs(b_sps - a_sps) > 1e-9:
        warnings.append(
            f"global samples per step differ ({bn} {b_sps:g}, {an} {a_sps:g}); "
            "compare throughput rather than step time"
        )
    return {"change": change, "warnings": warnings}
