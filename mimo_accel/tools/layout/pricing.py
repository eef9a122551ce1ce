"""The one path that prices a layout's step: ``mimo-accel layout`` and ``mimo-accel simulate
--layout`` both call :func:`price_steps`.

For each drawn step (:mod:`~mimo_accel.tools.layout.draws`), every module of every sample is
priced as the job's planner prices it (:class:`~mimo_accel.planner.CostIndexPlanner` over the
layout's cost model, :mod:`~mimo_accel.tools.layout.seconds`), each plan orders the step, and the
step model (:func:`mimo_accel.balance.step_time`: 1F1B over the multi-module pipeline) gives its
time, to which the step's end (the slowest module's DP gradient sync) is added. Plans:

* ``padded``: upstream as shipped: the samples as they come, every language sample costing the
  full sequence length (a padded batch computes it);
* ``original``: the samples as they come, the language model on real tokens (packed);
* ``upstream``: Bridge's merged reorder with its defaults, each micro-batch alone;
* ``pr4608``: PR #4608's equal-size LPT on patches over max(DPs) groups, each micro-batch alone;
* ``mimo_accel``: :func:`mimo_accel.balance.plan_step` over the step's micro-batches, packed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from mimo_accel.balance import lpt_order, module_loads, plan_step, step_time
from mimo_accel.balance.peers import merged_reorder_costs, merged_reorder_order
from mimo_accel.balance.replay import Shares, bound_module, module_shares, replay
from mimo_accel.modules import LANGUAGE
from mimo_accel.planner import CostIndexPlanner
from mimo_accel.tools.layout.draws import Draws
from mimo_accel.tools.layout.spec import LayoutSpec

__all__ = ["PLANS", "StepPrices", "busy_shares", "price_steps"]

PLANS = ("original", "padded", "upstream", "pr4608", "mimo_accel")
_PACKED = ("original", "upstream", "pr4608", "mimo_accel")


@dataclass
class StepPrices:
    """A layout's steps under each plan: ``step_time[plan]`` the mean over the priced steps (the
    step's end included), ``bound`` the busiest module's mean work over its GPUs plus the step's
    end (no plan is shorter), ``work[m]`` a module's mean (Σ L, Σ L²) per step on real tokens
    (rows for an encoder), ``tokens`` the mean real language tokens per step; with ``keep``, each
    step's costs and orders (``kept``) for :func:`busy_shares`."""

    units: str
    step_time: dict[str, float]
    bound: float
    step_end: float
    plan_ms: dict[str, list[float]]
    steps: int
    tokens: float
    work: dict[str, tuple[float, float]]
    kept: list[tuple[dict, dict, dict]] = field(default_factory=list)
    # the language model's stage shares of a micro-batch ("padded" and packed; None: even)
    shares: dict[str, Optional[list[float]]] = field(default_factory=dict)


def _orders(plans, costs, padded, layout: LayoutSpec, draws: Draws, idx, planner, ms) -> dict[str, list[int]]:
    n, w, dps = layout.gbs, layout.micro_batches, layout.modules.dp_sizes
    kw = {"stages": layout.stages, "frozen": layout.frozen}
    out = {}
    for plan in plans:
        t0 = time.perf_counter()
        if plan in ("original", "padded"):
            out[plan] = list(range(n))
            continue
        if plan == "mimo_accel":
            out[plan] = plan_step(costs, dps, w, **kw)
        else:
            encoders = [m.name for m in layout.modules.encoders]
            patches = sum((draws.index.rows(planner.columns[e], idx) for e in encoders), np.zeros(n)).astype(float)
            if plan == "upstream":
                out[plan] = merged_reorder_order(merged_reorder_costs(patches, draws.index.tokens(idx)),
                                                 layout.modules.grid, w)
            else:
                groups, size = max(dps.values()), n // w
                out[plan] = [j * size + p for j in range(w) for p in lpt_order(patches[j * size:(j + 1) * size], groups)]
        ms.setdefault(plan, []).append((time.perf_counter() - t0) * 1e3)
    return out


