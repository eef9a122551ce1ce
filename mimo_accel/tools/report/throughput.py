"""Each module's throughput in a profile: per counted step, its samples/s, tokens/s per GPU, model
TFLOP/s per GPU and MFU (:func:`mimo_accel.costs.flops.throughput`, the definitions the training
job's TensorBoard figures use), reported as p50 over the steps in the side's ``per_module.<m>``.

- a module's work in a step: summed over its DP replicas (a replica's: the most any of its TP/PP
  ranks counted) of ``samples``, and of the language model's real tokens (``tokens`` = Σ L,
  ``sq_tokens`` = Σ L²) or an encoder's rows (``<m>_rows``, ``<m>_sq_rows``);
- the step's time: the report's step time (the longest ``step_time_s`` of any rank);
- per GPU: over the module's ranks, tp·cp·pp·dp as the profile header's ``layout["flops"]`` has
  them (:mod:`mimo_accel.runtime.measuring.model_flops`), else the ranks whose files name the module;
- FLOPs: from the module's FLOPs shape in that header (null without one: a profile of a job that
  did not start through Bridge's ``train_megatron_mimo``, or a model the count leaves out, its
  reason in ``per_module.<m>.flops_note``); trained 3× forward, frozen 1×;
- MFU: over the peak given (``--peak-tflops``) or else the device table's peak for the header's
  ``device_name``; null where neither is known (a CPU run).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any, Optional

from mimo_accel.costs.flops import FlopsShape, peak_tflops_of, throughput
from mimo_accel.modules import LANGUAGE
from mimo_accel.profiler.run import Run
from mimo_accel.profiler import record_number as _num

FIGURES = ("samples_per_s", "tokens_per_s_per_gpu", "tflops_per_gpu", "mfu")


def peak_of(run: Run, given: Optional[float] = None) -> tuple[Optional[float], Optional[str]]:
    """The peak (TFLOP/s per GPU) MFU is over, and where it comes from: ``given``, else the device
    table's entry for the device the profile header names; (None, None) where neither is known."""
    if given is not None:
        return float(given), "--peak-tflops"
    name = ((run.layout.get("flops") or {}).get("device_name"))
    found = peak_tflops_of(name)
    return (found[1], f"{found[0]}, dense BF16 (device table)") if found else (None, None)


def _replica_sums(run: Run, steps_of: dict, ranks: list[int], key: str) -> dict[int, float]:
    """``key`` summed over the DP replicas of ``ranks`` per step (a replica's: max over its ranks)."""
    by_step: dict[int, dict[int, float]] = defaultdict(dict)
    for rank in ranks:
        dp = run.ranks[rank].dp_rank
        for st, r in steps_of[rank].items():
            if (v := _num(r, key)) is not None:
                by_step[st][dp] = max(by_step[st].get(dp, 0.0), v)
    return {st: sum(v.values()) for st, v in by_step.items()}


def module_throughput(run: Run, steps_of: dict, step_time: dict[int, float], modules: dict[str, list[int]],
                      order: list[str], peak: Optional[float],
                      p50: Callable[[Sequence[float]], Optional[float]]) -> dict[str, dict[str, Any]]:
    """``{module: {<figure>_p50, flops_shape, trained, gpus, [flops_note]}}`` over the steps of
    ``step_time`` (see the module docstring); ``p50``: the report's median."""
    table = (run.layout.get("flops") or {}).get("modules") or {}
    out: dict[str, dict[str, Any]] = {}
    for m in order:
        own = table.get(m) or {}
        ranks = modules.get(m, [])
        gpus = int(own.get("ranks") or len(ranks))
        shape = FlopsShape.from_dict(own["shape"]) if own.get("shape") else None
        keys = ("tokens", "sq_tokens") if m == LANGUAGE else (f"{m}_rows", f"{m}_sq_rows")
        samples, rows, sq_rows = (_replica_sums(run, steps_of, ranks, k) for k in ("samples", *keys))
        series: dict[str, list[float]] = defaultdict(list)
        for st, seconds in sorted(step_time.items()):
            figures = throughput(samples=samples.get(st), tokens=rows.get(st), sq_tokens=sq_rows.get(st),
                                 step_time_s=seconds, ranks=gpus, shape=shape, trained=own.get("trained", True),
                                 peak_tflops=peak)
            for k, v in figures.items():
                if v is not None:
                    series[k].append(v)
        out[m] = {**{f"{k}_p50": p50(series[k]) for k in FIGURES}, "gpus": gpus,
                  "trained": own.get("trained", True) if own else None,
                  "flops_shape": own.get("shape"),
                  **({"flops_note": own["why"]} if own.get("why") else
                     {} if own else {"flops_note": "no FLOPs shape in the profile header"})}
    return out
