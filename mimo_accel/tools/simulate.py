"""The planners at cluster scale, without processes: what sharding and reordering would buy.

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

JSON (``--json``; format ``mimo-accel-simulate/1``), stable keys (``<lead>``: the lead encoder's
name; ``M``: every module's)::

    format, profile{name, path, description, summary{...}},
    cost_model{a, b, c, source, modules{M: {a, b, k}}}, steps, window, samples_per_replica, seed,
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

These aliases stand beside them, kept for one release (docs/compatibility.md):
``vision_only`` (= ``encoder_only``, also in ``vision_only_p50`` / ``joint_over_vision_only``),
``balanced_vision`` (= ``balanced_replicas``, also ``balanced_vision_p50``), ``vision_speedup``
(= ``speedup``, with ``balanced_vision_vs_contiguous`` and ``vision_time_saved``) and
``sharded.vision_per_rank_samples`` / ``language_per_rank_samples`` / ``vision_per_rank_bytes`` /
``language_per_rank_bytes`` / ``vision_per_rank_bytes_max`` (the lead encoder's and the language
model's entries of the per-module tables).

Sample counts and bytes are means per micro-batch (the tables' "per step" without a window);
``samples_moved`` counts lead-replica moves.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from mimo_accel.balance import (balance_modules, balanced_order, group_costs, lower_bound, lpt_order, module_bounds,
                                module_spreads, spread)
from mimo_accel.costs import CostIndex, CostModel
from mimo_accel.modules import LANGUAGE, Modules
from mimo_accel.planner import CostIndexPlanner
from mimo_accel.tools.arguments import (Renamed, UsageError, fail, nonnegative_int, output_file, parse, positive_int,
                                        require_extra)
from mimo_accel.workloads import AUDIO, Profile, ProfileError, load_profile

__all__ = ["SIMULATE_FORMAT", "PLANNERS", "MODULE_PLANNERS", "audio_dp_for", "dp_for", "language_dp_for", "main",
           "figure", "parse_dp_list", "render", "sample_costs", "simulate", "write_png"]

SIMULATE_FORMAT = "mimo-accel-simulate/1"
PLANNERS = ("contiguous", "lpt", "balanced")
_LABELS = {"contiguous": "contiguous (upstream)", "lpt": "LPT (upstream PR)", "balanced": "balanced (ours)"}
#: The plans every module's spread is given for (``rows[].modules``): upstream's contiguous split,
#: #4608's LPT on the lead encoder's cost, the encoder-only plan (``balanced_order`` on the lead
#: encoder's cost alone) and the joint plan (``balance_modules``).
MODULE_PLANNERS = ("contiguous", "lpt", "encoder_only", "joint")
_MODULE_LABELS = {"contiguous": "contiguous", "lpt": "LPT (#4608)", "encoder_only": "{lead}-only",
                  "joint": "joint (ours)"}
#: Per-module plan names -> the names that said "vision" for the lead encoder, kept beside them
#: for one release (docs/compatibility.md).
VISION_ALIASES = {"encoder_only": "vision_only", "balanced_replicas": "balanced_vision"}


# ------------------------------------------------------------------------------------- inputs


def parse_dp_list(text: str) -> list[int]:
    """``"2,4,8"`` or ``"2,4,8,...,512"`` (the step of the last two values, geometric or
    arithmetic, continued up to the value after ``...``) -> sorted unique DP sizes. The step is
    geometric when the second value is a multiple (> 1) of the first: ``1,3,...,9`` is 1, 3, 9."""
    parts = [p.strip() for p in str(text).split(",") if p.strip()]
    out: list[int] = []
    i = 0
    while i < len(parts):
        p = parts[i]
        if p in ("...", "…"):
            if len(out) < 2 or i + 1 >= len(parts):
                raise ValueError(f"--dp {text!r}: '...' needs two values before it and one after, e.g. 2,4,...,512")
            a, b = out[-2], out[-1]
            end = _dp_int(parts[i + 1], text)
            geometric = b > a and b % a == 0 and b // a > 1
            step = b // a if geometric else b - a
            if step < (2 if geometric else 1):
                raise ValueError(f"--dp {text!r}: the values before '...' must increase")
            x = b
            while True:
                x = x * step if geometric else x + step
                if x > end:
                    break
                out.append(x)
            if out[-1] != end:
                raise ValueError(
                    f"--dp {text!r}: {end} is not reached from {a}, {b} ({'x' if geometric else '+'}{step}); "
                    "give values that lead to the last one"
                )
            i += 2
            continue
        out.append(_dp_int(p, text))
        i += 1
    if not out:
        raise ValueError("--dp: give at least one DP size, e.g. 2,4,...,512")
    return sorted(set(out))


def _dp_int(p: str, text: str) -> int:
    try:
        v = int(p)
    except ValueError:
        raise ValueError(f"--dp {text!r}: {p!r} is not a whole number") from None
    if v < 1:
        raise ValueError(f"--dp {text!r}: DP sizes must be >= 1, got {v}")
    return v


def _dp_rule(rule: Any, what: str) -> str | float:
    if rule in ("ratio", "equal"):
        return rule
    try:
        factor = float(rule)
    except (TypeError, ValueError):
        factor = -1.0
    if not (math.isfinite(factor) and factor > 0):
        raise ValueError(f"{what} DP rule must be 'ratio' or 'equal', got {rule!r}"
                         " (or a positive number: that many replicas per replica of the lead encoder)")
    return factor


def _lead_encoder(profile: Profile) -> str:
    """The encoder whose DP the simulation sweeps: the profile's first encoder."""
    return profile.modules.encoders[0].name


