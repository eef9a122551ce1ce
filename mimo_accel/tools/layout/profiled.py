"""What a profiled run tells the advisor (``mimo-accel layout --from DIR``): each module's config
(the FLOPs shape its header records), its parallel sizes, the cost model learnt while it trained
(the online calibration's last accepted refit of each module, in its step lines' ``online_refits``;
a module never refitted is fitted from its times as ``mimo-accel calibrate`` fits it), its device,
its GPUs and its batch."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Optional

from mimo_accel.costs import CostModel, ModuleCost
from mimo_accel.costs.flops import FlopsShape
from mimo_accel.modules import LANGUAGE
from mimo_accel.profiler.run import ProfileError, read_run
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
    from mimo_accel.tools.calibrate.fitting import fit_modules

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
    gbs, mbs = _batch(run)
    device = (layout.get("flops") or {}).get("device_name") or run.header.get("device")
    return Profiled(model, CostModel(modules=learnt, fit={"units": "seconds"}), sizes,
                    int(run.world_size or len(run.ranks)), device, gbs, mbs, str(directory), notes)
