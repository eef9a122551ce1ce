"""The planners at cluster scale, without processes: the sweep over DP sizes (:func:`simulate`) and its JSON.

``mimo-accel simulate --workload receipts --dp 2,4,8,...,512 [--steps N] [--reorder-window W]
[--per-replica K] [--seed S] [--cost-model FILE] [--language-dp ratio|equal|R] [--audio-dp ratio|equal|R]
[--json PATH] [--png PATH]``

The layout is the profile's :class:`~mimo_accel.modules.Modules`; the rows sweep the DP of its
first encoder, the **lead** encoder (``vision`` in the shipped profiles; ``lead`` in the JSON), and
every other module's DP follows it. For each lead DP size ``d`` it draws ``N × W`` global
micro-batches of ``d × K`` samples (``N`` steps of ``W`` micro-batches; ``W = --reorder-window``,
AccelConfig's ``reorder_window``, default 1) from the profile (one shared pool: every DP size sees
the same first samples of each micro-batch), prices every module of every sample as the planner
does at run time (:func:`sample_costs`: the samples' :class:`~mimo_accel.costs.CostIndex` through
:class:`~mimo_accel.planner.CostIndexPlanner`, with the cost model — default
:class:`~mimo_accel.costs.CostModel`, or ``--cost-model`` from ``mimo-accel calibrate``, its
per-module coefficients included), and plans each micro-batch three ways on the lead encoder's
cost over the canonical grid ``G = lcm`` of the module DPs:

* ``contiguous`` — upstream: replica r takes the r-th contiguous slice;
* ``lpt`` — equal-size LPT (upstream's reorder PR);
* ``balanced`` — :func:`mimo_accel.balance.balanced_order` (ours), as the planner ships it.

and, for every module of the layout (each encoder and the language model), each module's replica
spread under four plans side by side (``rows[].modules``, the table "Every module's replica
spread"): ``contiguous``; ``lpt`` (#4608's method: :func:`~mimo_accel.balance.lpt_order` on the
lead encoder's cost); ``encoder_only`` (:func:`~mimo_accel.balance.balanced_order` on the lead
encoder's cost alone: the ``balanced`` plan above);
``joint`` (:func:`mimo_accel.balance.balance_modules` over every module), with each module's bound
(:func:`~mimo_accel.balance.module_bounds`), the worst module's spread and the plan times of the
encoder-only and the joint plan. Replica loads and spreads are :func:`~mimo_accel.balance.group_costs`
and :func:`~mimo_accel.balance.spread`.

As a further, diagnostic plan, ``balanced_replicas``: ``balanced_order`` over the d lead
replicas themselves (each replica's block then cut into its G/d canonical groups as it comes —
still a valid plan for every module). It differs from ``balanced`` only with fan-out (another
module's DP > d, G > d): balancing G smaller groups is a harder problem than balancing d replicas,
and the slowest replica then holds the heaviest group *plus* an average one.

Definitions:

* **language DP** for lead DP d: with ``--language-dp ratio`` (default) the profile layout's
  ratio, ``max(1, round(d × language.dp / lead.dp))``; with ``equal``, d; with a number R,
  ``max(1, round(d × R))`` (any layout: 1 is 1:1, 0.5 fan-in, 2 fan-out). ``--audio-dp`` likewise
  for a workload's audio encoder; any other encoder keeps the layout's ratio. TP/PP of every
  module stay the profile's. If ``d × K`` is not a multiple of G it is rounded up to one (the
  row's ``micro_batch_size`` says what was used).
* **straggler ratio** of a micro-batch: max / mean of the lead encoder's replicas' summed sample
  costs (1.0 is perfect); p50 / p99 / mean over the micro-batches. ``bound`` is the same ratio for
  :func:`mimo_accel.balance.lower_bound` of a d-way equal-size split: no planner can go below it.
* **speedup**: Σ over micro-batches of the max replica cost of one planner over another's, i.e.
  the lead encoder's phase speedup if its time ∝ the slowest replica's cost; ``time_saved`` is
  ``1 - balanced/contiguous``.
* **data ranks** (who reads the micro-batch, as upstream's ``get_megatron_mimo_sampling_info``
  decides): the lead encoder: the first PP stage, ``d × tp``; language: every rank, ``l × tp × pp``.
* **reads** per micro-batch: baseline (upstream): every data rank reads the whole micro-batch, so
  per rank = mbs and cluster = mbs × data ranks (∝ DP). Sharded: a rank reads its replica's share,
  mbs / dp; cluster = mbs × (lead tp + language tp × pp), flat in DP. Bytes from the profile's
  size model (original pixels × bytes_per_pixel + text tokens × bytes_per_token). The micro-batch
  grows with DP (d × K), so ``amplification`` = cluster reads / micro-batch is the DP-free view:
  baseline = data ranks (∝ DP), sharded = lead tp + language tp × pp (flat).
* **exchange**: bytes a read-then-exchange reorder moves per micro-batch: every sample whose
  replica differs between the contiguous read and the plan is sent to its new owner by every data
  rank of that replica's TP/PP group (an all_to_all per group), in both modules. Plan-before-read mode
  moves 0. ``balanced_matched`` renumbers the balanced plan's canonical groups (a max-weight
  matching of groups to slots by bytes already in place; still balanced) to show how much of the
  exchange is avoidable; ``null`` without scipy.
* **plan_ms**: wall time of one planner call on the whole micro-batch (p50 and max).
* **window** (``--reorder-window W`` > 1; ``null`` otherwise): the W micro-batches of a step (the whole
  global batch) planned together. The lead replicas meet once a step (the gradient all-reduce); in
  between, micro-batches stream through the encoder-to-LM pipeline, so the step's encoder time
  follows the slowest replica's cost *summed over the step*. ``straggler`` is that step straggler,
  max / mean over the d replicas of their step sums, for: ``per_micro_batch`` (each micro-batch
  balanced alone over the d replicas, ``balanced_replicas``, as with window 1), ``window``
  (``balanced_order`` over the step's ``W × d`` groups: what the planner does with
  ``reorder_window = W``), ``window_replica`` (diagnostic:
  the step balanced over the d replicas, each holding ``W × K`` samples, then each replica's
  samples dealt into its W micro-batch slots heaviest first in snake order) and ``bound``
  (:func:`~mimo_accel.balance.lower_bound` of the step over d replicas). ``bound_per_micro_batch``
  is the row's per-micro-batch bound (set by the largest image and the cheapest fill); ``removed``
  the share of its excess over 1 (p50) that a plan's step straggler no longer has.
  ``lockstep``: Σ over micro-batches of the slowest replica / Σ of the mean, the straggler if every
  micro-batch waited for all replicas instead.

JSON (``--json``; format ``mimo-accel-simulate/2``), stable keys (``<lead>``: the lead encoder's
name; ``M``: every module's)::

    format, profile{name, path, description, summary{...}},
    cost_model{a, b, source, modules{M: {a, b, k}}}, steps, window, samples_per_replica, seed,
    language_dp_rule, elapsed_s, notes[], lead, modules[], kinds{M: kind},
    layout{M: {tp, pp, dp}, micro_batch_size},
    rows[]: {dp, language_dp, [audio_dp,] grid, micro_batch_size,
             modules{dps{M: dp},
                     spread{M: {contiguous|lpt|encoder_only|joint|bound: {p50, p99, mean}}},
                     worst{contiguous|lpt|encoder_only|joint|bound: {p50, p99, mean}},
                     worst_over_bound{contiguous|lpt|encoder_only|joint: {p50, p99, mean}},
                     plan_ms{encoder_only_p50, joint_p50, joint_max, lpt_p50, joint_over_encoder_only}},
             straggler{contiguous|lpt|balanced|balanced_replicas|bound: {p50, p99, mean}},
             speedup{balanced_vs_contiguous, balanced_vs_lpt, lpt_vs_contiguous,
                     balanced_replicas_vs_contiguous, time_saved},
             reads{data_ranks{<lead>, language}, micro_batch_bytes,
                   baseline{per_rank_samples, per_rank_bytes, cluster_samples, cluster_bytes,
                            amplification},
                   sharded{per_rank_samples{<lead>, language}, per_rank_bytes{<lead>, language},
                           per_rank_bytes_max{<lead>}, cluster_samples, cluster_bytes,
                           amplification},
                   cluster_reduction},
             exchange{plan_before_read_bytes,
                      lpt|balanced|balanced_matched: {samples_moved, samples_moved_fraction,
                                                     language_samples_moved, bytes_moved} | null},
             plan_ms{balanced_p50, balanced_max, lpt_p50, lpt_max, balanced_replicas_p50},
             window{micro_batches,
                    straggler{per_micro_batch|window|window_replica|bound: {p50, p99, mean}},
                    lockstep{per_micro_batch|window|window_replica: {p50, p99, mean}},
                    bound_per_micro_batch{p50, p99, mean},
                    removed{per_micro_batch|window|window_replica: fraction | null},
                    plan_ms{window_p50, window_max, window_replica_p50}} | null}

Sample counts and bytes are means per micro-batch (the tables' "per step" without a window);
``samples_moved`` counts lead-replica moves.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from mimo_accel.balance import (balance_modules, balanced_order, group_costs, lower_bound, lpt_order, module_bounds,
                                module_spreads)
from mimo_accel.costs import CostModel
from mimo_accel.modules import LANGUAGE
from mimo_accel.tools.simulate.figures import stats, totals_spread
from mimo_accel.tools.simulate.inputs import dp_for, dp_rule_value, lead_encoder_of, sample_costs
from mimo_accel.tools.simulate.memory import check_memory
from mimo_accel.tools.simulate.window import window_row
from mimo_accel.workloads import AUDIO, Profile, load_profile


SIMULATE_FORMAT = "mimo-accel-simulate/2"
PLANNERS = ("contiguous", "lpt", "balanced")
LABELS = {"contiguous": "contiguous (upstream)", "lpt": "LPT (upstream PR)", "balanced": "balanced (ours)"}
#: The plans every module's spread is given for (``rows[].modules``): upstream's contiguous split,
#: #4608's LPT on the lead encoder's cost, the encoder-only plan (``balanced_order`` on the lead
#: encoder's cost alone) and the joint plan (``balance_modules``).
MODULE_PLANNERS = ("contiguous", "lpt", "encoder_only", "joint")
MODULE_LABELS = {"contiguous": "contiguous", "lpt": "LPT (#4608)", "encoder_only": "{lead}-only",
                  "joint": "joint (ours)"}


# ------------------------------------------------------------------------------------- engine


def _owners(order: np.ndarray, n: int) -> np.ndarray:
    """owner[i]: the replica (of n) that sample i lands on under ``order``."""
    owner = np.empty(order.size, dtype=np.int64)
    owner[order] = np.arange(order.size) // (order.size // n)
    return owner


def _matched(order: np.ndarray, grid: int, nbytes: np.ndarray) -> np.ndarray | None:
    """``order`` with its canonical groups renumbered to keep the most bytes in place."""
    try:
        from scipy.optimize import linear_sum_assignment
    except ImportError:  # pragma: no cover - scipy ships with the megatron runtime
        return None
    size = order.size // grid
    groups = order.reshape(grid, size)
    slot = groups // size  # contiguous slot each sample sits in
    weight = np.zeros((grid, grid))
    np.add.at(weight, (np.repeat(np.arange(grid), size), slot.ravel()), nbytes[groups].ravel())
    rows, cols = linear_sum_assignment(weight, maximize=True)
    placed = np.empty_like(groups)
    placed[cols] = groups[rows]
    return placed.ravel()


def simulate(
    profile: Profile | str | Path,
    dp_sizes: Sequence[int],
    steps: int = 20,
    samples_per_replica: int | None = None,
    seed: int = 0,
    cost_model: CostModel | None = None,
    *,
    language_dp: str | float = "ratio",
    cost_source: str = "default",
    reorder_window: int = 1,
    audio_dp: str | float = "ratio",
) -> dict[str, Any]:
    """Run the simulation; returns the JSON document described in the module docstring.

    ``profile`` is a :class:`~mimo_accel.workloads.Profile` or a name/path for
    :func:`~mimo_accel.workloads.load_profile`; ``dp_sizes`` are the lead encoder's (the profile's
    first encoder); ``samples_per_replica`` defaults to the profile's ``micro_batch_size`` over
    the lead encoder's DP; ``cost_model`` to the built-in :class:`CostModel`.
    ``reorder_window``: micro-batches per step planned together, as AccelConfig's (``steps ×
    reorder_window`` micro-batches are drawn); above 1, each row also gets the global-batch window
    results (``rows[].window``). The JSON keeps the name ``window`` for it (its stable keys).
    """
    t_start = time.perf_counter()
    if not isinstance(profile, Profile):
        profile = load_profile(profile)
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a positive integer, got {steps!r}")
    window = reorder_window
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"reorder_window must be a positive integer (micro-batches per step), got {window!r}")
    dps = sorted(set(int(d) for d in dp_sizes))
    if not dps or dps[0] < 1:
        raise ValueError(f"dp sizes must be positive integers, got {list(dp_sizes)!r}")
    modules = profile.modules
    lead = lead_encoder_of(profile)
    rules = {m.name: (language_dp if m.is_language else audio_dp if m.name == AUDIO else "ratio")
             for m in modules if m.name != lead}
    k = samples_per_replica if samples_per_replica is not None else max(1, profile.micro_batch_size // modules[lead].dp)
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"samples per replica must be a positive integer, got {k!r}")
    model = CostModel() if cost_model is None else cost_model
    notes: list[str] = []

    plans = []
    for d in dps:
        layout = modules.replace(lead, dp=d)
        for name, rule in rules.items():
            layout = layout.replace(name, dp=dp_for(profile, name, d, rule))
        grid = layout.grid
        mbs = -(-d * k // grid) * grid
        if mbs != d * k:
            notes.append(f"dp {d}: {d} x {k} samples is not a multiple of G={grid}; used micro-batch {mbs}")
        plans.append((d, layout, grid, mbs))
    pool_mbs = max(p[3] for p in plans)
    n_mb = steps * window  # micro-batch s * window + j is micro-batch j of step s
    check_memory(profile, model, n_mb, pool_mbs)
    table = profile.sample_table(n_mb * pool_mbs, seed)
    module_costs_all = {m: c.reshape(n_mb, pool_mbs)
                        for m, c in sample_costs(table.cost_index(), model, modules).items()}
    costs_all = module_costs_all[lead]
    bytes_all = table.bytes.reshape(n_mb, pool_mbs)

    tp_v = modules[lead].tp
    lang_ranks_per_replica = modules[LANGUAGE].tp * modules[LANGUAGE].pp
    rows = []
    for d, layout, grid, mbs in plans:
        module_dps = layout.dp_sizes
        lang = module_dps[LANGUAGE]
        per_module: dict[str, dict[str, list[float]]] = {
            m: {p: [] for p in (*MODULE_PLANNERS, "bound")} for m in module_dps}
        worst: dict[str, list[float]] = {p: [] for p in (*MODULE_PLANNERS, "bound")}
        worst_excess: dict[str, list[float]] = {p: [] for p in MODULE_PLANNERS}
        ratios: dict[str, list[float]] = {p: [] for p in (*PLANNERS, "balanced_replicas", "bound")}
        maxes: dict[str, float] = dict.fromkeys((*PLANNERS, "balanced_replicas"), 0.0)
        ms: dict[str, list[float]] = {"balanced": [], "lpt": [], "balanced_replicas": [], "joint": []}
        moved: dict[str, dict[str, float]] = {
            p: {"samples": 0.0, "language_samples": 0.0, "bytes": 0.0} for p in ("lpt", "balanced", "balanced_matched")
        }
        matched_ok = True
        mb_bytes = 0.0
        lead_bytes_max = 0.0
        identity = np.arange(mbs)
        owner_v0, owner_l0 = identity // (mbs // d), identity // (mbs // lang)
        replica_sums = np.empty((n_mb, d))  # lead replica sums of each micro-batch balanced over its d replicas
        for s in range(n_mb):
            c = costs_all[s, :mbs]
            b = bytes_all[s, :mbs]
            mb_bytes += float(b.sum())
            t0 = time.perf_counter()
            lpt = np.asarray(lpt_order(c, grid), dtype=np.int64)
            t1 = time.perf_counter()
            bal = np.asarray(balanced_order(c, grid), dtype=np.int64)
            t2 = time.perf_counter()
            ms["lpt"].append((t1 - t0) * 1e3)
            ms["balanced"].append((t2 - t1) * 1e3)
            if grid > d:  # fan-out: also balance the d lead replicas directly
                t3 = time.perf_counter()
                bal_v = np.asarray(balanced_order(c, d), dtype=np.int64)
                ms["balanced_replicas"].append((time.perf_counter() - t3) * 1e3)
            else:  # the same call as the balanced plan
                bal_v = bal
                ms["balanced_replicas"].append(ms["balanced"][-1])
            for name, order in (("contiguous", identity), ("lpt", lpt), ("balanced", bal),
                                ("balanced_replicas", bal_v)):
                sums = group_costs(c, order, d)
                ratios[name].append(totals_spread(sums))
                maxes[name] += float(sums.max())
                if name == "balanced_replicas":  # the per-micro-batch plan the window is compared with
                    replica_sums[s] = sums
            mean = c.sum() / d
            ratios["bound"].append(lower_bound(c, d) / mean if mean > 0 else 1.0)
            # every module: the four plans side by side, and each module's bound
            mc = {m: module_costs_all[m][s, :mbs] for m in module_dps}
            t4 = time.perf_counter()
            joint = np.asarray(balance_modules(mc, module_dps), dtype=np.int64)
            ms["joint"].append((time.perf_counter() - t4) * 1e3)
            bounds = module_bounds(mc, module_dps)
            for m in module_dps:
                per_module[m]["bound"].append(bounds[m])
            worst["bound"].append(max(bounds.values()))
            for name, order in (("contiguous", identity), ("lpt", lpt), ("encoder_only", bal), ("joint", joint)):
                spreads = module_spreads(mc, module_dps, order)
                for m, v in spreads.items():
                    per_module[m][name].append(v)
                worst[name].append(max(spreads.values()))
                worst_excess[name].append(max(v - bounds[m] for m, v in spreads.items()))
            lead_bytes_max += float(group_costs(b, bal, d).max())
            matched = _matched(bal, grid, b) if matched_ok else None
            matched_ok = matched is not None
            for name, order in (("lpt", lpt), ("balanced", bal), ("balanced_matched", matched)):
                if order is None:
                    continue
                mv = _owners(order, d) != owner_v0
                ml = _owners(order, lang) != owner_l0
                m = moved[name]
                m["samples"] += float(mv.sum())
                m["language_samples"] += float(ml.sum())
                m["bytes"] += float(b[mv].sum()) * tp_v + float(b[ml].sum()) * lang_ranks_per_replica

        mb_bytes /= n_mb
        data_v, data_l = d * tp_v, lang * lang_ranks_per_replica
        base_cluster = mbs * (data_v + data_l)
        shard_cluster = mbs * (tp_v + lang_ranks_per_replica)
        exchange: dict[str, Any] = {"plan_before_read_bytes": 0.0}
        for name, m in moved.items():
            if name == "balanced_matched" and not matched_ok:
                exchange[name] = None
                continue
            exchange[name] = {
                "samples_moved": m["samples"] / n_mb,
                "samples_moved_fraction": m["samples"] / n_mb / mbs,
                "language_samples_moved": m["language_samples"] / n_mb,
                "bytes_moved": m["bytes"] / n_mb,
            }
        encoder_only_ms, joint_ms = float(np.median(ms["balanced"])), float(np.median(ms["joint"]))
        speedup = {
            "balanced_vs_contiguous": _div(maxes["contiguous"], maxes["balanced"]),
            "balanced_vs_lpt": _div(maxes["lpt"], maxes["balanced"]),
            "lpt_vs_contiguous": _div(maxes["contiguous"], maxes["lpt"]),
            "balanced_replicas_vs_contiguous": _div(maxes["contiguous"], maxes["balanced_replicas"]),
            "time_saved": 1.0 - _div(maxes["balanced"], maxes["contiguous"]),
        }
        per_rank_samples = {lead: mbs / d, LANGUAGE: mbs / lang}
        per_rank_bytes = {lead: mb_bytes / d, LANGUAGE: mb_bytes / lang}
        rows.append({
            "dp": d,
            "language_dp": lang,
            **({"audio_dp": module_dps[AUDIO]} if AUDIO in module_dps else {}),
            "grid": grid,
            "micro_batch_size": mbs,
            "modules": {
                "dps": module_dps,
                "spread": {m: {p: stats(v) for p, v in tab.items()} for m, tab in per_module.items()},
                "worst": {p: stats(v) for p, v in worst.items()},
                "worst_over_bound": {p: stats(v) for p, v in worst_excess.items()},
                "plan_ms": {"encoder_only_p50": encoder_only_ms, "joint_p50": joint_ms,
                            "joint_max": float(max(ms["joint"])), "lpt_p50": float(np.median(ms["lpt"])),
                            "joint_over_encoder_only": joint_ms / encoder_only_ms if encoder_only_ms > 0 else None},
            },
            "straggler": {name: stats(v) for name, v in ratios.items()},
            "speedup": speedup,
            "reads": {
                "data_ranks": {lead: data_v, LANGUAGE: data_l},
                "micro_batch_bytes": mb_bytes,
                "baseline": {
                    "per_rank_samples": float(mbs),
                    "per_rank_bytes": mb_bytes,
                    "cluster_samples": float(base_cluster),
                    "cluster_bytes": mb_bytes * (data_v + data_l),
                    "amplification": float(data_v + data_l),
                },
                "sharded": {
                    "per_rank_samples": per_rank_samples,
                    "per_rank_bytes": per_rank_bytes,
                    "per_rank_bytes_max": {lead: lead_bytes_max / n_mb},
                    "cluster_samples": float(shard_cluster),
                    "cluster_bytes": mb_bytes * (tp_v + lang_ranks_per_replica),
                    "amplification": float(tp_v + lang_ranks_per_replica),
                },
                "cluster_reduction": base_cluster / shard_cluster,
            },
            "exchange": exchange,
            "plan_ms": {
                "balanced_p50": float(np.median(ms["balanced"])),
                "balanced_max": float(max(ms["balanced"])),
                "lpt_p50": float(np.median(ms["lpt"])),
                "lpt_max": float(max(ms["lpt"])),
                "balanced_replicas_p50": float(np.median(ms["balanced_replicas"])),
            },
            "window": (window_row(costs_all[:, :mbs].reshape(steps, window, mbs), d, replica_sums,
                                   ratios["bound"]) if window > 1 else None),
        })

    said = [LANGUAGE, *(m for m in rules if m != LANGUAGE)]  # the language rule first
    rule = "; ".join(_rule_text(m, modules[m].dp, lead, modules[lead].dp, rules[m]) for m in said)
    return {
        "format": SIMULATE_FORMAT,
        "profile": {
            "name": profile.name,
            "path": str(profile.path) if profile.path else None,
            "description": profile.description,
            "summary": profile.summary(),
        },
        "cost_model": {"a": model.a, "b": model.b, "source": cost_source,
                       "modules": {m.name: model.of(m.name).to_dict() for m in modules}},
        "steps": steps,
        "window": window,
        "samples_per_replica": k,
        "seed": seed,
        "language_dp_rule": rule,
        "layout": {
            **{m.name: {"tp": m.tp, "pp": m.pp, "dp": m.dp} for m in modules},
            "micro_batch_size": profile.micro_batch_size,
        },
        "lead": lead,
        "modules": list(modules.names),
        "kinds": {m.name: m.kind for m in modules},
        "rows": rows,
        "notes": notes,
        "elapsed_s": time.perf_counter() - t_start,
    }


def _rule_text(what: str, module_dp: int, lead: str, lead_dp: int, rule: Any) -> str:
    rule = dp_rule_value(rule, what)
    if rule == "ratio":
        return (f"ratio: {what} dp = max(1, round(dp x {module_dp}/{lead_dp})) (the profile layout's ratio)")
    if rule == "equal":
        return f"equal: {what} dp = {lead} dp"
    return f"{what} dp = max(1, round(dp x {rule:g}))"


def _div(a: float, b: float) -> float:
    return a / b if b > 0 else 1.0
