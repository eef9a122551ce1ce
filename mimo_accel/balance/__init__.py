"""Balanced plans for a global micro-batch (pure, deterministic, numpy only).

- :mod:`~mimo_accel.balance.partition`: one cost per sample, cut into equal-size groups with
  near-equal cost (``balanced_order``; LPT and the lower bound beside it);
- :mod:`~mimo_accel.balance.joint`: a cost per sample *per module*, every module's
  replicas balanced at once on the canonical grid (``balance_modules``);
- :mod:`~mimo_accel.balance.step_schedule`: the step the 1F1B pipeline runs, its modelled time
  (``step_time``) and a plan of the step's micro-batches that shortens it (``plan_step``).
"""

from mimo_accel.balance.partition import balanced_order, contiguous_order, group_costs, lower_bound, lpt_order, spread
from mimo_accel.balance.joint import balance_modules, module_bounds, module_loads, module_spreads
from mimo_accel.balance.step_schedule import plan_step, step_time

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
    "plan_step",
    "spread",
    "step_time",
]
