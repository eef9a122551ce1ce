"""What a profiled run tells the advisor (``mimo-accel layout --from DIR``): each module's config
(the FLOPs shape its header records), its parallel sizes, the cost model learnt while it trained
(the online calibration's last accepted refit of each module, in its step lines' ``online_refits``;
a module never refitted is fitted from its times as ``mimo-accel calibrate`` fits it), its device,
its GPUs and its batch, and how it was built (its headers' ``build``: the language model's PP split,
priced as it ran, and the settings the memory model assumes by default)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Optional

from mimo_accel.costs import CostModel, ModuleCost
from mimo_accel.costs.flops import FlopsShape
from mimo_accel.modules import LANGUAGE
from mimo_accel.profiler.run import ProfileError, read_run
from mimo_accel.tools.layout.memory import JobSettings
from mimo_accel.tools.layout.models import ModelSpec, ModuleModel

__all__ = ["Profiled", "read_profiled"]


@dataclass(frozen=True)
class Profiled:
    model: ModelSpec
    learnt: CostModel
    sizes: dict[str, tuple[int, int, int]]  # module -> (tp, pp, dp) as profiled
    world: int
    device: Optional[str]
    gbs: Optional[int]
    mbs: Optional[int]
    source: str
    notes: list[str] = field(default_factory=list)
    overheads: dict[str, float] = field(default_factory=dict)  # module -> seconds a micro-batch, a replica
    stages: tuple = ()  # the language model's (c, a, b) per profiled stage, where its micro-batches tell them
    replayed_step_s: Optional[float] = None  # the run's step replayed from its measured times (p50)
    planned: bool = False  # whether the run planned and packed (mimo_accel on) or ran upstream's padded batches
    settings: Optional[JobSettings] = None  # what the run's configs say of its memory, where its header records it
    upstream_packing: bool = True  # whether its Bridge packs in its batches (0.7 on), as far as its header says
    split: tuple = (None, None)  # the language model's (first, last) stage layers as it ran (None: even)
    stage_layers: tuple = ()  # the language model's layers on each profiled stage, where its header says


def _learnt(run) -> dict[str, ModuleCost]:
    """Each module's last accepted online refit, in step order."""
    out: dict[str, tuple[int, ModuleCost]] = {}
    for log in run.ranks.values():
        for line in log.steps:
            for r in line.get("online_refits") or ():
                if isinstance(r, dict) and r.get("accepted") and isinstance(r.get("coefficients"), dict):
                    c, step = r["coefficients"], int(r.get("step", line["step"]))
                    if r.get("module") and step >= out.get(r["module"], (-1, None))[0]:
                        out[r["module"]] = (step, ModuleCost(c.get("a", 0.0), c.get("b", 0.0), c.get("k", 0.0)))
    return {m: v for m, (_, v) in out.items()}


def _language_per_micro_batch(run, pp: int) -> Optional[list[tuple[float, float, float]]]:
    """The language model's cost from its ranks' micro-batches: each stage's forward + backward per
    micro-batch (its slowest TP rank) against the micro-batch's real tokens, ``c + a·Σ L + b·Σ L²``
    fitted non-negatively per (replica, stage), each coefficient the median over the replicas:
    ``[(c, a, b)]`` a stage, in stage order (c what a micro-batch costs the stage whatever its
    size). None where the lines lack the per-micro-batch tokens (an older profile) or the
    micro-batches do not tell the terms apart."""
    import numpy as np

    from mimo_accel.balance.replay import places
    from mimo_accel.costs.fit import nnls

    ranks = [(r, log.module, log.dp_rank) for r, log in run.ranks.items() if log.module == LANGUAGE]
    where = places(ranks, {LANGUAGE: pp})
    cells: dict[tuple[int, int], dict[int, list]] = {}  # (replica, stage) -> step -> [times per rank, tokens, sq]
    for rank, (_, replica, stage) in where.items():
        for line in run.ranks[rank].steps[1:]:  # the first step pays for allocation: left out
            micro = line.get("micro") or {}
            fwd, bwd = micro.get(f"{LANGUAGE}_fwd"), micro.get(f"{LANGUAGE}_bwd")
            tok, sq = micro.get("tokens"), micro.get("sq_tokens")
            if not (fwd and bwd and tok and sq) or not len(fwd) == len(bwd) == len(tok) == len(sq):
                return None
            seen = cells.setdefault((replica, stage), {}).setdefault(int(line["step"]), [None, tok, sq])
            t = np.add(fwd, bwd)
            seen[0] = t if seen[0] is None else np.maximum(seen[0], t)
    if not cells:
        return None
    fits: dict[int, list] = {}
    for (replica, stage), steps in cells.items():
        rows = [(1.0, float(n), float(q), float(t)) for time, tok, sq in steps.values()
                for t, n, q in zip(time, tok, sq)]
        x = np.array(rows)
        if len(rows) < 8 or np.ptp(x[:, 1]) <= 0:
            return None
        fits.setdefault(stage, []).append(nnls(x[:, :3] / x[:, 3:4], np.ones(len(rows))))  # relative: noise grows with size
    return [tuple(float(x) for x in np.median(np.array(v), axis=0)) for _, v in sorted(fits.items())]


