"""The peers in the rehearsal: another planner in place of mimo_accel's joint plan.

The peer's run keeps mimo_accel's other features (sharded reads, plan-before-read, packing) and
swaps only the plan, so the rehearsal shows upstream as shipped, the peer's reorder and
mimo_accel's side by side on the same samples. The plan's predicted spreads are still each
module's under the run's cost model.

Both peers are Megatron-Bridge PR #4608's reorder, which is in no Bridge release and not on main
(067f987, package 0.7.0, lacks ``reorder_buffer.py``):

- ``reorder-buffer``: #4608's ``reorder_buffer.py`` as the search index holds it (commit ce55b79f; its
  settings ``megatron_mimo_*`` on ``DirectHFSFTDatasetConfig``) with its defaults,
  :func:`mimo_accel.balance.peers.reorder_buffer_order` over G = lcm(module DPs). Its window only
  batches the exchange, so every micro-batch of a window is planned alone. ``upstream`` is its old
  name, still taken (:data:`ALIASES`).
- ``4608``: #4608 at its head 984a8a53 (settings on ``MegatronMIMOFeatureConfig``,
  ``intra_microbatch_reorder``): equal-size LPT per micro-batch over as many groups as the largest
  module DP, on ``cost_linear_vit · patches + cost_linear_lm · tokens`` (defaults 1 and 0).

Both price a sample's encoder work by its image patches: with several encoders, the sum of their
rows (upstream counts every image placeholder of a sample, whatever module encodes it).

Rehearsal harness only: installed in a rank by ``_bridge_rank`` when the run's environment names
a peer (:data:`ENV`).
"""

from __future__ import annotations

import os
from typing import Optional

import numpy as np

ENV = "MIMO_REHEARSAL_PEER"  # the rehearsal's own, not a setting of mimo_accel

#: The peers by name, with the name the rehearsal's output gives them: where the code is.
LABELS = {"4608": "#4608 at 984a8a53", "reorder-buffer": "#4608's reorder_buffer (ce55b79f)"}
#: Old names still taken, each for the peer it now names (said once where used).
ALIASES = {"upstream": "reorder-buffer"}

COST_LINEAR_VIT, COST_LINEAR_LM = 1.0, 0.0  # #4608's defaults


def _patches(planner, idx: np.ndarray) -> np.ndarray:
    """Each sample's rows over every encoder of the layout (its image patches)."""
    return sum(planner.index.rows(planner.columns[m.name], idx) for m in planner.modules.encoders)


def _order_4608(planner, idx: np.ndarray, micro_batches: int) -> list[int]:
    from mimo_accel.balance import lpt_order

    cost = (COST_LINEAR_VIT * _patches(planner, idx) + COST_LINEAR_LM * planner.index.tokens(idx)).astype(np.float64)
    groups, n = max(planner.dps.values()), len(idx) // micro_batches
    return [j * n + p for j in range(micro_batches) for p in lpt_order(cost[j * n:(j + 1) * n], groups)]


def _order_reorder_buffer(planner, idx: np.ndarray, micro_batches: int) -> list[int]:
    from mimo_accel.balance.peers import reorder_buffer_costs, reorder_buffer_order

    costs = reorder_buffer_costs(_patches(planner, idx), planner.index.tokens(idx))
    return reorder_buffer_order(costs, planner.grid, micro_batches)


_ORDERS = {"4608": _order_4608, "reorder-buffer": _order_reorder_buffer}


def resolve(name: str) -> str:
    """The peer ``name`` names (an old name in :data:`ALIASES` gives the new one). Raises ValueError
    for a name it does not know."""
    name = ALIASES.get(name, name)
    if name not in _ORDERS:
        raise ValueError(f"peer {name!r}: the rehearsal knows the peers {list(LABELS)}")
    return name


def alias_note(name: str) -> Optional[str]:
    """What to say once when ``name`` is an old name (None: it is not)."""
    if name not in ALIASES:
        return None
    new = ALIASES[name]
    return (f"--peer {name} is the old name of --peer {new}: {LABELS[new]}, in no Bridge release and not on "
            "Bridge main")


def install(name: str) -> None:
    """Make :class:`mimo_accel.planner.CostIndexPlanner` plan as the peer ``name`` does (in this
    process). Raises ValueError for a name it does not know."""
    from mimo_accel import planner
    from mimo_accel.balance import module_loads, module_spreads

    order_of = _ORDERS[resolve(name)]

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
