"""The step each rank would see on a device of its own: each step's measured forward and backward
times per rank and micro-batch (the step line's ``micro``) replayed through the step model's
schedule (:func:`mimo_accel.balance.replay.replay`), beside the step the plan predicted.

- a rank's place: its module and DP replica from its header; its PP stage from its rank within the
  replica (Bridge's MegatronMIMO grids order tp, cp, dp, pp: pp slowest), the module's PP from
  the header's ``layout["pp"]`` (1 where absent); a stage's TP/CP ranks: the slowest per op;
- a frozen module (``layout["flops"]``' ``trained`` false): forwards only;
- the predicted step: the step lines' ``predicted_step_s`` where the run wrote one (the step model's
  time of the step's plan, in the cost model's units: seconds when calibrated).

A profile without per-micro-batch times (an older run) has no replay: the side's
``step_time_replayed_skipped`` says why (the console says it once), else null.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any, Optional

import numpy as np

from mimo_accel.balance.replay import replay
from mimo_accel.profiler.run import Run
from mimo_accel.profiler import record_number as _num

NO_MICRO = ("no per-micro-batch times in this profile (an older run, or no module timed): the replayed "
            "step is skipped")


def _places(run: Run, modules: dict[str, list[int]], pp: dict) -> dict[int, tuple[str, int, int]]:
    """Each rank's (module, DP replica, PP stage)."""
    out = {}
    for m, ranks in modules.items():
        replicas: dict[int, list[int]] = defaultdict(list)
        for rank in sorted(ranks):
            replicas[run.ranks[rank].dp_rank].append(rank)
        stages = int(pp.get(m, 1) or 1)
        for r, members in replicas.items():
            per = max(1, len(members) // stages)
            for i, rank in enumerate(members):
                out[rank] = (m, r, min(i // per, stages - 1))
    return out


def _one_step(lines: dict[int, dict], places, dps, pp, frozen) -> float:
    """The replayed makespan of one step (``lines``: rank -> step line). ValueError: why not."""
    times: dict[str, dict[tuple[int, int], np.ndarray]] = {"F": {}, "B": {}}
    for rank, line in lines.items():
        m, r, p = places[rank]
        micro = line.get("micro")
        if not isinstance(micro, dict):
            raise LookupError(NO_MICRO)
        for kind, region in (("F", f"{m}_fwd"), ("B", f"{m}_bwd")):
            if kind == "B" and m in frozen:
                continue
            got = np.asarray(micro.get(region) or [], dtype=np.float64)
            seen = times[kind].get((m, r, p))
            if seen is not None and seen.shape != got.shape:
                raise ValueError(f"the ranks of {m} replica {r} stage {p} timed {seen.size} and {got.size} micro-batches")
            times[kind][m, r, p] = got if seen is None else np.maximum(seen, got)
    counts = {v.size for table in times.values() for v in table.values()}
    if len(counts) != 1 or 0 in counts:
        raise ValueError(f"the ranks timed different numbers of micro-batches in a step ({sorted(counts)})")
    w = counts.pop()
    arrays = {}
    for kind, table in times.items():
        arrays[kind] = {}
        for m in dps:
            if kind == "B" and m in frozen:
                continue
            a = np.zeros((dps[m], int(pp.get(m, 1) or 1), w))
            for r in range(dps[m]):
                for p in range(a.shape[1]):
                    if (m, r, p) not in table:
                        raise ValueError(f"no rank of {m} replica {r} stage {p} is in the profile")
                    a[r, p] = table[m, r, p]
            arrays[kind][m] = a
    stages = {m: int(pp.get(m, 1) or 1) for m in dps}
    return replay(arrays["F"], arrays["B"], dps, w, stages=stages, frozen=frozen).makespan


def replayed_steps(run: Run, steps_of: dict[int, dict[int, dict[str, Any]]], modules: dict[str, list[int]],
                   counted: Sequence[int], p50: Callable[[Sequence[float]], Optional[float]]) -> dict[str, Any]:
    """``step_time_replayed_p50`` and ``step_time_predicted_p50`` (None where not known), how far
    the prediction is from the replay step by step (``step_time_predicted_error_p50_last_half``:
    the median of ``|predicted / replayed − 1|`` over the last half of the steps that have both),
    their series over the ``counted`` steps, and why a replay was skipped
    (``step_time_replayed_skipped``)."""
    layout = run.layout or {}
    dps = {m: int(max(run.ranks[r].dp_size for r in ranks)) for m, ranks in modules.items() if ranks}
    pp = dict(layout.get("pp") or {})
    flops = (layout.get("flops") or {}).get("modules") or {}
    frozen = frozenset(m for m, v in flops.items() if m in dps and v.get("trained") is False)
    places = _places(run, modules, pp)
    replayed, predicted, why = {}, {}, None
    for s in counted:
        lines = {rank: recs[s] for rank, recs in steps_of.items() if s in recs}
        plans = [v for line in lines.values() if (v := _num(line, "predicted_step_s")) is not None]
        if plans:
            predicted[s] = max(plans)
        if why is not None:
            continue
        try:
            replayed[s] = _one_step(lines, places, dps, pp, frozen)
        except (LookupError, ValueError) as e:  # said once below; the rest of the report stands
            why = str(e)
    if why is not None:
        replayed, why = {}, why if why == NO_MICRO else f"the replayed step is skipped: {why}"
    steps = sorted(replayed)
    both = [s for s in steps if s in predicted and replayed[s] > 0]
    late = both[len(both) // 2:]  # the plans of the first steps are priced before the model is in seconds
    return {"step_time_replayed_p50": p50([replayed[s] for s in steps]),
            "step_time_predicted_p50": p50([predicted[s] for s in sorted(predicted)]),
            "step_time_predicted_error_p50_last_half": p50([abs(predicted[s] / replayed[s] - 1.0) for s in late]),
            "step_time_replayed_skipped": why,
            "replayed_series": {"step": steps, "step_time_replayed_s": [replayed[s] for s in steps],
                                "step_time_predicted_s": [predicted.get(s) for s in steps]}}