def _built(run, directory: str, notes: list[str]) -> dict[str, dict]:
    """Each module's build record (its ranks' headers' ``build``: :mod:`mimo_accel.runtime.measuring.job_build`),
    from its lowest rank; ranks of one module that disagree are said."""
    out: dict[str, dict] = {}
    for rank in sorted(run.ranks):
        for module, record in ((run.ranks[rank].header or {}).get("build") or {}).items():
            if module not in out:
                out[module] = record
            elif record != out[module]:
                notes.append(f"{module}: rank {rank} of {directory} was built otherwise than its module's first rank "
                             "(the first rank's settings are used)")
    return out


def first_last(stages) -> Optional[tuple[Optional[int], Optional[int]]]:
    """megatron-core's ``(num_layers_in_first_pipeline_stage, ..._last_...)`` that builds ``stages`` (each
    stage's layers; None for an even end), or None where no first / last split does (a
    ``pipeline_model_parallel_layout`` whose middle stages differ)."""
    stages = [int(n) for n in stages]
    if len(set(stages)) <= 1:
        return None, None
    if len(stages) == 2:
        return stages[0], stages[1]
    middle = set(stages[1:-1])
    if len(middle) != 1:
        return None
    (m,) = middle
    return (stages[0] if stages[0] != m else None), (stages[-1] if stages[-1] != m else None)


def _settings(built: dict[str, dict], directory: str, notes: list[str]) -> Optional[JobSettings]:
    """The memory model's settings from the language model's build record (the job's, where the
    encoders' differ: said), each as its built config says it; None where the header has none."""
    lang = built.get(LANGUAGE)
    if lang is None:
        return None

    fields = ("sequence_parallel", "recompute_granularity", "precision")
    for m, record in built.items():
        differ = [f"{k} {record.get(k)} (the language model's: {lang.get(k)})" for k in fields
                  if m != LANGUAGE and record.get(k) != lang.get(k)]
        if differ:
            notes.append(f"{m} was built with {', '.join(differ)}; the memory model prices every module with the "
                         "language model's")
    precision = lang.get("precision") or "bf16"
    if precision == "fp16":
        notes.append("fp16 priced as bf16 (the same bytes a parameter and an activation)")
        precision = "bf16"
    recompute = lang.get("recompute_granularity") or "none"
    if recompute == "full" and (lang.get("recompute_method") == "block" or (lang.get("recompute_num_layers") or 1) > 1):
        notes.append(f"recompute full ({lang.get('recompute_method')}, {lang.get('recompute_num_layers')} layers) "
                     "priced as every layer's input kept, the rest recomputed")
    distributed = lang.get("distributed_optimizer")
    source = f"the run's built configs in {directory}: each module's TransformerConfig, Bridge's optimizer config"
    if distributed is None:
        distributed = True
        source += " (the distributed optimizer assumed: the run did not say)"
    return JobSettings(sequence_parallel=bool(lang.get("sequence_parallel")), recompute=recompute,
                       distributed_optimizer=bool(distributed), precision=precision, source=source)


def _split(built: dict[str, dict], pp: int, directory: str, notes: list[str]) -> tuple[tuple, tuple]:
    """((first, last), the stages' layers) of the language model as it ran; even with a note where
    its header does not say, or says a split no first / last pair builds."""
    stages = tuple((built.get(LANGUAGE) or {}).get("stage_layers") or ())
    if len(stages) != pp:
        if pp > 1:
            notes.append(f"{LANGUAGE}: the profile does not say how its layers were split over its {pp} stages: priced "
                         "as megatron-core's even split")
        return (None, None), ()
    ends = first_last(stages)
    if ends is None:
        notes.append(f"{LANGUAGE}: built with {' / '.join(map(str, stages))} layers a stage "
                     f"({built[LANGUAGE].get('pipeline_split')}), which no first / last split builds: its layout is "
                     "priced as megatron-core's even split")
        return (None, None), stages
    return ends, stages