def dp_for(profile: Profile, module: str, dp: int, rule: str | float = "ratio") -> int:
    """Module ``module``'s DP simulated next to the lead encoder's DP ``dp`` (see the module
    docstring): the profile layout's ratio, ``equal``, or ``rule`` replicas per lead replica."""
    rule = _dp_rule(rule, module)
    if rule == "equal":
        return dp
    factor = profile.modules[module].dp / profile.modules[_lead_encoder(profile)].dp if rule == "ratio" else rule
    return max(1, round(dp * factor))


def language_dp_for(profile: Profile, dp: int, rule: str | float = "ratio") -> int:
    """The language DP simulated next to the lead encoder's DP ``dp``."""
    return dp_for(profile, LANGUAGE, dp, rule)


def audio_dp_for(profile: Profile, dp: int, rule: str | float = "ratio") -> int | None:
    """The audio encoder's DP next to the lead encoder's DP ``dp`` (None: the profile has no audio encoder)."""
    return dp_for(profile, AUDIO, dp, rule) if AUDIO in profile.modules else None


def sample_costs(index: CostIndex, model: CostModel, modules: Modules) -> dict[str, np.ndarray]:
    """Every module's cost of every sample of ``index``: the planner's own pricing
    (:meth:`mimo_accel.planner.CostIndexPlanner.costs`), so the simulation plans what the job plans."""
    return CostIndexPlanner(index, model, modules).costs(np.arange(len(index)))


# ------------------------------------------------------------------------------------- engine


def _stats(values: Sequence[float]) -> dict[str, float]:
    a = np.asarray(values, dtype=np.float64)
    return {"p50": float(np.percentile(a, 50)), "p99": float(np.percentile(a, 99)), "mean": float(a.mean())}


def _aliased(table: dict[str, Any], aliases: dict[str, str]) -> dict[str, Any]:
    """``table`` with each key of ``aliases`` also under its alias (kept for one release)."""
    return {**table, **{old: table[new] for new, old in aliases.items() if new in table}}


def _totals_spread(totals: np.ndarray) -> float:
    """The spread of replicas whose totals are ``totals`` (max / mean; 1.0 without cost)."""
    return spread(totals, np.arange(totals.size), totals.size)


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


def _replica_window_order(costs: np.ndarray, d: int, window: int) -> np.ndarray:
    """The diagnostic window plan: the step's samples balanced over the ``d`` vision replicas
    (each holds ``window × K`` of them), then each replica's samples dealt into its ``window``
    micro-batch slots heaviest first in snake order, so every replica's heaviest samples share a
    micro-batch. Returns an order in the planner's layout: micro-batch j is the j-th block, cut
    into the d replicas' contiguous shares."""
    per = costs.size // (d * window)  # samples per replica per micro-batch
    rows = np.asarray(balanced_order(costs, d), dtype=np.int64).reshape(d, window * per)
    rows = np.take_along_axis(rows, np.argsort(-costs[rows], axis=1, kind="stable"), axis=1)
    rank = np.arange(window * per) % (2 * window)
    slot = np.where(rank < window, rank, 2 * window - 1 - rank)  # 0, 1, .., W-1, W-1, .., 0, 0, ..
    rows = rows[:, np.argsort(slot, kind="stable")]
    return rows.reshape(d, window, per).transpose(1, 0, 2).ravel()


WINDOW_PLANS = ("per_micro_batch", "window", "window_replica")


