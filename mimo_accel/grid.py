"""The canonical grid: how one global micro-batch is shared between modules with different DP.

G = lcm of the module DP sizes; the global micro-batch is G contiguous groups and a module with DP d
owns G/d consecutive groups per replica, so every encoder replica and the language replica(s) it
feeds through BridgeCommunicator (fan-in, fan-out) hold the same samples in the same order. Pure.
"""

from __future__ import annotations

import math
from typing import Iterable, Sequence

import numpy as np


def canonical_grid(dp_sizes: Iterable[int]) -> int:
    """G = lcm of the module DP sizes."""
    sizes = list(dp_sizes)
    if not sizes:
        raise ValueError("canonical_grid needs at least one module DP size")
    for d in sizes:
        if not isinstance(d, int) or isinstance(d, bool) or d < 1:
            raise ValueError(f"DP sizes must be positive integers, got {sizes}")
    return math.lcm(*sizes)


def owned_groups(dp_rank: int, dp_size: int, grid: int) -> range:
    """The canonical groups replica ``dp_rank`` of a module with ``dp_size`` replicas owns."""
    if dp_size < 1 or grid < 1 or grid % dp_size:
        raise ValueError(f"grid {grid} must be a positive multiple of dp_size {dp_size}")
    if not 0 <= dp_rank < dp_size:
        raise ValueError(f"dp_rank {dp_rank} out of range for dp_size {dp_size}")
    per = grid // dp_size
    return range(dp_rank * per, (dp_rank + 1) * per)


def check_micro_batch(micro_batch_size: int, grid: int, what: str = "micro_batch_size") -> int:
    """Samples per canonical group; a clear error naming G and the nearest valid sizes otherwise."""
    if micro_batch_size < 1 or micro_batch_size % grid:
        lower = (micro_batch_size // grid) * grid
        upper = lower + grid
        nearest = [s for s in (lower, upper) if s >= grid]
        raise ValueError(
            f"{what}={micro_batch_size} is not divisible by the canonical grid G={grid} "
            f"(lcm of the module DP sizes): every module must cut the global micro-batch into the "
            f"same G groups. Use a multiple of {grid}, e.g. {' or '.join(map(str, nearest))}.")
    return micro_batch_size // grid


def replica_samples(positions: Sequence[int], dp_rank: int, dp_size: int, grid: int) -> Sequence[int]:
    """This replica's share of a global micro-batch given in canonical-group order (a slice of
    ``positions``)."""
    per_group = check_micro_batch(len(positions), grid, "global micro-batch size")
    groups = owned_groups(dp_rank, dp_size, grid)
    return positions[groups.start * per_group: groups.stop * per_group]


def moved_between_replicas(before: Sequence[int], after: Sequence[int], dp_size: int) -> int:
    """How many samples of a global micro-batch a replica of a module with ``dp_size`` replicas gets
    that another one would have got: ``before`` in upstream's order (replica r takes the r-th
    contiguous part), ``after`` the same samples as planned."""
    b, a = np.asarray(before), np.asarray(after)
    per = len(b) // dp_size if dp_size else 0
    if not per or len(a) != len(b):
        return 0
    # each sample's position in either order, matched by sorting the samples
    return int(np.count_nonzero(np.argsort(b, kind="stable") // per != np.argsort(a, kind="stable") // per))
