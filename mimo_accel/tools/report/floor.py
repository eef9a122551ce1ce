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
    """``{"modules": {module: straggler p50}, "steps": n, "profile": dir, "equal_work": ...}`` of an
    equal-work run (``equal_work``: whether its counters show every replica computing the same work
    each step, None where they do not tell: :mod:`~.work`)."""
    from mimo_accel.tools.report.summary import summarize

    s = summarize(run, warmup=warmup)
    modules = {m: s.get(f"{m}_max_over_mean_p50") for m in s.get("per_module", {})}
    return {"modules": {m: v for m, v in modules.items() if v is not None},
            "steps": max((t.get("steps", 0) for t in s["per_module"].values()), default=0),
            "profile": str(run.directory) if getattr(run, "directory", None) else None,
            "equal_work": s.get("equal_work")}


NOT_EQUAL_WORK = ("--floor {profile}: its replicas did not compute the same work each step (its counters differ "
                  "between them), so its straggler is not the machine's floor; give the profile of an equal-work "
                  "run (the example's --equal-work)")


def with_floor(doc: dict[str, Any], floor: Optional[dict[str, Any]]) -> dict[str, Any]:
    """``doc`` (a report document) with ``floor`` at its top and in each run's ``per_module``, and a
    warning where the floor's run was not one of equal work."""
    if floor is None:
        return doc
    for side in (doc.get("before"), doc.get("after"), *(doc.get("runs") or ())):
        for module, table in ((side or {}).get("per_module") or {}).items():
            if module in floor["modules"]:
                table["floor"] = floor["modules"][module]
    warnings = list(doc.get("warnings") or [])
    if floor["equal_work"] is False:
        warnings.append(NOT_EQUAL_WORK.format(profile=floor["profile"]))
    return {**doc, "floor": floor, "warnings": warnings}
