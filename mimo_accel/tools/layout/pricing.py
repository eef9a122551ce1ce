"""The one path that prices a layout's step: :func:`price_steps`, for every command that prices one.

For each drawn step (:mod:`~mimo_accel.tools.layout.draws`: one draw), every module of every
sample is priced as the job's planner prices it (:class:`~mimo_accel.planner.CostIndexPlanner`
over the layout's cost model, :mod:`~mimo_accel.tools.layout.seconds`), each plan orders the step,
and the step model (:func:`mimo_accel.balance.step_time`: 1F1B over the multi-module pipeline, the
language model's stages each its own share of a micro-batch) gives its time, to which the step's
end (the slowest module's DP gradient sync) is added. Plans (:data:`PLANS`):

* ``padded``: upstream as shipped: the samples as they come, every language sample costing the
  full sequence length (a padded batch computes it);
* ``packed``: upstream with its own in-batch packing (Bridge main's ``--pack-sequences-in-batch``):
  the samples as they come, the language model on real tokens;
* ``reorder_buffer``: the reorder of Megatron-Bridge PR #4608's ``reorder_buffer.py`` (ce55b79f,
  not merged: equal-size LPT over lcm(DPs) groups), its defaults, each micro-batch alone, packed;
* ``mimo_accel``: :func:`mimo_accel.balance.plan_step` over the step's micro-batches, as the job
  plans it (its stages even), packed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from mimo_accel.balance import plan_step, step_time
from mimo_accel.balance.peers import reorder_buffer_costs, reorder_buffer_order
from mimo_accel.balance.replay import bound_module, module_shares, replay_plan
from mimo_accel.costs import CostModel
from mimo_accel.modules import LANGUAGE
from mimo_accel.planner import CostIndexPlanner
from mimo_accel.tools.layout.draws import Draws
from mimo_accel.tools.layout.spec import LayoutSpec

__all__ = ["PARTS", "PLANS", "StepPrices", "busy_shares", "padded_cost", "price_steps"]

PLANS = ("padded", "packed", "reorder_buffer", "mimo_accel")
#: what a step is made of (:func:`busy_shares`): the bound module's busiest GPU's compute (its layers,
#: output layer and loss), TP collectives, P2P sends (PP stages, encoder -> language), padded tokens;
#: the 1F1B bubble it waits; the step's end (the DP gradient sync)
PARTS = ("compute", "tp_comm", "p2p", "padding", "bubble", "dp_sync")


def padded_cost(model: CostModel, seq_length: int) -> float:
    """What a padded language sample costs: the whole sequence, whatever its real tokens."""
    return float(model.of(LANGUAGE).language_costs(np.array([seq_length]))[0])


@dataclass
class StepPrices:
    """A layout's steps under each plan: ``draws[plan]`` each drawn step's time and ``step_time[plan]``
    their mean (the step's end included), ``bound`` the busiest module's mean work over its GPUs
    plus the step's end (no plan is shorter), ``work[m]`` a module's mean (Σ L, Σ L²) per step on
    real tokens (rows for an encoder), ``tokens`` the mean real language tokens per step; with
    ``keep``, each step's costs, orders and each module's tokens (rows) priced (``kept``) for
    :func:`busy_shares`; ``shares``: the language model's stage shares of a micro-batch under each
    plan (None: one stage)."""

    step_time: dict[str, float]
    draws: dict[str, list[float]]
    bound: float
    step_end: float
    plan_ms: dict[str, list[float]]
    tokens: float
    work: dict[str, tuple[float, float]]
    kept: list[tuple[dict, dict, dict, dict]] = field(default_factory=list)
    shares: dict[str, Optional[list[float]]] = field(default_factory=dict)
    seq_length: int = 0


def _orders(plans, costs, layout: LayoutSpec, draws: Draws, idx, planner, ms) -> dict[str, list[int]]:
    n, w, dps = layout.gbs, layout.micro_batches, layout.modules.dp_sizes
    out = {}
    for plan in plans:
        t0 = time.perf_counter()
        if plan in ("padded", "packed"):
            out[plan] = list(range(n))
            continue
        if plan == "mimo_accel":
            out[plan] = plan_step(costs, dps, w, stages=layout.stages, frozen=layout.frozen)
        else:
            patches = sum((draws.index.rows(planner.columns[e.name], idx) for e in layout.modules.encoders),
                          np.zeros(n)).astype(float)
            out[plan] = reorder_buffer_order(reorder_buffer_costs(patches, draws.index.tokens(idx)),
                                             layout.modules.grid, w)
        ms.setdefault(plan, []).append((time.perf_counter() - t0) * 1e3)
    return out


def price_steps(layout: LayoutSpec, draws: Draws, seconds, plans: Sequence[str] = ("padded", "mimo_accel"), *,
                keep: bool = False, notify: Optional[Callable[[str, str], object]] = None) -> StepPrices:
    """Each plan's step time of ``layout`` on every one of ``draws`` (module docstring), priced by
    ``seconds`` (:class:`~mimo_accel.tools.layout.seconds.Seconds`). A step in which a module has no
    work is left out (the step model cannot price it; ``notify`` says so); ValueError if every step is."""
    unknown = [p for p in plans if p not in PLANS]
    if unknown:
        raise ValueError(f"unknown plans {unknown}; give some of {', '.join(PLANS)}")
    if draws.gbs != layout.gbs:
        raise ValueError(f"the steps were drawn for gbs={draws.gbs}, the layout's is gbs={layout.gbs}")
    model = seconds.cost_model(layout)
    planner = CostIndexPlanner(draws.index, model, layout.modules, notify=notify, frozen=layout.frozen)
    dps, w = layout.modules.dp_sizes, layout.micro_batches
    per = w * layout.language.dp  # a replica's micro-batches in a step, over every replica
    all_tokens = draws.index.tokens(np.arange(draws.steps * draws.gbs)).astype(np.float64)
    packed = seconds.stage_shares(layout, all_tokens.sum() / draws.steps / per,
                                  (all_tokens ** 2).sum() / draws.steps / per)
    shares = {p: seconds.stage_shares(layout, layout.gbs * draws.seq_length / per,
                                      layout.gbs * draws.seq_length ** 2 / per) if p == "padded" else packed
              for p in plans}
    # what a micro-batch costs a replica whatever its size, shared by the samples it holds (mbs / dp)
    per_sample = {m: c * dps[m] / layout.mbs for m, c in seconds.micro_batch_overheads(layout).items()}
    padded_one = padded_cost(model, draws.seq_length) + per_sample.get(LANGUAGE, 0.0)
    kw = {"stages": layout.stages, "frozen": layout.frozen}
    times: dict[str, list[float]] = {p: [] for p in plans}
    bound, tokens, ms, kept = [], 0.0, {}, []
    work = {m.name: [0.0, 0.0] for m in layout.modules}
    end = seconds.step_end(layout)
    for s in range(draws.steps):
        idx = draws.step(s)
        costs = planner.costs(idx)
        idle = [m for m, c in costs.items() if not c.any()]
        if idle:
            if notify is not None:
                notify(f"idle:{s}", f"step {s}: {', '.join(idle)} has no work in it (every sample costs 0); "
                                    "step left out")
            continue
        costs = {m: c + per_sample.get(m, 0.0) for m, c in costs.items()}
        padded = {**costs, LANGUAGE: np.full(layout.gbs, padded_one)}
        orders = _orders(plans, costs, layout, draws, idx, planner, ms)
        for p in plans:
            t = step_time(padded if p == "padded" else costs, dps, orders[p], w, stage_shares=shares[p], **kw)
            times[p].append(float(t) + end)
        bound.append(max(float(c.sum()) / (dps[m] * layout.modules[m].pp) for m, c in costs.items()) + end)
        tok = draws.index.tokens(idx).astype(np.float64)
        tokens += float(tok.sum())
        xs = {}  # each module's tokens (rows) in the step
        for m in layout.modules:
            col = planner.columns.get(m.name)
            rows = (tok, tok * tok) if m.is_language else (draws.index.rows(col, idx), draws.index.sq_rows(col, idx))
            xs[m.name] = float(np.sum(rows[0]))
            work[m.name][0] += xs[m.name]
            work[m.name][1] += float(np.sum(rows[1]))
        if keep:
            kept.append((costs, padded, orders, xs))
    done = len(bound)
    if not done:
        raise ValueError(f"{draws.source}: no step gives every module of the layout work; give a larger gbs, or a "
                         "layout without the idle module")
    return StepPrices(step_time={p: float(np.mean(v)) for p, v in times.items()}, draws=times,
                      bound=float(np.mean(bound)), step_end=end, plan_ms=ms, tokens=tokens / done,
                      work={m: (v[0] / done, v[1] / done) for m, v in work.items()}, kept=kept, shares=shares,
                      seq_length=draws.seq_length)


def busy_shares(layout: LayoutSpec, prices: StepPrices, plan: str,
                comm: Optional[Mapping[str, Mapping[str, float]]] = None) -> tuple[dict[str, float], str, dict]:
    """``({module: share of the step its GPUs compute, mean over its GPUs}, the bound module, the
    step's parts)`` under ``plan``: the step model's own op times replayed
    (:func:`~mimo_accel.balance.replay.replay_plan`), read as the report reads a measured step
    (:func:`~mimo_accel.balance.replay.module_shares` over the step with its end; the bound module
    by :func:`~mimo_accel.balance.replay.bound_module`), the mean over the steps priced.

    The parts (:data:`PARTS`, seconds, summing to the mean step): the bound module's busiest GPU's
    own time split as that module's priced seconds split (``comm[module]``: the TP and P2P seconds a
    token or row, :meth:`~mimo_accel.tools.layout.seconds.Seconds.comm_parts`; under ``padded`` the
    padded tokens' share of the language model's), the 1F1B bubble (the rest of the replayed step: what that GPU
    waits), and the step's end (the DP gradient sync, the same on every draw)."""
    from mimo_accel.balance.replay import Shares

    dps, w = layout.modules.dp_sizes, layout.micro_batches
    busy, peak = dict.fromkeys(dps, 0.0), dict.fromkeys(dps, 0.0)
    replays = []
    for real, padded, orders, xs in prices.kept:
        costs = padded if plan == "padded" else real
        r = replay_plan(costs, dps, orders[plan], w, stages=layout.stages,
                        frozen=layout.frozen, stage_shares=prices.shares.get(plan))
        replays.append((r, costs, real, xs))
        for m, share in module_shares(r).items():  # of the replayed step; the step's end is added below
            busy[m] += share.busy * r.makespan
            peak[m] += share.busy_max * r.makespan
    n, step = max(1, len(prices.kept)), prices.step_time[plan]
    shares = {m: Shares(busy[m] / n / step, peak[m] / n / step) for m in dps}
    bound = bound_module(shares)
    parts = dict.fromkeys(PARTS, 0.0)
    for r, costs, real, xs in replays:
        for k, v in _split(r, bound, costs, real, xs, comm or {}, plan == "padded",
                           layout.gbs * prices.seq_length).items():
            parts[k] += v / n
    parts["dp_sync"] = prices.step_end
    return {m: v.busy for m, v in shares.items()}, bound, parts


def _split(r, m: str, costs, real, xs, comm, padded: bool, padded_tokens: float) -> dict[str, float]:
    """One replayed step's parts but its end, on module ``m``'s busiest GPU (:func:`busy_shares`)."""
    spent = max(v for (name, _, _), v in r.busy.items() if name == m)
    total = float(np.sum(costs[m]))
    x = padded_tokens if padded and m == LANGUAGE else xs[m]
    own = {k: (comm.get(m, {}).get(k, 0.0) * x / total if total > 0 else 0.0) for k in ("tp_comm", "p2p")}
    own["padding"] = 1.0 - float(np.sum(real[m])) / total if padded and m == LANGUAGE and total > 0 else 0.0
    out = {k: spent * v for k, v in own.items()}
    out["compute"] = spent - sum(out.values())
    out["bubble"] = r.makespan - spent
    return out