def _window_row(costs: np.ndarray, d: int, replica_sums: np.ndarray, bound_mb: Sequence[float]) -> dict[str, Any]:
    """The ``window`` entry of a row: ``costs`` is (steps, window, micro-batch) and
    ``replica_sums[s * window + j]`` the lead encoder's replica sums of micro-batch j balanced alone
    over its d replicas (``balanced_replicas``: what the planner does per micro-batch)."""
    steps, window, mbs = costs.shape
    step_ratio: dict[str, list[float]] = {p: [] for p in (*WINDOW_PLANS, "bound")}
    lockstep: dict[str, list[float]] = {p: [] for p in WINDOW_PLANS}
    ms: dict[str, list[float]] = {"window": [], "window_replica": []}
    for s in range(steps):
        flat = costs[s].ravel()
        t0 = time.perf_counter()
        window_order = np.asarray(balanced_order(flat, d * window), dtype=np.int64)
        t1 = time.perf_counter()
        replica_order = _replica_window_order(flat, d, window)
        ms["window"].append((t1 - t0) * 1e3)
        ms["window_replica"].append((time.perf_counter() - t1) * 1e3)
        sums = {  # (micro-batch, replica) summed cost
            "per_micro_batch": replica_sums[s * window:(s + 1) * window],
            "window": group_costs(flat, window_order, window * d).reshape(window, d),
            "window_replica": group_costs(flat, replica_order, window * d).reshape(window, d),
        }
        for name, m in sums.items():
            step_ratio[name].append(_totals_spread(m.sum(axis=0)))
            mean = float(m.mean(axis=1).sum())
            lockstep[name].append(float(m.max(axis=1).sum()) / mean if mean > 0 else 1.0)
        mean = flat.sum() / d
        step_ratio["bound"].append(lower_bound(flat, d) / mean if mean > 0 else 1.0)
    straggler = {name: _stats(v) for name, v in step_ratio.items()}
    base = float(np.percentile(bound_mb, 50))
    return {
        "micro_batches": window,
        "straggler": straggler,
        "lockstep": {name: _stats(v) for name, v in lockstep.items()},
        "bound_per_micro_batch": _stats(bound_mb),
        "removed": {name: ((base - straggler[name]["p50"]) / (base - 1.0) if base - 1.0 > 1e-9 else None)
                    for name in WINDOW_PLANS},
        "plan_ms": {"window_p50": float(np.median(ms["window"])), "window_max": float(max(ms["window"])),
                    "window_replica_p50": float(np.median(ms["window_replica"]))},
    }


class TooLarge(ValueError):
    """The simulation would not fit in this machine's memory (raised before anything is allocated)."""


_MEASURED_SAMPLES = 1 << 16  # drawn once to price a sample's memory (tens of milliseconds)
_ALWAYS_FITS = 1 << 20  # below this many samples nothing is measured: a few hundred MB at most


