"""The window rows of the sweep (``--reorder-window W`` > 1, ``rows[].window``): the W
micro-batches of a step planned together against each balanced alone, and the diagnostic plan
that balances the step over the replicas first (:mod:`~mimo_accel.tools.simulate.sweep`'s module
doc defines each figure)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from mimo_accel.balance import balanced_order, group_costs, lower_bound
from mimo_accel.tools.simulate.figures import stats, totals_spread

__all__ = ["WINDOW_PLANS", "replica_window_order", "window_row"]


def replica_window_order(costs: np.ndarray, d: int, window: int) -> np.ndarray:
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


def window_row(costs: np.ndarray, d: int, replica_sums: np.ndarray, bound_mb: Sequence[float]) -> dict[str, Any]:
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
        replica_order = replica_window_order(flat, d, window)
        ms["window"].append((t1 - t0) * 1e3)
        ms["window_replica"].append((time.perf_counter() - t1) * 1e3)
        sums = {  # (micro-batch, replica) summed cost
            "per_micro_batch": replica_sums[s * window:(s + 1) * window],
            "window": group_costs(flat, window_order, window * d).reshape(window, d),
            "window_replica": group_costs(flat, replica_order, window * d).reshape(window, d),
        }
        for name, m in sums.items():
            step_ratio[name].append(totals_spread(m.sum(axis=0)))
            mean = float(m.mean(axis=1).sum())
            lockstep[name].append(float(m.max(axis=1).sum()) / mean if mean > 0 else 1.0)
        mean = flat.sum() / d
        step_ratio["bound"].append(lower_bound(flat, d) / mean if mean > 0 else 1.0)
    straggler = {name: stats(v) for name, v in step_ratio.items()}
    base = float(np.percentile(bound_mb, 50))
    return {
        "micro_batches": window,
        "straggler": straggler,
        "lockstep": {name: stats(v) for name, v in lockstep.items()},
        "bound_per_micro_batch": stats(bound_mb),
        "removed": {name: ((base - straggler[name]["p50"]) / (base - 1.0) if base - 1.0 > 1e-9 else None)
                    for name in WINDOW_PLANS},
        "plan_ms": {"window_p50": float(np.median(ms["window"])), "window_max": float(max(ms["window"])),
                    "window_replica_p50": float(np.median(ms["window_replica"]))},
    }
