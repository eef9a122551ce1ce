"""The machine's floor: how unevenly it times equal work, beside each module's straggler.

A run where every replica of every module computes the same samples (``mimo-accel rehearse``'s
equal-work run, ``--equal-work`` in the example) still measures a straggler above 1: the ranks'
timings of equal work differ (a shared CPU, a noisy VM, clocks and caches). Its straggler p50 per
module is the floor no plan can go below on this machine, and its excess over 1 the error a
perfect cost model would still show against the measured straggler. The report puts it beside
each module's straggler and prediction error (``per_module.<m>.floor``, ``floor`` at the top of
the JSON), so a reader can tell noise from imbalance.
"""

from __future__ import annotations

from typing import Any, Optional

from mimo_accel.profiler.run import Run


def floor_of(run: Run, *, warmup: int = 1) -> dict[str, Any]:
    """``{"modules": {module: straggler p50}, "steps": n, "profile": dir}`` of an equal-work run."""
    from mimo_accel.tools.report.summary import summarize

    s = summarize(run, warmup=warmup)
    modules = {m: s.get(f"{m}_max_over_mean_p50") for m in s.get("per_module", {})}
    return {"modules": {m: v for m, v in modules.items() if v is not None},
            "steps": max((t.get("steps", 0) for t in s["per_module"].values()), default=0),
            "profile": str(run.directory) if getattr(run, "directory", None) else None}


def with_floor(doc: dict[str, Any], floor: Optional[dict[str, Any]]) -> dict[str, Any]:
    """``doc`` (a report document) with ``floor`` at its top and in each side's ``per_module``."""
    if floor is None:
        return doc
    for side in (doc.get("before"), doc.get("after")):
        for module, table in ((side or {}).get("per_module") or {}).items():
            if module in floor["modules"]:
                table["floor"] = floor["modules"][module]
    return {**doc, "floor": floor}