def available_memory() -> int | None:
    """Bytes of memory available to a new allocation (MemAvailable; else the physical memory)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _gib(n: float) -> str:
    return f"{n / 2**30:,.1f} GiB"


def check_memory(profile: Profile, model: CostModel, micro_batches: int, per_micro_batch: int) -> None:
    """TooLarge, saying how much, where drawing ``micro_batches x per_micro_batch`` samples would not
    fit in the memory available. A sample's memory is measured on a small draw of the same profile
    and model (tracemalloc's peak: the table, its cost index and every module's costs), so it
    follows what a profile draws; planning one micro-batch takes about as much again per sample of
    it (RSS at 1, 2 and 4 micro-batches of 1.6 M receipts samples: within 10 % of the estimate)."""
    n = micro_batches * per_micro_batch
    if n + per_micro_batch <= _ALWAYS_FITS:
        return
    import tracemalloc

    was_tracing = tracemalloc.is_tracing()
    if not was_tracing:
        tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        start = tracemalloc.get_traced_memory()[0]
        sample_costs(profile.sample_table(_MEASURED_SAMPLES, 0).cost_index(), model, profile.modules)
        per_sample = (tracemalloc.get_traced_memory()[1] - start) / _MEASURED_SAMPLES
    finally:
        if not was_tracing:
            tracemalloc.stop()
    need, available = per_sample * (n + per_micro_batch), available_memory()
    if available is not None and need > available:
        batches = f"{micro_batches:,} micro-batch{'es' if micro_batches != 1 else ''} of {per_micro_batch:,}"
        raise TooLarge(f"the simulation needs about {_gib(need)} of memory for its {n:,} samples ({batches}, about "
                       f"{per_sample:,.0f} bytes each), and {_gib(available)} is available; give a smaller "
                       "--per-replica, fewer --steps (or a smaller --reorder-window), or smaller --dp sizes")


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
    lead = _lead_encoder(profile)
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
                ratios[name].append(_totals_spread(sums))
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
                "spread": {m: _aliased({p: _stats(v) for p, v in tab.items()}, VISION_ALIASES)
                           for m, tab in per_module.items()},
                "worst": _aliased({p: _stats(v) for p, v in worst.items()}, VISION_ALIASES),
                "worst_over_bound": _aliased({p: _stats(v) for p, v in worst_excess.items()}, VISION_ALIASES),
                "plan_ms": {"encoder_only_p50": encoder_only_ms, "joint_p50": joint_ms,
                            "joint_max": float(max(ms["joint"])), "lpt_p50": float(np.median(ms["lpt"])),
                            "joint_over_encoder_only": joint_ms / encoder_only_ms if encoder_only_ms > 0 else None,
                            "vision_only_p50": encoder_only_ms,
                            "joint_over_vision_only": joint_ms / encoder_only_ms if encoder_only_ms > 0 else None},
            },
            "straggler": _aliased({name: _stats(v) for name, v in ratios.items()}, VISION_ALIASES),
            "speedup": speedup,
            "vision_speedup": {
                "balanced_vs_contiguous": speedup["balanced_vs_contiguous"],
                "balanced_vs_lpt": speedup["balanced_vs_lpt"],
                "lpt_vs_contiguous": speedup["lpt_vs_contiguous"],
                "balanced_vision_vs_contiguous": speedup["balanced_replicas_vs_contiguous"],
                "vision_time_saved": speedup["time_saved"],
            },
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
                    "vision_per_rank_samples": per_rank_samples[lead],
                    "language_per_rank_samples": per_rank_samples[LANGUAGE],
                    "vision_per_rank_bytes": per_rank_bytes[lead],
                    "language_per_rank_bytes": per_rank_bytes[LANGUAGE],
                    "vision_per_rank_bytes_max": lead_bytes_max / n_mb,
                    "cluster_samples": float(shard_cluster),
                    "cluster_bytes": mb_bytes * (tp_v + lang_ranks_per_replica),
                    "amplification": float(tp_v + lang_ranks_per_replica),
                },
                "cluster_reduction": base_cluster / shard_cluster,
            },
            "exchange": exchange,
            "plan_ms": _aliased({
                "balanced_p50": float(np.median(ms["balanced"])),
                "balanced_max": float(max(ms["balanced"])),
                "lpt_p50": float(np.median(ms["lpt"])),
                "lpt_max": float(max(ms["lpt"])),
                "balanced_replicas_p50": float(np.median(ms["balanced_replicas"])),
            }, {"balanced_replicas_p50": "balanced_vision_p50"}),
            "window": (_window_row(costs_all[:, :mbs].reshape(steps, window, mbs), d, replica_sums,
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
        "cost_model": {"a": model.a, "b": model.b, "c": model.c, "source": cost_source,
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
    rule = _dp_rule(rule, what)
    if rule == "ratio":
        return (f"ratio: {what} dp = max(1, round(dp x {module_dp}/{lead_dp})) (the profile layout's ratio)")
    if rule == "equal":
        return f"equal: {what} dp = {lead} dp"
    return f"{what} dp = max(1, round(dp x {rule:g}))"


def _div(a: float, b: float) -> float:
    return a / b if b > 0 else 1.0


# ------------------------------------------------------------------------------------- output


def _bytes(n: float | None) -> str:
    if n is None:
        return "—"
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.0f} B"


def _count(n: float) -> str:
    return f"{n:,.0f}" if n >= 100 or float(n).is_integer() else f"{n:.1f}"


def _lead(doc: dict[str, Any]) -> str:
    return doc.get("lead", "vision")  # a document without "lead" swept "vision"


def _cost_text(cm: dict[str, Any]) -> str:
    """Each module's cost formula with its coefficients."""
    def one(name: str, c: dict[str, float]) -> str:
        if name == LANGUAGE:
            return f"{name} {c['a']:.4g}·tokens + {c['b']:.4g}·tokens²"
        return f"{name} {c['a']:.4g}·rows + {c['b']:.4g}·rows²" + (f" + {c['k']:.4g}·items" if c.get("k") else "")

    return "; ".join(one(name, c) for name, c in cm["modules"].items())