def _op_times(layout: LayoutSpec, costs: dict, order, shares: Optional[list[float]]):
    """The modelled forward and backward time of every op (module: (dp, stages, W) arrays) of the
    step that runs ``order``: a cell's load, a trained module's forward 1/3 and backward 2/3, the
    language model's split over its stages by ``shares`` (None: evenly)."""
    dps, w = layout.modules.dp_sizes, layout.micro_batches
    fwd, bwd = {}, {}
    for m, load in module_loads(costs, dps, order, w).items():
        pp = layout.modules[m].pp
        split = np.asarray(shares) if m == LANGUAGE and shares is not None else np.full(pp, 1.0 / pp)
        cell = load.T[:, None, :] * split[None, :, None]  # (dp, stages, W)
        frozen = m in layout.frozen
        fwd[m], bwd[m] = (cell, cell * 0.0) if frozen else (cell / 3.0, cell * 2.0 / 3.0)
    return fwd, bwd


def _step(layout: LayoutSpec, costs: dict, order, shares: Optional[list[float]]) -> float:
    """The step model's time of ``order`` with the language model's stages split by ``shares``: the
    same schedule as :func:`~mimo_accel.balance.step_time`, whose stages are even."""
    fwd, bwd = _op_times(layout, costs, order, shares)
    return replay(fwd, bwd, layout.modules.dp_sizes, layout.micro_batches, stages=layout.stages,
                  frozen=layout.frozen).makespan


def _shares(layout: LayoutSpec, seconds, tokens: float, sq_tokens: float) -> Optional[list[float]]:
    """The language model's stage shares of a replica's mean micro-batch (``tokens``, ``sq_tokens``:
    per step, all replicas)."""
    lang = layout.modules[LANGUAGE]
    if lang.pp == 1:
        return None
    per = layout.micro_batches * lang.dp
    return seconds.stage_shares(lang.pp, tokens / per, sq_tokens / per)