def _batch(run) -> tuple[Optional[int], Optional[int]]:
    """(global batch, global micro-batch): the language replicas' samples per step, summed over its
    DP replicas, and the forwards a language rank ran per step."""
    lang = [log for log in run.ranks.values() if log.module == LANGUAGE and log.steps]
    if not lang:
        return None, None
    per_replica: dict[int, list[float]] = {}
    for log in lang:
        per_replica.setdefault(log.dp_rank, []).extend(float(s.get("samples") or 0) for s in log.steps)
    gbs = int(round(sum(statistics.median(v) for v in per_replica.values())))
    calls = [(s.get("timed_calls") or {}).get(f"{LANGUAGE}_fwd") for log in lang for s in log.steps]
    calls = [c for c in calls if isinstance(c, int) and c > 0]
    w = int(statistics.median(calls)) if calls else None
    return (gbs or None), (gbs // w if gbs and w and gbs % w == 0 else None)


def read_profiled(directory: str, model: Optional[ModelSpec] = None) -> Profiled:
    """The run in ``directory``; ``model`` (a ``--model`` file) replaces the configs its header holds.
    ValueError naming the fix: no profile there, no module configs and no ``model``, too few steps to fit."""
    from mimo_accel.profiler.fitting import fit_modules

    try:
        run = read_run(directory)
    except ProfileError as e:
        raise ValueError(f"--from {e}") from None
    layout = run.layout
    flops = (layout.get("flops") or {}).get("modules") or {}
    dps, pps = layout.get("dp") or {}, layout.get("pp") or {}
    names = [m for m in flops if m in dps] or list(dps)
    if not names or LANGUAGE not in names:
        raise ValueError(f"--from {directory}: the profile's header holds no module configs (layout.flops, recorded by "
                         "mimo_accel's profiler from Bridge's provider); give --model FILE with each module's config")
    notes = []
    if model is None:
        mods = {}
        for m in [n for n in names if n != LANGUAGE] + [LANGUAGE]:
            shape = (flops.get(m) or {}).get("shape")
            if not isinstance(shape, dict):
                why = (flops.get(m) or {}).get("why") or "not recorded"
                raise ValueError(f"--from {directory}: module {m!r}'s config is not in the profile ({why}); give "
                                 "--model FILE with its layers, hidden, ffn_hidden, heads, ...")
            mods[m] = ModuleModel.from_shape(m, FlopsShape.from_dict(shape), trained=bool(flops[m].get("trained", True)))
        model = ModelSpec(run.label, mods, source=f"the configs in {directory}",
                          notes=("untied embeddings assumed (the header does not say)",))
    missing = [m for m in names if m not in model.modules]
    if missing:
        raise ValueError(f"--model {model.name}: it has no module {missing[0]!r}, which the profile in {directory} "
                         f"times; name the modules as the run does ({', '.join(names)})")
    sizes = {}
    for m in names:
        dp, pp = int(dps.get(m, 1)), int(pps.get(m, 1))
        ranks = int((flops.get(m) or {}).get("ranks") or dp * pp)
        sizes[m] = (max(1, ranks // (dp * pp)), pp, dp)
    learnt = _learnt(run)
    unfitted = [m for m in names if m not in learnt]
    if unfitted:
        try:
            fitted, _ = fit_modules(run, modules=unfitted)
        except ValueError as e:
            raise ValueError(f"--from {' '.join(str(e).split())}") from None
        learnt.update({m: fitted.modules[m] for m in unfitted})
        notes.append(f"{', '.join(unfitted)}: no online refit in the run; fitted from its times as "
                     "`mimo-accel calibrate` fits them")
    overheads, stages = {}, ()
    measured = _language_per_micro_batch(run, sizes[LANGUAGE][1])
    if measured is not None:
        stages = tuple(measured)
        c, a, b = (sum(stage[i] for stage in stages) for i in range(3))
        learnt[LANGUAGE], overheads[LANGUAGE] = ModuleCost(a, b), c
        notes.append(f"{LANGUAGE}: priced from its micro-batches: {c * 1e3:.1f} ms a micro-batch whatever its size, "
                     f"{a:.3g} s a token, {b:.3g} s a token²" + (
                         f"; its stages {' / '.join(f'{st[0] * 1e3:.1f} ms + {st[1]:.3g} s a token' for st in stages)}"
                         if len(stages) > 1 else ""))
    else:
        notes.append(f"{LANGUAGE}: the profile has no per-micro-batch tokens: what a micro-batch costs whatever its "
                     "size is in its cost per token (layouts with other micro-batch counts are priced less well)")
    gbs, mbs = _batch(run)
    device = (layout.get("flops") or {}).get("device_name") or run.header.get("device")
    from mimo_accel.profiler.replayed import replayed_p50

    replayed = replayed_p50(run)
    features = set((run.header.get("config") or {}).get("features") or ())
    built = _built(run, str(directory), notes)
    settings = _settings(built, str(directory), notes)
    split, stages_built = _split(built, sizes[LANGUAGE][1], str(directory), notes)
    bridge = (run.header.get("versions") or {}).get("megatron-bridge")
    packing = bridge is None or tuple(int(x) for x in bridge.split(".")[:2] if x.isdigit()) >= (0, 7)
    return Profiled(model, CostModel(modules=learnt, fit={"units": "seconds"}), sizes,
                    int(run.world_size or len(run.ranks)), device, gbs, mbs, str(directory), notes, overheads, stages,
                    replayed, {"reorder", "packing"} <= features, settings, packing, split, stages_built)
