"""What a run computed each step, from its counters: the work of the whole step (each module's sum
over its DP replicas: the language model's real tokens, an encoder's rows), which is the same in
two runs over the same samples whatever the features did with them (sharded reads, a reorder and
packing move and pack samples, they do not change which ones a step trains); and whether every
replica of every module computed the same work each step: a run of other samples than another's
that does so is an equal-work run (the machine's floor, ``--floor``), not a run to compare with it.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from mimo_accel.modules import LANGUAGE
from mimo_accel.profiler import record_number as _num
from mimo_accel.profiler.run import Run

#: Two runs' work of one step further apart than this share is not the same samples.
SAME_WORK = 0.005


def _counter(module: str) -> str:
    return "tokens" if module == LANGUAGE else f"{module}_rows"


def per_replica(run: Run, steps_of, ranks: list[int], key: str) -> dict[int, dict[int, float]]:
    """DP replica of ``ranks`` -> step -> the counter ``key`` (max over the replica's TP/PP ranks,
    which all see the same batch)."""
    out: dict[int, dict[int, float]] = defaultdict(dict)
    for rank in ranks:
        dp = run.ranks[rank].dp_rank
        for step, rec in steps_of[rank].items():
            v = _num(rec, key)
            if v is not None:
                out[dp][step] = max(out[dp].get(step, 0.0), v)
    return out


def step_work(run: Run, steps_of, modules: dict[str, list[int]]) -> dict[str, Any]:
    """``work``: each module's counter name and its sum over the replicas by step (the steps every
    replica counted, with work); ``equal_work``: True where every module of several replicas counted
    its work and gave each of them the same on every such step, False where one gave them different
    work, None where that is not known (a module's work not counted, or no module of several)."""
    work: dict[str, dict[str, Any]] = {}
    unequal = uncounted = False
    seen = False
    for module, ranks in modules.items():
        if not ranks:
            continue
        key = _counter(module)
        dp_size = max(run.ranks[r].dp_size for r in ranks)
        by_step: dict[int, dict[int, float]] = defaultdict(dict)
        for dp, steps in per_replica(run, steps_of, ranks, key).items():
            for step, v in steps.items():
                by_step[step][dp] = v
        whole = {s: row for s, row in by_step.items() if len(row) == dp_size and sum(row.values()) > 0}
        if not whole:
            uncounted = uncounted or dp_size > 1  # replicas whose work is not counted: not known to be equal
            continue
        work[module] = {"counter": key, "by_step": {str(s): sum(row.values()) for s, row in sorted(whole.items())}}
        if dp_size > 1:
            seen = True
            unequal = unequal or any(len(set(row.values())) > 1 for row in whole.values())
    equal = False if unequal else None if uncounted or not seen else True
    return {"work": work, "equal_work": equal}


def same_work(a: dict[str, Any], b: dict[str, Any]) -> tuple[bool | None, str | None]:
    """Whether runs ``a`` and ``b`` (summaries) computed the same work on every step both counted:
    ``(True, None)``; ``(False, where)`` with the first step and module that differ, said; ``(None,
    None)`` where no module's work of a common step is known on both."""
    compared = False
    for module, wa in (a.get("work") or {}).items():
        wb = (b.get("work") or {}).get(module)
        if not wb:
            continue
        for step, x in wa["by_step"].items():
            y = wb["by_step"].get(step)
            if y is None:
                continue
            compared = True
            if abs(x - y) > SAME_WORK * max(x, y):
                what = "real tokens" if module == LANGUAGE else "rows"
                return False, f"{module} {what} of step {step}: {x:,.0f} against {y:,.0f}"
    return (True, None) if compared else (None, None)