def price_steps(layout: LayoutSpec, draws: Draws, seconds, plans: Sequence[str] = ("padded", "mimo_accel"), *,
                keep: bool = False, notify: Optional[Callable[[str, str], object]] = None) -> StepPrices:
    """Each plan's mean step time of ``layout`` over ``draws`` (module docstring), priced by
    ``seconds`` (:mod:`~mimo_accel.tools.layout.seconds`). A step in which a module has no work
    is left out (the step model cannot price it; ``notify`` says so); ValueError if every step is."""
    unknown = [p for p in plans if p not in PLANS]
    if unknown:
        raise ValueError(f"unknown plans {unknown}; give some of {', '.join(PLANS)}")
    if draws.gbs != layout.gbs:
        raise ValueError(f"the steps were drawn for gbs={draws.gbs}, the layout's is gbs={layout.gbs}")
    model = seconds.cost_model(layout)
    planner = CostIndexPlanner(draws.index, model, layout.modules, notify=notify, frozen=layout.frozen)
    dps, w = layout.modules.dp_sizes, layout.micro_batches
    kw = {"stages": layout.stages, "frozen": layout.frozen}
    padded_cost = float(model.of(LANGUAGE).language_costs(np.array([draws.seq_length]))[0])
    all_tokens = draws.index.tokens(np.arange(draws.steps * draws.gbs)).astype(np.float64)
    shares = {"packed": _shares(layout, seconds, float(all_tokens.sum()) / draws.steps,
                                float((all_tokens ** 2).sum()) / draws.steps),
              "padded": _shares(layout, seconds, float(layout.gbs * draws.seq_length),
                                float(layout.gbs * draws.seq_length ** 2))}
    # what a micro-batch costs a replica whatever its size, shared by the samples it holds (mbs / dp)
    per_sample = {m: c * dps[m] / layout.mbs for m, c in seconds.micro_batch_overheads(layout).items()}
    totals = dict.fromkeys(plans, 0.0)
    bound, tokens, done, ms, kept = 0.0, 0.0, 0, {}, []
    work = {m.name: [0.0, 0.0] for m in layout.modules}
    for s in range(draws.steps):
        idx = draws.step(s)
        costs = planner.costs(idx)
        idle = [m for m, c in costs.items() if not c.any()]
        costs = {m: c + per_sample.get(m, 0.0) for m, c in costs.items()}
        if idle:
            if notify is not None:
                notify(f"idle:{s}", f"step {s}: {', '.join(idle)} has no work in it (every sample costs 0); "
                                    "step left out")
            continue
        done += 1
        padded = {**costs, LANGUAGE: np.full(layout.gbs, padded_cost + per_sample.get(LANGUAGE, 0.0))}
        orders = _orders(plans, costs, padded, layout, draws, idx, planner, ms)
        packed = [p for p in plans if p in _PACKED]
        if packed and shares["packed"] is None:
            times = step_time(costs, dps, np.array([orders[p] for p in packed]), w, **kw)
            for p, t in zip(packed, np.atleast_1d(times)):
                totals[p] += float(t)
        elif packed:
            for p in packed:
                totals[p] += _step(layout, costs, orders[p], shares["packed"])
        if "padded" in plans:
            totals["padded"] += (float(step_time(padded, dps, orders["padded"], w, **kw)) if shares["padded"] is None
                                 else _step(layout, padded, orders["padded"], shares["padded"]))
        bound += max(float(c.sum()) / (dps[m] * layout.modules[m].pp) for m, c in costs.items())
        tok = draws.index.tokens(idx).astype(np.float64)
        tokens += float(tok.sum())
        for m in layout.modules:
            if m.name == LANGUAGE:
                work[m.name][0] += float(tok.sum())
                work[m.name][1] += float((tok * tok).sum())
            else:
                col = planner.columns[m.name]
                work[m.name][0] += float(draws.index.rows(col, idx).sum())
                work[m.name][1] += float(draws.index.sq_rows(col, idx).sum())
        if keep:
            kept.append((costs, padded, orders))
    if not done:
        raise ValueError(f"{draws.source}: no step gives every module of the layout work; give a larger gbs, or a "
                         "layout without the idle module")
    end = seconds.step_end(layout)
    return StepPrices(units=seconds.units, step_time={p: v / done + end for p, v in totals.items()},
                      bound=bound / done + end, step_end=end, plan_ms=ms, steps=done, tokens=tokens / done,
                      work={m: (v[0] / done, v[1] / done) for m, v in work.items()}, kept=kept,
                      shares={p: shares["padded" if p == "padded" else "packed"] for p in plans})


def busy_shares(layout: LayoutSpec, prices: StepPrices, plan: str) -> tuple[dict[str, float], str]:
    """``({module: share of the step its GPUs compute, mean over its GPUs}, the bound module)`` under
    ``plan``, from the step model's schedule (:func:`mimo_accel.balance.replay.replay` of the modelled
    op times: a micro-batch's forward 1/3 and backward 2/3 of its cell, split over the PP stages), as
    the report reads a measured step (:func:`~mimo_accel.balance.replay.module_shares`, over the step
    with its end; the bound module by :func:`~mimo_accel.balance.replay.bound_module`, the mean
    over the steps priced)."""
    dps, w = layout.modules.dp_sizes, layout.micro_batches
    busy = {m: 0.0 for m in dps}
    peak = {m: 0.0 for m in dps}
    for real, padded, orders in prices.kept:
        costs = padded if plan == "padded" else real
        fwd, bwd = _op_times(layout, costs, orders[plan], prices.shares.get(plan))
        r = replay(fwd, bwd, dps, w, stages=layout.stages, frozen=layout.frozen)
        for m, share in module_shares(r).items():  # of the replayed step; the step's end is added below
            busy[m] += share.busy * r.makespan
            peak[m] += share.busy_max * r.makespan
    n, step = max(1, len(prices.kept)), prices.step_time[plan]
    shares = {m: Shares(busy[m] / n / step, peak[m] / n / step) for m in dps}
    return {m: v.busy for m, v in shares.items()}, bound_module(shares)
