"""The peer in the rehearsal: upstream PR #4608's planner in place of mimo_accel's joint plan.

Megatron-Bridge PR #4608 (``intra_microbatch_reorder``, split out and merged as #6306) assigns the
samples of a micro-batch to the DP replicas by equal-cardinality LPT on one cost per sample,
``cost_linear_vit · patches + cost_linear_lm · tokens`` with ``cost_linear_lm`` 0 by default, over
as many groups as the largest module DP. Here that planner stands in for the joint plan on the
same features (sharded reads, plan-before-read, packing), so the rehearsal can show upstream as
shipped, the peer's reorder and mimo_accel's side by side: what the peer's plan, blind to the
language model, leaves of the language straggler once packing makes real tokens the language
cost. The plan's predicted spreads are still each module's under the run's cost model.

Rehearsal harness only: installed in a rank by ``_bridge_rank`` when the run asks for it.
"""

from __future__ import annotations

import numpy as np

ENV = "MIMO_REHEARSAL_PEER"  # the rehearsal's own, not a setting of mimo_accel
COST_LINEAR_VIT, COST_LINEAR_LM = 1.0, 0.0  # #4608's defaults


def install() -> None:
    """Make :class:`mimo_accel.planner.CostIndexPlanner` plan as #4608 does (in this process)."""
    from mimo_accel import planner
    from mimo_accel.balance import lpt_order, module_loads, module_spreads

    def plan(self, indices, micro_batches: int = 1, model=None):
        idx = np.asarray(indices, dtype=np.int64)
        encoder = next(m.name for m in self.modules.encoders)
        cost = (COST_LINEAR_VIT * self.index.rows(self.columns[encoder], idx)
                + COST_LINEAR_LM * self.index.tokens(idx)).astype(np.float64)
        groups, n = max(self.dps.values()), len(indices) // micro_batches
        order = [j * n + p for j in range(micro_batches) for p in lpt_order(cost[j * n:(j + 1) * n], groups)]
        costs = self.costs(indices, model)
        spreads = module_spreads(costs, self.dps, order, micro_batches)
        return [indices[p] for p in order], planner.Spreads(spreads, module_loads(costs, self.dps, order, micro_batches))

    planner.CostIndexPlanner.__call__ = plan
