"""The figures of one logged step (pure: no store, no writer): what each rank contributes
(:func:`rank_figures`, from its profile header and step line) and the scalars and histograms
the job's last rank writes from every rank's (:func:`step_scalars`, :func:`step_histograms`,
:func:`model_scalars`). The tags and their definitions: :mod:`~mimo_accel.runtime.measuring.metrics`;
the online calibration learns from the same figures."""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Iterable, Optional

from mimo_accel.balance.replay import module_shares, places, replay_ranks
from mimo_accel.costs.flops import FlopsShape, peak_tflops_of, throughput
from mimo_accel.modules import LANGUAGE
from mimo_accel.profiler.recorder import UNNAMED_ENCODER, module_regions
from mimo_accel.profiler.step_line import module_seconds, record_number

__all__ = ["PREFIX", "model_scalars", "rank_figures", "step_histograms", "step_scalars"]

PREFIX = "mimo_accel"  # every tag's first part


def rank_figures(header: dict, record: dict, times: bool = False, language_micro: bool = False) -> dict:
    """What one rank contributes to a logged step: its module and replica (from its profile
    header), its module's forward + backward seconds, what it read, what it computed (samples; the
    language model's real tokens Σ L, Σ L², an encoder's rows Σ rows, Σ rows²), its step's wall
    time, and the plan's prediction. ``times``: also each micro-batch's forward and backward
    (``micro_us``, for the step's replay; only the iterations that are written need them).
    ``language_micro``: a language rank's micro-batches' counts and times too (``micro``: the online
    calibration of a step plan learns from them; a module of one replica gives them always)."""
    module = str(header.get("module", "unknown"))
    rows, sq_rows = ("tokens", "sq_tokens") if module == LANGUAGE else (f"{module}_rows", f"{module}_sq_rows")
    spreads: dict = {}
    table = record.get("predicted_spreads")
    if isinstance(table, dict):
        spreads = {str(m): v for m in table if (v := record_number(table, m)) is not None}
    elif (single := record_number(record, "predicted_spread")) is not None:
        spreads = {"": single}  # one figure for the worst module (a plan that priced one encoder)
    return {
        "rank": int(header.get("rank", 0)),
        "module": module,
        "dp_rank": int(header.get("dp_rank", 0)),
        "dp_size": int(header.get("dp_size", 1)),
        # the module's PP stages: the online calibration sums a replica's stages
        "stages": int(((header.get("layout") or {}).get("pp") or {}).get(module) or 1),
        "time_s": module_seconds(record, module_regions(module)),
        "samples_read": record_number(record, "samples_read") or 0,
        "bytes_read": record_number(record, "bytes_read") or 0,
        "bytes_exchanged": record_number(record, "bytes_exchanged") or 0,
        "tokens": record_number(record, "tokens") if module == LANGUAGE else None,
        "samples": record_number(record, "samples"),
        "rows": record_number(record, rows),
        "sq_rows": record_number(record, sq_rows),
        "step_time_s": record_number(record, "step_time_s"),
        "spreads": spreads,
        "plan_wait_s": record_number(record, "plan_wait_s"),
        "features": _features(module, record),
        # per micro-batch only where the calibration uses them: a module of one replica, the language model's
        # under a step plan
        "micro": _micro_figures(module, record) if (language_micro if module == LANGUAGE
                                                    else int(header.get("dp_size", 1)) == 1) else None,
        "micro_us": _micro_times(module, record) if times else None,
    }


def _micro_times(module: str, record: dict) -> Optional[dict]:
    """Each micro-batch's forward and backward in whole microseconds (``{"fwd": [...], "bwd":
    [...]}``: integers keep a rank's figures short); None where the line has no forward times."""
    micro = record.get("micro")
    forward, backward = (micro.get(r) if isinstance(micro, dict) else None for r in module_regions(module))
    if not isinstance(forward, list) or not forward:
        return None
    times = [*forward, *(backward if isinstance(backward, list) else ())]
    if not all(isinstance(t, (int, float)) and math.isfinite(t) for t in times):
        return None  # a time the line could not hold (null): no replay of this step
    return {"fwd": [round(float(t) * 1e6) for t in forward],
            "bwd": [round(float(t) * 1e6) for t in backward] if isinstance(backward, list) else []}


