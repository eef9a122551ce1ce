"""``mimo-accel simulate --layout``: the step a pipeline layout runs, per workload, under each planner.

``--layout reference-27b`` is upstream's one validated MegatronMIMO workflow (Megatron-Bridge,
``tutorials/megatron_mimo/qwen35-vl-non-colocated-sft.md``): ``images=tp1,pp1,dp1
language=tp4,pp2,dp2 mbs=2 gbs=32``, priced in seconds from its model (the preset
``qwen35-vl-27b`` on an H100 unless ``--model`` / ``--gpu`` say otherwise). Any layout is a spec of
the same grammar (:mod:`mimo_accel.tools.layout.spec`).

For each workload (the shipped profiles, or ``--workload``), ``--steps`` steps of gbs samples are
drawn (seeded) and priced by :func:`mimo_accel.tools.layout.pricing.price_steps`, the path
``mimo-accel layout`` prices a layout with: every module of every sample priced as the planner
prices it at run time, the step model's time of each plan, plus the step's end (the DP gradient
sync, in seconds). Plans: ``padded`` (upstream as shipped: the original order, every language
sample the full sequence), ``original`` (packed, as they come), ``upstream`` (Bridge's merged
reorder), ``pr4608``, ``mimo_accel`` (:func:`mimo_accel.balance.plan_step`), and ``bound`` (the
busiest module's work over its GPUs: no step is shorter). The costs are seconds from a model
(``--model``, or the preset's), a cost-model file as it is (``--cost-model``), or else the built-in
cost units.

JSON (format ``mimo-accel-simulate-step/1``): format, layout{spec, modules{M: {tp, pp, dp}}, mbs,
gbs, micro_batches, grid, frozen[], seq_length}, cost_model{source, units}, steps, seed, notes[],
elapsed_s, rows[]: {workload, samples (in the steps modelled), step_time{padded, original, upstream,
pr4608, mimo_accel, bound}, over_bound{plan}, vs_original{upstream, pr4608, mimo_accel},
vs_padded{mimo_accel}, plan_ms{upstream, pr4608, mimo_accel: {p50, max}}}.
"""

from __future__ import annotations

import time
from typing import Any, Optional, Sequence

import numpy as np
from rich.console import Console
from rich.table import Table

from mimo_accel.costs import CostModel
from mimo_accel.tools.layout.draws import draw
from mimo_accel.tools.layout.machine import machine_for
from mimo_accel.tools.layout.models import ModelSpec, model_named
from mimo_accel.tools.layout.pricing import price_steps
from mimo_accel.tools.layout.seconds import FlopsSeconds, GivenCosts
from mimo_accel.tools.layout.spec import PRESET_MODELS, PRESETS, LayoutSpec, parse_layout
from mimo_accel.workloads import Profile, list_profiles, load_profile

__all__ = ["LAYOUT_FORMAT", "PRESETS", "STEP_PLANS", "LayoutSpec", "parse_layout", "render_layout",
           "simulate_layout"]

LAYOUT_FORMAT = "mimo-accel-simulate-step/1"
STEP_PLANS = ("padded", "original", "upstream", "pr4608", "mimo_accel")
LABELS = {"padded": "padded", "original": "original", "upstream": "upstream merged", "pr4608": "PR #4608",
          "mimo_accel": "mimo_accel", "bound": "bound"}
DEFAULT_GPU = "h100"


def _stats(values: Sequence[float]) -> dict[str, float]:
    return {"p50": float(np.median(values)), "max": float(max(values))}


def _workload_row(profile: Profile, layout: LayoutSpec, steps: int, seed: int, seconds, seq_length: Optional[int],
                  notes: list[str]) -> dict[str, Any]:
    said = set()

    def note(key: str, message: str) -> None:
        if key not in said:
            said.add(key)
            notes.append(f"{profile.name}: {message.removeprefix('mimo_accel reorder: ')}")

    pixels = seconds.model.image_pixels if seconds.model is not None else None
    draws = draw(profile, steps=steps, gbs=layout.gbs, seq_length=seq_length or profile.seq_length, seed=seed,
                 pixels=pixels)
    if draws.clipped:
        note("clipped", f"{draws.clipped} of {steps * layout.gbs} samples hold more than {draws.seq_length} tokens: "
                        "cut at the sequence length")
    prices = price_steps(layout, draws, seconds, STEP_PLANS, notify=note)
    mean = {**prices.step_time, "bound": prices.bound}
    return {
        "workload": profile.name,
        "samples": prices.steps * layout.gbs,
        "step_time": mean,
        "over_bound": {p: mean[p] / mean["bound"] for p in STEP_PLANS},
        "vs_original": {p: mean[p] / mean["original"] for p in ("upstream", "pr4608", "mimo_accel")},
        "vs_padded": {"mimo_accel": mean["mimo_accel"] / mean["padded"]},
        "plan_ms": {p: _stats(prices.plan_ms[p]) for p in ("upstream", "pr4608", "mimo_accel")},
    }


