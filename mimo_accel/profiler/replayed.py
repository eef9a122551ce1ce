"""The step each rank would see on a device of its own: each step's measured forward and backward
times per rank and micro-batch (the step line's ``micro``) replayed through the step model's
schedule (:func:`mimo_accel.balance.replay.replay`), beside the step the plan predicted, and who
bounds it.

- a rank's place (:func:`mimo_accel.balance.replay.places`): its module and DP replica from its
  header; its PP stage from its rank within the replica (Bridge's MegatronMIMO grids order tp,
  cp, dp, pp: pp slowest), the module's PP from the header's ``layout["pp"]`` (1 where absent); a
  stage's TP/CP ranks: the slowest per op;
- a frozen module (``layout["flops"]``' ``trained`` false): forwards only;
- the predicted step: the step lines' ``predicted_step_s`` where the run wrote one (the step model's
  time of the step's plan, in the cost model's units: seconds when calibrated);
- each module's **busy share** of a step: the mean over its devices (replica × PP stage) of the
  device's busy time (its ops' summed measured time) over the replayed step
  (``per_module.<m>.busy_share_p50``: its p50 over the counted steps); ``busy_share_max_p50``: of
  its busiest device's; **wait share** (``wait_share_p50``): 1 − busy share, the part of the step
  its devices wait (for inputs, in the pipeline's fill and drain, for the step's end);
- the **bound module** of a step: the module whose busiest device is busy the largest share of it
  (ties: an encoder, the first by name, the language model last:
  :func:`mimo_accel.balance.replay.bound_module`); a side's ``bound_module``: the module that
  bounds the most counted steps (ties alike), ``bound_steps``: how many each bounds.

A profile without per-micro-batch times (an older run) has no replay: the side's
``step_time_replayed_skipped`` says why (the console says it once), else null; then the shares
and ``bound_module`` are null too.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any, Optional

from mimo_accel.balance.replay import Replay, bound_module, module_shares, places, replay_ranks
from mimo_accel.modules import LANGUAGE
from mimo_accel.profiler.run import Run
from mimo_accel.profiler import record_number as _num

NO_MICRO = ("no per-micro-batch times in this profile (an older run, or no module timed): the replayed "
            "step is skipped")


def _one_step(lines: dict[int, dict], placed, dps, pp, frozen) -> Replay:
    """The replay of one step (``lines``: rank -> step line). LookupError: no per-micro-batch
    times; ValueError: why else not."""
    times = {}
    for rank, line in lines.items():
        micro = line.get("micro")
        if not isinstance(micro, dict):
            raise LookupError(NO_MICRO)
        m = placed[rank][0]
        times[rank] = (micro.get(f"{m}_fwd") or [], micro.get(f"{m}_bwd") or [])
    return replay_ranks(times, placed, dps, pp, frozen)


def run_steps(run: Run, warmup: int = 1) -> tuple[dict[int, dict[int, dict[str, Any]]], dict[str, list[int]],
                                                 list[int], list[int]]:
    """(each rank's step lines by step, the warm-up left out; each module's ranks; the steps with a
    step time; the warm-up steps left out, none where the run is not longer than it)."""
    every = sorted({int(r["step"]) for log in run.ranks.values() for r in log.steps})
    skipped = every[:warmup] if warmup > 0 and len(every) > warmup else []
    steps_of = {rank: {int(r["step"]): r for r in log.steps if int(r["step"]) not in skipped}
                for rank, log in run.ranks.items()}
    modules: dict[str, list[int]] = defaultdict(list)
    for rank in sorted(run.ranks):
        modules[run.ranks[rank].module].append(rank)
    counted = sorted({s for recs in steps_of.values() for s, r in recs.items() if _num(r, "step_time_s") is not None})
    return steps_of, modules, counted, skipped


def replayed_p50(run: Run) -> Optional[float]:
    """The run's step replayed, a device per rank (p50 after the warm-up step), as ``mimo-accel
    report`` gives it; None where the profile has no per-micro-batch times."""
    steps_of, modules, counted, _ = run_steps(run)
    return replayed_steps(run, steps_of, modules, counted, lambda v: statistics.median(v) if v else None)[
        "step_time_replayed_p50"]


def _frozen(layout: dict, dps: dict) -> frozenset:
    flops = (layout.get("flops") or {}).get("modules") or {}
    return frozenset(m for m, v in flops.items() if m in dps and v.get("trained") is False)


def replayed_steps(run: Run, steps_of: dict[int, dict[int, dict[str, Any]]], modules: dict[str, list[int]],
                   counted: Sequence[int], p50: Callable[[Sequence[float]], Optional[float]]) -> dict[str, Any]:
    """``step_time_replayed_p50`` and ``step_time_predicted_p50`` (None where not known), how far
    the prediction is from the replay step by step (``step_time_predicted_error_p50_last_half``:
    the median of ``|predicted / replayed − 1|`` over the last half of the steps that have both),
    each module's shares (``shares``: module -> ``busy_share_p50``, ``busy_share_max_p50``,
    ``wait_share_p50``), ``bound_module`` and ``bound_steps``, their series over the ``counted``
    steps, and why a replay was skipped (``step_time_replayed_skipped``)."""
    layout = run.layout or {}
    dps = {m: int(max(run.ranks[r].dp_size for r in ranks)) for m, ranks in modules.items() if ranks}
    pp = dict(layout.get("pp") or {})
    frozen = _frozen(layout, dps)
    placed = places(((r, m, run.ranks[r].dp_rank) for m, ranks in modules.items() for r in ranks), pp)
    replayed: dict[int, Replay] = {}
    predicted, why = {}, None
    for s in counted:
        lines = {rank: recs[s] for rank, recs in steps_of.items() if s in recs}
        plans = [v for line in lines.values() if (v := _num(line, "predicted_step_s")) is not None]
        if plans:
            predicted[s] = max(plans)
        if why is not None:
            continue
        try:
            replayed[s] = _one_step(lines, placed, dps, pp, frozen)
        except (LookupError, ValueError) as e:  # said once below; the rest of the report stands
            why = str(e)
    if why is not None:
        replayed, why = {}, why if why == NO_MICRO else f"the replayed step is skipped: {why}"
    steps = sorted(replayed)
    span = {s: replayed[s].makespan for s in steps}
    both = [s for s in steps if s in predicted and span[s] > 0]
    late = both[len(both) // 2:]  # the plans of the first steps are priced before the model is in seconds
    shares = {s: module_shares(replayed[s]) for s in steps}
    bound = {s: b for s in steps if (b := bound_module(shares[s])) is not None}
    per_module = {m: {"busy_share_p50": p50([shares[s][m].busy for s in steps]),
                      "busy_share_max_p50": p50([shares[s][m].busy_max for s in steps]),
                      "wait_share_p50": p50([shares[s][m].wait for s in steps])}
                  for m in dps}
    counts = {m: sum(1 for b in bound.values() if b == m) for m in sorted(set(bound.values()))}
    top = max(counts.values(), default=0)
    most = [m for m, n in counts.items() if n == top]
    return {"step_time_replayed_p50": p50([span[s] for s in steps]),
            "step_time_predicted_p50": p50([predicted[s] for s in sorted(predicted)]),
            "step_time_predicted_error_p50_last_half": p50([abs(predicted[s] / span[s] - 1.0) for s in late]),
            "step_time_replayed_skipped": why,
            "shares": per_module,
            "bound_module": next((m for m in most if m != LANGUAGE), most[0]) if most else None,
            "bound_steps": counts,
            "replayed_series": {"step": steps, "step_time_replayed_s": [span[s] for s in steps],
                                "step_time_predicted_s": [predicted.get(s) for s in steps],
                                "busy_share": {m: [shares[s][m].busy for s in steps] for m in dps},
                                "bound_module": [bound.get(s) for s in steps]}}
