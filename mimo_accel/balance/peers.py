"""The peers' planners, for side-by-side comparison only (pure; the runtime never plans with them).

Megatron-Bridge PR #4608's intra-microbatch reorder (``src/megatron/bridge/data/megatron_mimo/reorder_buffer.py``,
on #4608's branch only: not on Bridge main 067f987, in no release), in the version whose settings are
``megatron_mimo_reorder_*`` on ``DirectHFSFTDatasetConfig`` (``balanced_index_order``,
``balanced_assignment``, ``build_window_route``), plans **each micro-batch alone**: one cost per sample,
``encoder_cost_weight · patches + language_cost_weight · real tokens`` (defaults 1 and 0), cut into
G = lcm(module DPs) equal-size groups by equal-cardinality LPT (most expensive first, ties by
position; each to the cheapest group with room, ties by group id). Group g goes to replica
``g // (G / dp)`` of a module with DP ``dp``; inside a replica, samples keep their place in the LPT
order (the canonical position). Its window only batches the exchange: no sample changes
micro-batch.

Written here from that description (not copied); ``mimo_accel_dev.rehearse`` and ``mimo-accel simulate``
run it as the peer named ``reorder-buffer`` (``upstream`` in ``simulate``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["ENCODER_COST_WEIGHT", "LANGUAGE_COST_WEIGHT", "reorder_buffer_order", "reorder_buffer_costs"]

#: #4608's reorder_buffer defaults (``megatron_mimo_reorder_{encoder,language}_cost_weight``).
ENCODER_COST_WEIGHT = 1.0
LANGUAGE_COST_WEIGHT = 0.0


def reorder_buffer_costs(patches: Sequence[float] | np.ndarray, tokens: Sequence[float] | np.ndarray, *,
                         encoder_weight: float = ENCODER_COST_WEIGHT,
                         language_weight: float = LANGUAGE_COST_WEIGHT) -> np.ndarray:
    """The reorder buffer's one cost per sample: ``encoder_weight·patches + language_weight·tokens``.

    Raises ValueError for weights that are negative, not finite, or both 0 (upstream's rule: at
    least one positive), and for counts that differ in length or are negative.
    """
    weights = np.array([encoder_weight, language_weight], dtype=np.float64)
    if not np.all(np.isfinite(weights)) or np.any(weights < 0) or not np.any(weights > 0):
        raise ValueError(f"reorder buffer weights (encoder {encoder_weight}, language {language_weight}): "
                         "both must be finite and >= 0, and at least one > 0")
    p = np.asarray(patches, dtype=np.float64)
    t = np.asarray(tokens, dtype=np.float64)
    if p.ndim != 1 or p.shape != t.shape:
        raise ValueError(f"patches {p.shape} and tokens {t.shape}: one count of each per sample")
    if np.any(p < 0) or np.any(t < 0) or not (np.all(np.isfinite(p)) and np.all(np.isfinite(t))):
        raise ValueError("patches and tokens must be finite counts >= 0")
    return encoder_weight * p + language_weight * t


def _lpt_one(cost: np.ndarray, n_groups: int) -> list[int]:
    """One micro-batch: equal-cardinality LPT, the groups laid out in group-id order, each in the
    order its samples were placed."""
    n = cost.size
    room = n // n_groups
    groups: list[list[int]] = [[] for _ in range(n_groups)]
    loads = [0.0] * n_groups
    for i in sorted(range(n), key=lambda j: (-cost[j], j)):
        best = min((g for g in range(n_groups) if len(groups[g]) < room), key=lambda g: (loads[g], g))
        groups[best].append(i)
        loads[best] += float(cost[i])
    return [i for group in groups for i in group]


def reorder_buffer_order(costs: Sequence[float] | np.ndarray, n_groups: int, micro_batches: int = 1) -> list[int]:
    """The reorder buffer's plan of ``micro_batches`` consecutive micro-batches (a window).

    ``costs``: one cost per sample (:func:`reorder_buffer_costs`), the window's micro-batches back to
    back. Returns a permutation of ``range(len(costs))`` in ``balance_modules``' convention: each
    micro-batch's block of the order is that micro-batch's samples, its G equal-size groups in
    canonical-group order (group g to replica ``g // (G / dp)`` of every module). Each micro-batch
    is planned alone: no sample leaves its micro-batch.
    """
    c = np.asarray(costs, dtype=np.float64)
    if c.ndim != 1 or not np.all(np.isfinite(c)) or np.any(c < 0):
        raise ValueError("costs must be a 1-D sequence of finite numbers >= 0")
    if n_groups < 1 or micro_batches < 1:
        raise ValueError(f"n_groups ({n_groups}) and micro_batches ({micro_batches}) must be >= 1")
    if c.size % micro_batches or (c.size // micro_batches) % n_groups:
        raise ValueError(f"{c.size} samples are not {micro_batches} micro-batches of a multiple of "
                         f"{n_groups} groups")
    size = c.size // micro_batches
    order: list[int] = []
    for j in range(micro_batches):
        order.extend(j * size + p for p in _lpt_one(c[j * size:(j + 1) * size], n_groups))
    return order

