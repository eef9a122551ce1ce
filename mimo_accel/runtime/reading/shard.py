"""The tag a batch read for one replica carries, and the share of a micro-batch it holds.

A :class:`ShardTag` rides in every batch the sharded loader delivers (key :data:`SHARD_TAG_KEY`),
so the forward step knows the batch is already this replica's share and can check it was read for
this very replica. It holds the batch's :class:`ReplicaShare`: the indices the sampler chose and
what the plan predicted for them, one record from the sampler, through the read and the loader's
workers, to the profiler.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

from mimo_accel.runtime.context import ShardContext

SHARD_TAG_KEY = "mimo_accel_shard"


@dataclass(frozen=True, eq=False)  # compared field by field where needed: its loads are numpy arrays
class ReplicaShare:
    """This replica's share of one global micro-batch and what the plan predicted for it.

    The sampler yields it; the read (:class:`~mimo_accel.runtime.reading.sampler.ReadsOf`) and the tag carry
    it to the step, where the profiler reads it. Without a plan only ``indices`` are set."""

    indices: tuple = ()  # the samples, in order; () where the exchange brought them, not an index
    # the plan's predicted replica spread (max/mean): the worst module's (or the planner's one
    # number), and each module's where the planner gave them
    spread: Optional[float] = None
    spreads: Mapping[str, float] = field(default_factory=dict)
    # each module's planned load per replica for this micro-batch (cost-model units); empty where
    # the planner gave none (exchange mode, a planner of one number)
    loads: Mapping[str, Any] = field(default_factory=dict)
    # per module, the per-replica seconds per step the planning cost model leaves over, and that
    # model's digest (online calibration; else empty and None)
    overheads: Mapping[str, float] = field(default_factory=dict)
    cost_model: Optional[str] = None
    plan_wait_s: float = 0.0  # how long the training thread waited for this plan (planned ahead: ~0)
    # the step the pipeline model gives the window this share's micro-batch was planned in (a
    # window of a step's micro-batches; cost-model units), beside the step the profiler replays
    step_time: Optional[float] = None
    # samples of the micro-batch the plan gave another replica of this rank's module than upstream's
    # order would (exchange mode: the DP group's samples that moved); None without a plan
    moved: Optional[int] = None

    @property
    def planned(self) -> bool:
        """Whether a plan made this share (it predicted a spread)."""
        return self.spread is not None


@dataclass(frozen=True)
class ShardTag:
    """Rides in a sharded batch (key ``SHARD_TAG_KEY``) so the step knows it is already local."""

    module: str
    dp_rank: int
    dp_size: int
    grid: int
    samples: int
    sliced_in_step: bool = True  # see ShardContext.sliced_in_step
    share: Optional[ReplicaShare] = None  # what the sampler chose and the plan predicted
    bytes_exchanged: int = 0  # the sample bytes the exchange moved for this batch


def tag_for(ctx: ShardContext, samples: int, share: Optional[ReplicaShare] = None,
            bytes_exchanged: int = 0) -> ShardTag:
    """The tag of a batch of ``samples`` read for ``ctx`` as ``share``."""
    return ShardTag(ctx.module, ctx.dp_rank, ctx.dp_size, ctx.grid, samples, ctx.sliced_in_step, share,
                    bytes_exchanged)
