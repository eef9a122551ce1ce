"""The peers in the rehearsal: another planner in place of mimo_accel's joint plan.

The peer's run keeps mimo_accel's other features (sharded reads, plan-before-read, packing) and
swaps only the plan, so the rehearsal shows upstream as shipped, the peer's reorder and
mimo_accel's side by side on the same samples. The plan's predicted spreads are still each
module's under the run's cost model.

- ``4608``: upstream PR #4608 (``intra_microbatch_reorder``): equal-size LPT per micro-batch over
  as many groups as the largest module DP, on ``cost_linear_vit · patches + cost_linear_lm ·
  tokens`` (defaults 1 and 0).
- ``upstream``: Bridge 0.7's merged reorder (``megatron_mimo_intra_microbatch_reorder``) with its
  defaults, :func:`mimo_accel.balance.peers.merged_reorder_order` over G = lcm(module DPs). Its
  window only batches the exchange, so every micro-batch of a window is planned alone.

Both price a sample's encoder work by its image patches: with several encoders, the sum of their
rows (upstream counts every image placeholder of a sample, whatever module encodes it).

Rehearsal harness only: installed in a rank by ``_bridge_rank`` when the run's environment names
a peer (:data:`ENV`).
"""

from __future__ import annotations

import os

import numpy as np

ENV = "MIMO_REHEARSAL_PEER"  # the rehearsal's own, not a setting of mimo_accel

#: The peers by name, with the name the rehearsal's output gives them.
LABELS = {"4608": "PR #4608", "upstream": "Bridge 0.7's reorder"}

COST_LINEAR_VIT, COST_LINEAR_LM = 1.0, 0.0  # #4608's defaults


def _patches(planner, idx: np.ndarray) -> np.ndarray:
    """Each sample's rows over every encoder of the layout (its image patches)."""
    return sum(planner.index.rows(planner.columns[m.name], idx) for m in planner.modules.encoders)


def _order_4608(planner, idx: np.ndarray, micro_batches: int) -> list[int]:
    from mimo_accel.balance import lpt_order

    cost = (COST_LINEAR_VIT * _patches(planner, idx) + COST_LINEAR_LM * planner.index.tokens(idx)).astype(np.float64)
    groups, n = max(planner.dps.values()), len(idx) // micro_batches
    return [j * n + p for j in range(micro_batches) for p in lpt_order(cost[j * n:(j + 1) * n], groups)]


def _order_upstream(planner, idx: np.ndarray, micro_batches: int) -> list[int]:
    from mimo_accel.balance.peers import merged_reorder_costs, merged_reorder_order

    costs = merged_reorder_costs(_patches(planner, idx), planner.index.tokens(idx))
    return merged_reorder_order(costs, planner.grid, micro_batches)


_ORDERS = {"4608": _order_4608, "upstream": _order_upstream}


def install(name: str) -> None:
    """Make :class:`mimo_accel.planner.CostIndexPlanner` plan as the peer ``name`` does (in this
    process). Raises ValueError for a name not in :data:`LABELS`."""
    from mimo_accel import planner
    from mimo_accel.balance import module_loads, module_spreads

    if name not in _ORDERS:
        raise ValueError(f"peer {name!r}: the rehearsal knows the peers {list(LABELS)}")
    order_of = _ORDERS[name]

    def plan(self, indices, micro_batches: int = 1, model=None):
        order = order_of(self, np.asarray(indices, dtype=np.int64), micro_batches)
        costs = self.costs(indices, model)
        spreads = module_spreads(costs, self.dps, order, micro_batches)
        return [indices[p] for p in order], planner.Prediction(spreads, module_loads(costs, self.dps, order, micro_batches))

    planner.CostIndexPlanner.__call__ = plan


def install_from_env() -> None:
    """:func:`install` the peer :data:`ENV` names, if it names one."""
    name = os.environ.get(ENV)
    if name:
        install(name)
