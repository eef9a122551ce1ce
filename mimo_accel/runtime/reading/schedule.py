"""megatron-core's training schedule as the plans read it: how many micro-batches make a step.

A reorder window must tile a step (the loaders check it), and an announced cost model takes
effect a number of steps ahead (the calibration's lead); both read the count here.
"""

from __future__ import annotations

from typing import Optional


def micro_batches_per_step() -> Optional[int]:
    """megatron-core's micro-batches per training step (None before its calculator is set up; the
    calculator is the private ``_GLOBAL_NUM_MICROBATCHES_CALCULATOR``, declared in
    :data:`mimo_accel.patching.targets.INTERNALS`)."""
    from megatron.core import num_microbatches_calculator as nmc

    if getattr(nmc, "_GLOBAL_NUM_MICROBATCHES_CALCULATOR", None) is None:
        return None
    return int(nmc.get_num_microbatches())