def render(doc: dict[str, Any], console: Console | None = None) -> None:
    """Print the simulation as rich tables."""
    console = console or Console()
    prof, cm, lead = doc["profile"], doc["cost_model"], _lead(doc)
    console.print(
        f"[bold]mimo-accel simulate[/]: profile [bold]{prof['name']}[/] — {prof['description']}\n"
        f"{_micro_batches(doc)} per DP size, {doc['samples_per_replica']} samples per {lead} replica, "
        f"seed {doc['seed']}; cost per sample: {_cost_text(cm)} ({cm['source']}); {doc['language_dp_rule']}"
    )
    t = Table(title=f"{lead.capitalize()} straggler ratio (max/mean replica cost), p50 / p99", title_justify="left")
    for col in (f"{lead} dp", "lang dp", "micro-batch"):
        t.add_column(col, justify="right")
    for name in PLANNERS:
        t.add_column(_LABELS[name], justify="right")
    fan_out = any(r["grid"] > r["dp"] for r in doc["rows"])
    if fan_out:
        t.add_column(f"balanced over\n{lead} replicas", justify="right")
    t.add_column("bound", justify="right")
    t.add_column(f"{lead} speedup\nvs contiguous", justify="right")
    t.add_column("vs LPT", justify="right")
    t.add_column("plan ms p50\nbalanced / LPT", justify="right")
    for r in doc["rows"]:
        st, sp, pm = r["straggler"], r["speedup"], r["plan_ms"]
        t.add_row(
            str(r["dp"]), str(r["language_dp"]), str(r["micro_batch_size"]),
            *(f"{st[n]['p50']:.3f} / {st[n]['p99']:.3f}" for n in (*PLANNERS, "balanced_replicas")[:3 + fan_out]),
            f"{st['bound']['p50']:.3f}",
            f"{sp['balanced_vs_contiguous']:.2f}x", f"{sp['balanced_vs_lpt']:.3f}x",
            f"{pm['balanced_p50']:.2f} / {pm['lpt_p50']:.2f}",
        )
    console.print(t)
    if fan_out:
        console.print(
            f"[yellow]fan-out[/] (language dp > {lead} dp): the planner balances G = lcm(dp) canonical groups;"
            f" 'balanced over {lead} replicas' balances the d {lead} replicas directly (still a valid plan)."
        )

    _render_modules(doc, console)

    per = "per step" if doc.get("window", 1) == 1 else "per micro-batch"
    t = Table(title=f"Reads {per}: baseline (every data rank reads the micro-batch) → sharded",
              title_justify="left")
    for col in (f"{lead} dp", f"data ranks\n{lead} + lang", f"per-rank samples\n{lead}", f"per-rank bytes\n{lead}",
                "per-rank samples\nlanguage", "cluster samples", "cluster bytes", "reduction"):
        t.add_column(col, justify="right")
    for r in doc["rows"]:
        rd = r["reads"]
        b, s = rd["baseline"], rd["sharded"]
        t.add_row(
            str(r["dp"]), f"{rd['data_ranks'][lead]} + {rd['data_ranks'][LANGUAGE]}",
            f"{_count(b['per_rank_samples'])} → {_count(s['per_rank_samples'][lead])}",
            f"{_bytes(b['per_rank_bytes'])} → {_bytes(s['per_rank_bytes'][lead])}",
            f"{_count(b['per_rank_samples'])} → {_count(s['per_rank_samples'][LANGUAGE])}",
            f"{_count(b['cluster_samples'])} → {_count(s['cluster_samples'])}",
            f"{_bytes(b['cluster_bytes'])} → {_bytes(s['cluster_bytes'])}",
            f"{rd['cluster_reduction']:.1f}x",
        )
    console.print(t)

    t = Table(title=f"Reorder traffic {per}: exchange mode (read, then all_to_all) vs plan-before-read (0)",
              title_justify="left")
    for col in (f"{lead} dp", "micro-batch", "moved: LPT", "moved: balanced", "moved: balanced,\nmatched groups",
                "bytes moved:\nLPT", "bytes moved:\nbalanced", "bytes moved:\nmatched", "plan-before-read"):
        t.add_column(col, justify="right")
    for r in doc["rows"]:
        ex = r["exchange"]

        def moved(name: str) -> str:
            e = ex.get(name)
            return "—" if e is None else f"{e['samples_moved']:.1f} ({e['samples_moved_fraction']:.0%})"

        t.add_row(
            str(r["dp"]), str(r["micro_batch_size"]), moved("lpt"), moved("balanced"), moved("balanced_matched"),
            *(_bytes((ex.get(n) or {}).get("bytes_moved")) for n in ("lpt", "balanced", "balanced_matched")),
            _bytes(ex["plan_before_read_bytes"]),
        )
    console.print(t)
    if doc.get("window", 1) > 1:
        _render_window(doc, console)
    for note in doc["notes"]:
        console.print(f"[yellow]note:[/] {note}")
    console.print(f"simulated in {doc['elapsed_s']:.2f} s")


