"""``mimo-accel simulate --layout``: the step a pipeline layout runs, per workload, under each planner.

``--layout reference-27b`` is upstream's one validated MegatronMIMO workflow (Megatron-Bridge,
``tutorials/megatron_mimo/qwen35-vl-non-colocated-sft.md``): ``images=tp1,pp1,dp1
language=tp4,pp2,dp2 mbs=2 gbs=32``. Any layout is a spec of the same grammar: one
``NAME=tpT,ppP,dpD`` per module (the language model is ``language``), ``mbs=`` the global
micro-batch, ``gbs=`` the global batch, and optionally ``frozen=NAME[,NAME]`` (encoders that do not
train). A step is W = gbs / mbs micro-batches.

For each workload (the shipped profiles, or ``--workload``), ``--steps`` steps of gbs samples are
drawn (seeded), every module of every sample is priced as the planner prices it at run time (the
cost index through :class:`~mimo_accel.planner.CostIndexPlanner` and the cost model), and each
step's modelled time (:func:`mimo_accel.balance.step_time`: the 1F1B pipeline with each encoder
as the stage before the language model's first stage) is averaged over the steps for:

* ``original``: the samples as they come;
* ``upstream``: Bridge's merged reorder with its defaults
  (:func:`mimo_accel.balance.peers.merged_reorder_order` on patches, G = lcm(DPs), each
  micro-batch alone);
* ``pr4608``: PR #4608's equal-size LPT on patches over max(DPs) groups, each micro-batch alone;
* ``mimo_accel``: :func:`mimo_accel.balance.plan_step` over the step's micro-batches;
* ``bound``: the busiest module's work over its ranks, max over modules of (the module's summed
  cost in the step) / (its DP × its PP stages): no step is shorter.

JSON (format ``mimo-accel-simulate-step/1``): format, layout{spec, modules{M: {tp, pp, dp}}, mbs,
gbs, micro_batches, grid, frozen[]}, cost_model{source}, steps, seed, notes[], elapsed_s,
rows[]: {workload, samples (in the steps modelled), step_time{original, upstream, pr4608, mimo_accel, bound},
over_bound{original, upstream, pr4608, mimo_accel}, vs_original{upstream, pr4608, mimo_accel},
plan_ms{upstream, pr4608, mimo_accel: {p50, max}}}; times in the cost model's units (seconds
for a calibrated model).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
from rich.console import Console
from rich.table import Table

from mimo_accel.balance import lpt_order, plan_step, step_time
from mimo_accel.balance.peers import merged_reorder_costs, merged_reorder_order
from mimo_accel.costs import CostModel
from mimo_accel.modules import LANGUAGE, Modules, module
from mimo_accel.planner import CostIndexPlanner
from mimo_accel.workloads import Profile, list_profiles, load_profile

__all__ = ["LAYOUT_FORMAT", "PRESETS", "STEP_PLANS", "LayoutSpec", "parse_layout", "render_layout",
           "simulate_layout"]

LAYOUT_FORMAT = "mimo-accel-simulate-step/1"
PRESETS = {"reference-27b": "images=tp1,pp1,dp1 language=tp4,pp2,dp2 mbs=2 gbs=32"}
STEP_PLANS = ("original", "upstream", "pr4608", "mimo_accel")
LABELS = {"original": "original", "upstream": "upstream merged", "pr4608": "PR #4608", "mimo_accel": "mimo_accel",
          "bound": "bound"}

_MODULE = re.compile(r"^tp(\d+),pp(\d+),dp(\d+)$")
_EXAMPLE = "e.g. images=tp1,pp1,dp1 language=tp4,pp2,dp2 mbs=2 gbs=32 [frozen=images]"


@dataclass(frozen=True)
class LayoutSpec:
    """A checked layout: its modules (tp, pp, dp), the global micro-batch and batch, the frozen encoders."""

    spec: str
    modules: Modules
    mbs: int
    gbs: int
    frozen: tuple[str, ...] = ()

    @property
    def micro_batches(self) -> int:
        return self.gbs // self.mbs

    @property
    def stages(self) -> dict[str, int]:
        return {LANGUAGE: self.modules[LANGUAGE].pp}


def _bad(part: str, fix: str) -> ValueError:
    return ValueError(f"--layout: {part!r}: {fix}")


def _count(part: str, key: str, value: str) -> int:
    if not value.isdigit() or int(value) < 1:
        raise _bad(part, f"{key} must be a positive whole number of samples")
    return int(value)


def parse_layout(text: str) -> LayoutSpec:
    """A preset name (:data:`PRESETS`) or a spec; ValueError naming the bad part and the fix."""
    name = str(text).strip()
    if "=" not in name:
        if name not in PRESETS:
            raise _bad(name, f"no such preset; give one of {', '.join(PRESETS)}, or a spec ({_EXAMPLE})")
        name = PRESETS[name]
    mods, sizes, frozen = [], {}, ()
    for part in name.split():
        key, _, value = part.partition("=")
        if not key or not value:
            raise _bad(part, f"give NAME=tpT,ppP,dpD, mbs=N, gbs=N or frozen=NAME ({_EXAMPLE})")
        if key in ("mbs", "gbs"):
            if key in sizes:
                raise _bad(part, f"{key} is given twice; give it once")
            sizes[key] = _count(part, key, value)
        elif key == "frozen":
            frozen = tuple(v for v in value.split(",") if v)
        else:
            m = _MODULE.match(value)
            if not m or min(int(g) for g in m.groups()) < 1:
                raise _bad(part, "give the module's sizes as tpT,ppP,dpD with positive T, P, D, "
                                 f"e.g. {key}=tp1,pp1,dp1")
            tp, pp, dp = (int(g) for g in m.groups())
            if key != LANGUAGE and pp > 1:
                raise _bad(part, "the step model takes an encoder as one pipeline stage; give it pp1")
            try:
                mods.append(module(key, dp, tp=tp, pp=pp))
            except ValueError as e:
                raise _bad(part, str(e)) from None
    names = [m.name for m in mods]
    if LANGUAGE not in names:
        raise _bad(name, f"no {LANGUAGE}=tpT,ppP,dpD: the layout needs the language model")
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise _bad(f"{twice[0]}=", "a module is given twice; give each module once")
    for key in ("mbs", "gbs"):
        if key not in sizes:
            raise _bad(name, f"no {key}=N; give the global micro-batch (mbs) and the global batch (gbs)")
    for f in frozen:
        if f not in names or f == LANGUAGE:
            raise _bad(f"frozen={','.join(frozen)}", f"{f!r} is not an encoder of the layout; name encoders only")
    modules = Modules(tuple(mods))
    mbs, gbs, grid = sizes["mbs"], sizes["gbs"], modules.grid
    if mbs % grid:
        raise _bad(f"mbs={mbs}", f"the global micro-batch must be a multiple of G = lcm(DPs) = {grid}")
    if gbs % mbs:
        raise _bad(f"gbs={gbs}", f"the global batch must be a whole number of micro-batches of mbs={mbs}")
    return LayoutSpec(" ".join(name.split()), modules, mbs, gbs, frozen)


def _stats(values: Sequence[float]) -> dict[str, float]:
    return {"p50": float(np.median(values)), "max": float(max(values))}


def _workload_row(profile: Profile, layout: LayoutSpec, steps: int, seed: int, model: CostModel,
                  notes: list[str]) -> dict[str, Any]:
    w, n = layout.micro_batches, layout.gbs
    dps = layout.modules.dp_sizes
    encoders = [m.name for m in layout.modules.encoders]
    index = profile.sample_table(steps * n, seed).cost_index()
    said = set()

    def note(key: str, message: str) -> None:
        if key not in said:
            said.add(key)
            notes.append(f"{profile.name}: {message.removeprefix('mimo_accel reorder: ')}")

    planner = CostIndexPlanner(index, model, layout.modules, notify=note)
    totals = {p: 0.0 for p in (*STEP_PLANS, "bound")}
    ms: dict[str, list[float]] = {p: [] for p in STEP_PLANS[1:]}
    kw = {"stages": layout.stages, "frozen": layout.frozen}
    done = 0
    for s in range(steps):
        idx = np.arange(s * n, (s + 1) * n)
        costs = planner.costs(idx)
        idle = [m for m, c in costs.items() if not c.any()]
        if idle:  # the step model refuses a module with no time (as costs in different units)
            note(f"idle:{s}", f"step {s}: {', '.join(idle)} has no work in it (every sample costs 0); step left out")
            continue
        done += 1
        patches = sum((index.rows(planner.columns[e], idx) for e in encoders), np.zeros(n)).astype(np.float64)
        orders = {"original": list(range(n))}
        t0 = time.perf_counter()
        orders["upstream"] = merged_reorder_order(merged_reorder_costs(patches, index.tokens(idx)),
                                                  layout.modules.grid, w)
        t1 = time.perf_counter()
        groups, size = max(dps.values()), n // w
        orders["pr4608"] = [j * size + p for j in range(w) for p in lpt_order(patches[j * size:(j + 1) * size], groups)]
        t2 = time.perf_counter()
        orders["mimo_accel"] = plan_step(costs, dps, w, **kw)
        t3 = time.perf_counter()
        for name, took in (("upstream", t1 - t0), ("pr4608", t2 - t1), ("mimo_accel", t3 - t2)):
            ms[name].append(took * 1e3)
        times = step_time(costs, dps, np.array([orders[p] for p in STEP_PLANS]), w, **kw)
        for name, t in zip(STEP_PLANS, times):
            totals[name] += float(t)
        totals["bound"] += max(float(c.sum()) / (dps[m] * layout.modules[m].pp) for m, c in costs.items())
    if not done:
        raise ValueError(f"workload {profile.name}: no step gives every module of the layout work; give a larger "
                         "gbs, or a layout without the idle module")
    mean = {p: v / done for p, v in totals.items()}
    return {
        "workload": profile.name,
        "samples": done * n,
        "step_time": mean,
        "over_bound": {p: mean[p] / mean["bound"] for p in STEP_PLANS},
        "vs_original": {p: mean[p] / mean["original"] for p in STEP_PLANS[1:]},
        "plan_ms": {p: _stats(v) for p, v in ms.items()},
    }


def simulate_layout(layout: LayoutSpec | str, workloads: Sequence[Profile | str] | None = None, steps: int = 20,
                    seed: int = 0, cost_model: CostModel | None = None, *,
                    cost_source: str = "default") -> dict[str, Any]:
    """The document described in the module docstring; ``workloads`` default to every shipped profile."""
    t_start = time.perf_counter()
    if not isinstance(layout, LayoutSpec):
        layout = parse_layout(layout)
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a positive integer, got {steps!r}")
    profiles = [p if isinstance(p, Profile) else load_profile(p) for p in (workloads or list_profiles())]
    model = CostModel() if cost_model is None else cost_model
    notes: list[str] = []
    if cost_model is None:
        notes.append("the built-in cost model prices each module by its own counts (encoder rows, language tokens) "
                     "at a = 1: the encoder-to-language time ratio is not calibrated; give --cost-model FILE "
                     "(`mimo-accel calibrate`) for seconds on your hardware")
    rows = [_workload_row(p, layout, steps, seed, model, notes) for p in profiles]
    return {
        "format": LAYOUT_FORMAT,
        "layout": {"spec": layout.spec,
                   "modules": {m.name: {"tp": m.tp, "pp": m.pp, "dp": m.dp} for m in layout.modules},
                   "mbs": layout.mbs, "gbs": layout.gbs, "micro_batches": layout.micro_batches,
                   "grid": layout.modules.grid, "frozen": list(layout.frozen)},
        "cost_model": {"source": cost_source},
        "steps": steps,
        "seed": seed,
        "rows": rows,
        "notes": notes,
        "elapsed_s": time.perf_counter() - t_start,
    }


def render_layout(doc: dict[str, Any], console: Console | None = None) -> None:
    """The step times per workload, each plan's over the bound beside it, and the plan times."""
    console = console or Console()
    lay = doc["layout"]
    frozen = f", frozen {', '.join(lay['frozen'])}" if lay["frozen"] else ""
    console.print(f"[bold]mimo-accel simulate --layout[/] {lay['spec']}: {lay['micro_batches']} micro-batches a step "
                  f"(gbs {lay['gbs']} / mbs {lay['mbs']}), G = {lay['grid']}{frozen}; {doc['steps']} steps per "
                  f"workload, seed {doc['seed']}, cost model {doc['cost_model']['source']}")
    t = Table(title="Modelled step time (mean over the steps; × the bound)", title_justify="left")
    t.add_column("workload")
    for p in (*STEP_PLANS, "bound"):
        t.add_column(LABELS[p], justify="right")
    t.add_column("mimo_accel\nvs original", justify="right")
    t.add_column("plan ms p50 / max\nupstream · #4608 · mimo_accel", justify="right")
    for r in doc["rows"]:
        st, ob, pm = r["step_time"], r["over_bound"], r["plan_ms"]
        t.add_row(r["workload"], *(f"{st[p]:.4g} ({ob[p]:.3f}×)" for p in STEP_PLANS), f"{st['bound']:.4g}",
                  f"{r['vs_original']['mimo_accel'] - 1:+.1%}",
                  " · ".join(f"{pm[p]['p50']:.1f}/{pm[p]['max']:.1f}" for p in STEP_PLANS[1:]))
    console.print(t)
    for note in doc["notes"]:
        console.print(f"[yellow]note:[/] {note}")
    console.print(f"simulated in {doc['elapsed_s']:.2f} s")
