"""Balanced plans for a global micro-batch (pure, deterministic, numpy only).

- :mod:`~mimo_accel.balance.equal_size`: one cost per sample, cut into equal-size groups with
  near-equal cost (``balanced_order``; LPT and the lower bound beside it);
- :mod:`~mimo_accel.balance.every_module`: a cost per sample *per module*, every module's
  replicas balanced at once on the canonical grid (``balance_modules``).
"""

from mimo_accel.balance.equal_size import balanced_order, contiguous_order, group_costs, lower_bound, lpt_order, spread
from mimo_accel.balance.every_module import balance_modules, module_bounds, module_loads, module_spreads

__all__ = [
    "balance_modules",
    "balanced_order",
    "contiguous_order",
    "group_costs",
    "lower_bound",
    "lpt_order",
    "module_bounds",
    "module_loads",
    "module_spreads",
    "spread",
]