def _render_modules(doc: dict[str, Any], console: Console) -> None:
    """Every module's spread under the four plans, p50, beside its bound; the worst module; the
    plan times of the encoder-only and the joint plan, side by side."""
    lead = _lead(doc)
    t = Table(title="Every module's replica spread (max/mean replica cost), p50 over micro-batches; "
                    "worst = the worst module's", title_justify="left")
    for col in (f"{lead} dp", "layout (dp)", "module"):
        t.add_column(col, justify="right")
    for name in MODULE_PLANNERS:
        t.add_column(_MODULE_LABELS[name].format(lead=lead), justify="right")
    for col in ("bound", "joint\nover bound", f"plan ms p50\n{lead}-only / joint"):
        t.add_column(col, justify="right")
    for r in doc["rows"]:
        mod = r.get("modules")
        if not mod:
            continue
        short = _short_names(list(mod["dps"]))
        layout = " / ".join(f"{short[m]}{dp}" for m, dp in mod["dps"].items())
        names = list(mod["spread"])
        for i, m in enumerate([*names, "worst"]):
            st = mod["worst"] if m == "worst" else mod["spread"][m]
            pm = mod["plan_ms"]
            over = (mod["worst_over_bound"]["joint"]["p50"] if m == "worst"
                    else st["joint"]["p50"] - st["bound"]["p50"])
            t.add_row(
                str(r["dp"]) if i == 0 else "", layout if i == 0 else "", f"[bold]{m}[/]" if m == "worst" else m,
                *(f"{st[p]['p50']:.3f}" for p in MODULE_PLANNERS), f"{st['bound']['p50']:.3f}", f"{over:+.3f}",
                f"{pm['encoder_only_p50']:.2f} / {pm['joint_p50']:.2f}" if m == "worst" else "",
                end_section=m == "worst",
            )
    console.print(t)
    console.print(
        f"LPT (#4608): lpt_order on the {lead} cost; {lead}-only: balanced_order on the {lead} cost (the shipped"
        " planner); joint: balance_modules over every module. Module costs per sample as the planner prices them"
        " (CostIndex.module_costs): an encoder a·rows + b·rows² (+ k·items), the language model"
        " a·tokens + b·tokens² over its real tokens. worst-row 'joint over bound': the largest excess of a"
        " module over its own bound."
    )


def _short_names(names: list[str]) -> dict[str, str]:
    """Each name's shortest prefix that no other name starts with (vision, video -> vis, vid)."""
    def unique(name: str) -> str:
        return next((name[:k] for k in range(1, len(name))
                     if not any(o != name and o.startswith(name[:k]) for o in names)), name)

    return {name: unique(name) for name in names}


def _micro_batches(doc: dict[str, Any]) -> str:
    w = doc.get("window", 1)
    return f"{doc['steps']} micro-batches" if w == 1 else f"{doc['steps']} steps x {w} micro-batches"


def _render_window(doc: dict[str, Any], console: Console) -> None:
    w, lead = doc["window"], _lead(doc)
    t = Table(title=f"Global-batch window: {w} micro-batches per step planned together. Step straggler = max/mean "
                    f"over {lead} replicas of their cost summed over the step, p50", title_justify="left")
    for col in (f"{lead} dp", "micro-batch\nbound", "per-micro-batch\nplans", "window\n(planner)",
                "window,\nreplica totals", "step\nbound", "bound excess removed\nper-mb / window / replica",
                "lockstep p50\nper-mb / window / replica", "window plan\nms p50"):
        t.add_column(col, justify="right")
    for r in doc["rows"]:
        wr = r["window"]
        st, rm, ls = wr["straggler"], wr["removed"], wr["lockstep"]
        t.add_row(
            str(r["dp"]), f"{wr['bound_per_micro_batch']['p50']:.3f}",
            *(f"{st[n]['p50']:.3f}" for n in (*WINDOW_PLANS, "bound")),
            " / ".join("—" if rm[n] is None else f"{rm[n]:.0%}" for n in WINDOW_PLANS),
            " / ".join(f"{ls[n]['p50']:.3f}" for n in WINDOW_PLANS),
            f"{wr['plan_ms']['window_p50']:.1f}",
        )
    console.print(t)
    console.print(
        "micro-batch bound: the per-micro-batch straggler no plan of one micro-batch can beat (the largest image"
        " and the cheapest fill); [bold]removed[/]: the share of its excess over 1 gone at the step level."
        " per-micro-batch plans: each micro-batch balanced alone over the dp replicas (window 1); window (planner):"
        " balanced_order over"
        f" the step's {w} x dp groups, as reorder_window={w} plans it; replica totals (diagnostic): the step"
        " balanced over the dp replicas, each replica's samples dealt into its micro-batches heaviest first."
        " lockstep: sum over micro-batches of the slowest replica / of the mean, if every micro-batch waited for"
        " all replicas."
    )