def _micro_figures(module: str, record: dict) -> Optional[dict]:
    """A module's micro-batches this step, where the line has one time and one count per forward
    in call order: ``{"features": [[rows, Σ rows², items], ...], "seconds": [fwd + bwd, ...]}``
    (the language model's: tokens, Σ tokens², samples, each micro-batch holding an equal share of
    the step's samples; a frozen encoder's seconds are its forwards); None otherwise (a line
    without them, or lists that do not pair one to one)."""
    from mimo_accel.costs.online import features_of

    micro = record.get("micro")
    if not isinstance(micro, dict):
        return None
    forward, backward = (micro.get(region) for region in module_regions(module))
    if module == LANGUAGE:
        samples = record_number(record, "samples")
        calls = len(forward) if isinstance(forward, list) else 0
        if not calls or samples is None or samples % calls:
            return None
        counts = [micro.get("tokens"), micro.get("sq_tokens"), [samples // calls] * calls]
    else:
        counts = [micro.get(f"{module}_{name}") for name in features_of(module)]
    lists = [forward, *counts] + ([backward] if backward is not None else [])
    if not all(isinstance(v, list) and v for v in lists) or len({len(v) for v in lists}) != 1:
        return None
    seconds = [float(f) + float(b) for f, b in zip(forward, backward or [0.0] * len(forward))]
    return {"features": [list(map(float, row)) for row in zip(*counts)], "seconds": seconds}


def _features(module: str, record: dict) -> Optional[list]:
    """What the module computed this step, as the online calibration learns from it (an encoder's
    rows, Σ rows², items; the language model's tokens, Σ tokens², samples); None where the line lacks them."""
    from mimo_accel.costs.online import features_of

    keys = [name if module == LANGUAGE else f"{module}_{name}" for name in features_of(module)]
    values = [record_number(record, k) for k in keys]
    return None if any(v is None for v in values) else values


def _ratio(values: list) -> Optional[float]:
    mean = sum(values) / len(values) if values else 0.0
    return max(values) / mean if mean > 0 else None


def step_scalars(figures: Iterable[dict], flops: Optional[dict] = None) -> dict[str, float]:
    """The scalars of one step from every rank's :func:`rank_figures` (see the module docstring);
    ``flops``: the profile header's ``layout["flops"]`` (:mod:`mimo_accel.runtime.measuring.model_flops`)."""
    figures = sorted(figures, key=lambda f: f["rank"])
    by_module: dict[str, list[dict]] = defaultdict(list)
    for f in figures:
        by_module[f["module"]].append(f)
    out: dict[str, float] = {}
    for module, ranks in by_module.items():
        if module == "unknown":  # a rank whose place in the layout the profiler never learnt: reads only
            continue
        p = f"{PREFIX}/{module}"
        replicas = _per_replica(ranks, "time_s")  # a replica's time: its slowest rank's
        if replicas:
            order = sorted(replicas)
            times = [replicas[d] for d in order]
            out[f"{p}/slowest_replica_s"] = max(times)
            out[f"{p}/slowest_replica"] = order[times.index(max(times))]
            if (ratio := _ratio(times)) is not None:
                out[f"{p}/straggler"] = ratio
        out[f"{p}/samples_read_per_rank"] = sum(f["samples_read"] for f in ranks) / len(ranks)
        out[f"{p}/bytes_read_per_rank"] = sum(f["bytes_read"] for f in ranks) / len(ranks)
    # the plan's predictions: the same on every rank that got a planned batch
    planned: dict[str, float] = {}
    for f in figures:
        for m, v in f["spreads"].items():
            planned[m] = max(planned.get(m, v), v)
    single = planned.pop("", None)
    if single is not None and not planned:  # the plan priced one encoder: the layout's first (in rank order)
        encoders = [m for m in by_module if m not in (LANGUAGE, "unknown")]
        planned = {encoders[0] if encoders else UNNAMED_ENCODER: single}
    for m, v in planned.items():
        out[f"{PREFIX}/{m}/straggler_planned"] = v
        if (measured := out.get(f"{PREFIX}/{m}/straggler")) is not None:
            out[f"{PREFIX}/{m}/predicted_error"] = abs(v - measured)
    tokens = _language_tokens(figures)
    if tokens:
        out[f"{PREFIX}/{LANGUAGE}/tokens_max"] = max(tokens.values())
        out[f"{PREFIX}/{LANGUAGE}/tokens_mean"] = sum(tokens.values()) / len(tokens)
    if len(tokens) > 1 and (ratio := _ratio(list(tokens.values()))) is not None:
        out[f"{PREFIX}/{LANGUAGE}/tokens_straggler"] = ratio
    for key in ("samples", "bytes", "bytes_exchanged"):
        name = "samples_read" if key == "samples" else "bytes_read" if key == "bytes" else key
        out[f"{PREFIX}/reads/{key}"] = sum(f[name] for f in figures)
    waits = [w for f in figures if (w := f.get("plan_wait_s")) is not None]
    if waits:  # the training thread's wait for the plans it was to train, the slowest rank's
        out[f"{PREFIX}/plan_wait_s"] = max(waits)
    out.update(_throughput_scalars(by_module, figures, flops or {}))
    out.update(_busy_scalars(figures, flops or {}))
    return out


def _busy_scalars(figures: list[dict], flops: dict) -> dict[str, float]:
    """Each module's busy share of the step, replayed from every rank's micro-batch times as the
    report replays a profile's (:mod:`mimo_accel.balance.replay`: the same placement, the same
    schedule); none where a rank's times are missing or do not make a step (the replay's
    ValueError)."""
    ranks = [f for f in figures if f["module"] != "unknown"]
    if not ranks or any(not f.get("micro_us") for f in ranks):
        return {}
    dps: dict[str, int] = {}
    stages: dict[str, int] = {}
    for f in ranks:
        dps[f["module"]] = max(dps.get(f["module"], 1), int(f.get("dp_size") or 1))
        stages[f["module"]] = int(f.get("stages") or 1)
    frozen = {m for m, v in (flops.get("modules") or {}).items() if m in dps and v.get("trained") is False}
    placed = places(((f["rank"], f["module"], f["dp_rank"]) for f in ranks), stages)
    # in microseconds as gathered: a share is a ratio of times, whatever their unit
    times = {f["rank"]: (f["micro_us"]["fwd"], f["micro_us"]["bwd"]) for f in ranks}
    try:
        step = replay_ranks(times, placed, dps, stages, frozen)
    except Exception:  # an optional figure: a step its times cannot replay has none, and training goes on
        return {}
    return {f"{PREFIX}/{m}/busy_share": v.busy for m, v in module_shares(step).items()}


def _throughput_scalars(by_module: dict[str, list[dict]], figures: list[dict], flops: dict) -> dict[str, float]:
    """Each module's samples/s, tokens/s per GPU, TFLOP/s per GPU and MFU this step (the figures
    that can be computed: see :func:`mimo_accel.costs.flops.throughput`)."""
    times = [t for f in figures if (t := f.get("step_time_s")) is not None]
    if not times:
        return {}
    table = flops.get("modules") or {}
    peak = peak_tflops_of(flops.get("device_name"))
    out: dict[str, float] = {}
    for module, ranks in by_module.items():
        if module == "unknown":
            continue
        own = table.get(module) or {}
        work = {k: sum(v.values()) if (v := _per_replica(ranks, k)) else None for k in ("samples", "rows", "sq_rows")}
        figures_of = throughput(samples=work["samples"], tokens=work["rows"], sq_tokens=work["sq_rows"],
                                step_time_s=max(times), ranks=own.get("ranks") or len(ranks),
                                shape=FlopsShape.from_dict(own["shape"]) if own.get("shape") else None,
                                trained=own.get("trained", True), peak_tflops=peak[1] if peak else None)
        out.update({f"{PREFIX}/{module}/{k}": v for k, v in figures_of.items() if v is not None})
    return out


def _per_replica(figures: Iterable[dict], key: str) -> dict[int, float]:
    """``key`` of each DP replica of ``figures`` this step (the most any of its ranks counted)."""
    values: dict[int, float] = {}
    for f in figures:
        if (v := f.get(key)) is not None:
            values[f["dp_rank"]] = max(values.get(f["dp_rank"], 0.0), v)
    return values


def _language_tokens(figures: Iterable[dict]) -> dict[int, float]:
    """The real tokens of each language replica this step (the most any of its ranks counted)."""
    return _per_replica([f for f in figures if f["module"] == LANGUAGE], "tokens")


def step_histograms(figures: Iterable[dict]) -> dict[str, list[float]]:
    """The distributions of one step, one value per replica: ``language/tokens``."""
    tokens = _language_tokens(figures)
    return {f"{PREFIX}/{LANGUAGE}/tokens": [tokens[d] for d in sorted(tokens)]} if tokens else {}


def model_scalars(model, figures: Iterable[dict]) -> dict[str, float]:
    """The cost model in use for each module of the step (online calibration): its coefficients
    ``cost_model/a``, ``/b``, ``/k``."""
    out: dict[str, float] = {}
    for module in sorted({f["module"] for f in figures if f.get("module") not in (None, "unknown")}):
        cost = model.of(module)
        for name in ("a", "b", "k"):
            out[f"{PREFIX}/{module}/cost_model/{name}"] = getattr(cost, name)
    return out