def layout_seconds(layout: LayoutSpec, cost_model: Optional[CostModel] = None, cost_source: str = "default",
                   model: Optional[ModelSpec | str] = None, gpu: Optional[str] = None):
    """What prices the layout: ``cost_model`` as it is; else seconds from ``model`` (or the
    preset's own model) on ``gpu`` (default H100); else the built-in cost units."""
    if cost_model is not None:
        return GivenCosts(cost_model, cost_source)
    if model is None and layout.preset in PRESET_MODELS:
        model = PRESET_MODELS[layout.preset]
    if model is None:
        return GivenCosts(None, cost_source)
    spec = model if isinstance(model, ModelSpec) else model_named(model)
    return FlopsSeconds(spec, machine_for(gpu or DEFAULT_GPU))


def simulate_layout(layout: LayoutSpec | str, workloads: Sequence[Profile | str] | None = None, steps: int = 20,
                    seed: int = 0, cost_model: CostModel | None = None, *, cost_source: str = "default",
                    model: Optional[ModelSpec | str] = None, gpu: Optional[str] = None,
                    seq_length: Optional[int] = None) -> dict[str, Any]:
    """The document described in the module docstring; ``workloads`` default to every shipped profile."""
    t_start = time.perf_counter()
    if not isinstance(layout, LayoutSpec):
        layout = parse_layout(layout)
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a positive integer, got {steps!r}")
    profiles = [p if isinstance(p, Profile) else load_profile(p) for p in (workloads or list_profiles())]
    seconds = layout_seconds(layout, cost_model, cost_source, model, gpu)
    seq = seq_length or layout.seq_length or (seconds.model.seq_length if seconds.model is not None else None)
    notes: list[str] = []
    if isinstance(seconds, GivenCosts) and cost_model is None:
        notes.append("the built-in cost model prices each module by its own counts (encoder rows, language tokens) "
                     "at a = 1: the encoder-to-language time ratio is not calibrated; give --model (a preset or a "
                     "model file) or --cost-model FILE (`mimo-accel calibrate`) for seconds on your hardware")
    elif isinstance(seconds, FlopsSeconds):
        notes.append(f"seconds from {seconds.describe()} on {seconds.machine.describe()}")
    rows = [_workload_row(p, layout, steps, seed, seconds, seq, notes) for p in profiles]
    return {
        "format": LAYOUT_FORMAT,
        "layout": {"spec": layout.spec,
                   "modules": {m.name: {"tp": m.tp, "pp": m.pp, "dp": m.dp} for m in layout.modules},
                   "mbs": layout.mbs, "gbs": layout.gbs, "micro_batches": layout.micro_batches,
                   "grid": layout.modules.grid, "frozen": list(layout.frozen), "seq_length": seq},
        "cost_model": {"source": getattr(seconds, "source", None) or (seconds.model.name if seconds.model else cost_source),
                       "units": seconds.units},
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
    seq = f", seq {lay['seq_length']}" if lay.get("seq_length") else ""
    units = doc["cost_model"]["units"]
    console.print(f"[bold]mimo-accel simulate --layout[/] {lay['spec']}: {lay['micro_batches']} micro-batches a step "
                  f"(gbs {lay['gbs']} / mbs {lay['mbs']}), G = {lay['grid']}{seq}{frozen}; {doc['steps']} steps per "
                  f"workload, seed {doc['seed']}, cost model {doc['cost_model']['source']} ({units})")
    t = Table(title=f"Modelled step time, {units} (mean over the steps; × the bound)", title_justify="left")
    t.add_column("workload")
    for p in (*STEP_PLANS, "bound"):
        t.add_column(LABELS[p], justify="right")
    t.add_column("mimo_accel vs\noriginal · padded", justify="right")
    t.add_column("plan ms p50 / max\nupstream · #4608 · mimo_accel", justify="right")
    for r in doc["rows"]:
        st, ob, pm = r["step_time"], r["over_bound"], r["plan_ms"]
        t.add_row(r["workload"], *(f"{st[p]:.4g} ({ob[p]:.3f}×)" for p in STEP_PLANS), f"{st['bound']:.4g}",
                  f"{r['vs_original']['mimo_accel'] - 1:+.1%} · {r['vs_padded']['mimo_accel'] - 1:+.1%}",
                  " · ".join(f"{pm[p]['p50']:.1f}/{pm[p]['max']:.1f}" for p in ("upstream", "pr4608", "mimo_accel")))
    console.print(t)
    for note in doc["notes"]:
        console.print(f"[yellow]note:[/] {note}")
    console.print(f"simulated in {doc['elapsed_s']:.2f} s")