_MODULE_COLORS = ("tab:green", "tab:blue", "tab:purple", "tab:brown", "tab:olive")


def write_png(doc: dict[str, Any], path: str | Path) -> None:
    """Charts of :func:`figure`, written to ``path``. Needs matplotlib."""
    fig = figure(doc)  # first: it names the fix where matplotlib is missing
    import matplotlib.pyplot as plt

    fig.savefig(path, dpi=110)
    plt.close(fig)


def figure(doc: dict[str, Any]):
    """Three charts against the lead encoder's DP: its straggler (3 planners, p50 and p99), every
    module's replica spread (p50: the joint plan, the encoder-only plan, the module's bound), and
    the read volume. Needs matplotlib (RuntimeError naming the fix without it)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise RuntimeError("--png needs matplotlib: pip install 'mimo-accel[charts]' (or pip install "
                           "matplotlib)") from e
    rows, lead = doc["rows"], _lead(doc)
    dps = [r["dp"] for r in rows]
    fig, (ax1, ax3, ax2) = plt.subplots(1, 3, figsize=(18, 4.8))
    for name, color in zip(PLANNERS, ("tab:red", "tab:orange", "tab:green")):
        ax1.plot(dps, [r["straggler"][name]["p50"] for r in rows], "o-", color=color, label=f"{_LABELS[name]} p50")
        ax1.plot(dps, [r["straggler"][name]["p99"] for r in rows], "--", color=color, alpha=0.6, label="p99")
    if any(r["grid"] > r["dp"] for r in rows):
        ax1.plot(dps, [r["straggler"]["balanced_replicas"]["p50"] for r in rows], "^-", color="tab:purple",
                 label=f"balanced over {lead} replicas p50")
    ax1.plot(dps, [r["straggler"]["bound"]["p50"] for r in rows], ":", color="gray", label="lower bound p50")
    ax1.set_xscale("log", base=2)
    ax1.set_xlabel(f"{lead} DP")
    ax1.set_ylabel("straggler ratio (max / mean replica cost)")
    ax1.set_title(f"{lead.capitalize()} load balance — {doc['profile']['name']}")
    ax1.legend(fontsize=8)
    ax1.grid(alpha=0.3)
    base = [r["reads"]["baseline"]["amplification"] for r in rows]
    shard = [r["reads"]["sharded"]["amplification"] for r in rows]
    ax2.plot(dps, base, "o-", color="tab:red", label="baseline: every data rank reads all")
    ax2.plot(dps, shard, "o-", color="tab:green", label="sharded reads")
    exch = [(r["exchange"].get("balanced") or {}).get("bytes_moved", 0.0) / r["reads"]["micro_batch_bytes"]
            if r["reads"]["micro_batch_bytes"] else 0.0 for r in rows]
    ax2.plot(dps, exch, "s--", color="tab:blue", label="exchange-mode traffic alone (balanced)")
    ax2.set_xscale("log", base=2)
    ax2.set_yscale("log")
    ax2.set_xlabel(f"{lead} DP")
    ax2.set_ylabel("bytes read per step / micro-batch bytes")
    ax2.set_title("Read volume, whole cluster (micro-batch = DP × K samples)")
    ax2.legend(fontsize=8)
    ax2.grid(alpha=0.3, which="both")
    modules = [r["modules"] for r in rows]
    for i, name in enumerate(doc["modules"]):
        color = _MODULE_COLORS[i % len(_MODULE_COLORS)]  # never drop a module: colours repeat past five
        tables = [m["spread"][name] for m in modules]
        ax3.plot(dps, [s["joint"]["p50"] for s in tables], "o-", color=color, label=f"{name}: joint plan p50")
        ax3.plot(dps, [s["encoder_only"]["p50"] for s in tables], "x--", color=color, alpha=0.7,
                 label=f"{name}: {lead}-only plan p50")
        ax3.plot(dps, [s["bound"]["p50"] for s in tables], ":", color=color, alpha=0.5, label=f"{name}: bound p50")
    ax3.set_xscale("log", base=2)
    ax3.set_xlabel(f"{lead} DP")
    ax3.set_ylabel("replica spread (max / mean replica cost)")
    ax3.set_title("Every module's replicas")
    ax3.legend(fontsize=7)
    ax3.grid(alpha=0.3)
    fig.tight_layout()
    return fig


# --------------------------------------------------------------------------------------- main


PROG = "mimo-accel simulate"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Simulate the planners (contiguous, LPT, balanced) and sharded reads at cluster scale.",
    )
    p.add_argument("--workload", default="receipts",
                   help="workload profile name (mimo_accel/workloads/<name>.toml) or path; default receipts")
    p.add_argument("--dp", default="2,4,...,512", help="DP sizes of the workload's first encoder (vision), e.g. 2,4,8 or 2,4,...,512 "
                                                        "(default)")
    p.add_argument("--steps", type=positive_int, default=20,
                   help="steps per DP size, each of --reorder-window global micro-batches (default 20)")
    p.add_argument("--reorder-window", type=positive_int, default=1, metavar="W",
                   help="global micro-batches per step planned together (AccelConfig's reorder_window, "
                        "MIMO_ACCEL_REORDER_WINDOW); default 1: each micro-batch alone. Above 1 adds the "
                        "window table")
    p.add_argument("--window", action=Renamed, new="--reorder-window", dest="reorder_window", type=positive_int)
    p.add_argument("--per-replica", type=positive_int, default=None, metavar="K",
                   help="samples per replica of the first encoder (default: the workload's micro_batch_size / "
                        "that encoder's dp)")
    p.add_argument("--seed", type=nonnegative_int, default=0)
    p.add_argument("--cost-model", metavar="FILE",
                   help="cost-model file from `mimo-accel calibrate` (AccelConfig's cost_model, "
                        "MIMO_ACCEL_COST_MODEL; default: built-in)")
    p.add_argument("--cost", action=Renamed, new="--cost-model", dest="cost_model")
    p.add_argument("--language-dp", default="ratio", metavar="ratio|equal|R",
                   help="language DP per first-encoder DP: the workload's ratio (default), equal, or R language "
                        "replicas per first-encoder replica (0.5: fan-in, 2: fan-out)")
    p.add_argument("--audio-dp", default=None, metavar="ratio|equal|R",
                   help="audio DP per first-encoder DP, where the workload has an [audio] encoder (as --language-dp)")
    p.add_argument("--json", metavar="PATH", help="write the results as JSON")
    p.add_argument("--png", metavar="PATH", help="write charts (needs matplotlib)")
    return p


def _cost_model(path: str | None) -> CostModel | None:
    if path is None:
        return None
    if not Path(path).exists():
        raise UsageError(f"--cost-model {path}: no such file; give the file `mimo-accel calibrate RUN_DIR --out "
                         "FILE` wrote, or leave --cost-model out for the built-in coefficients")
    return CostModel.from_file(path)


def _check_dp_rule(flag: str, rule: str, module: str) -> None:
    try:
        _dp_rule(rule, module)
    except ValueError:
        raise UsageError(f"{flag} {rule}: give ratio (the workload's), equal, or a positive number of {module} "
                         "replicas per replica of the workload's first encoder (e.g. 0.5, 2)") from None


def main(argv: Sequence[str] | None = None, *, console: Console | None = None) -> int:
    """``mimo-accel simulate``. Returns 0, or 2 (one ``error:`` line) on bad input or a failed export."""
    args = parse(_parser(), argv)
    if isinstance(args, int):
        return args
    try:
        output_file("--json", args.json)
        output_file("--png", args.png)
        if args.png:
            require_extra("--png", "matplotlib", "charts")
        profile = load_profile(args.workload)
        dps = parse_dp_list(args.dp)
        model = _cost_model(args.cost_model)
        _check_dp_rule("--language-dp", args.language_dp, "language")
        if args.audio_dp is not None:
            if AUDIO not in profile.modules:
                raise UsageError(f"--audio-dp {args.audio_dp}: the workload {profile.name} has no [audio] "
                                 "encoder; drop --audio-dp, or pick a workload with one")
            _check_dp_rule("--audio-dp", args.audio_dp, "audio")
        doc = simulate(profile, dps, steps=args.steps, samples_per_replica=args.per_replica, seed=args.seed,
                       cost_model=model, language_dp=args.language_dp,
                       cost_source=str(args.cost_model) if args.cost_model else "default",
                       reorder_window=args.reorder_window, audio_dp=args.audio_dp or "ratio")
    except (ProfileError, ValueError, OSError) as e:
        return fail(PROG, e)
    if console is None:
        # Piped output: rich would wrap the tables at 80 columns; give them room instead.
        console = Console() if sys.stdout.isatty() else Console(width=170)
    render(doc, console)
    if args.json:
        Path(args.json).write_text(json.dumps(doc, indent=2, allow_nan=False) + "\n", encoding="utf-8")
    if args.png:
        try:
            write_png(doc, args.png)
        except RuntimeError as e:
            return fail(PROG, e)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
