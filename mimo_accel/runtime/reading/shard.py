"""Where this rank's data goes, what it does in a step, and the tag a batch read for one replica carries.

A :class:`ShardContext` is this rank's module, its replica in the module's DP group and the
canonical grid G, worked out from Bridge's MIMO parallelism config and grids (what the
sampling-info lookup is given). A :class:`ShardTag` rides in every batch the sharded loader
delivers (key :data:`SHARD_TAG_KEY`), so the forward step knows the batch is already this
replica's share and can check it was read for this very replica. It holds the batch's
:class:`ReplicaShare`: the indices the sampler chose and what the plan predicted for them, one
record from the sampler, through the read and the loader's workers, to the profiler. A
:class:`StepRole` is what the rank does in a forward step, read off the MimoModel it hosts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

from mimo_accel.grid import canonical_grid, owned_groups
from mimo_accel.modules import LANGUAGE, Modules, module

SHARD_TAG_KEY = "mimo_accel_shard"


@dataclass(frozen=True)
class ShardContext:
    """Where this rank's data goes: its module, its replica in the module DP group, and G."""

    module: str
    dp_rank: int
    dp_size: int
    grid: int
    dp_sizes: dict = field(default_factory=dict)  # every module's DP size (what G came from)
    stages: dict = field(default_factory=dict)  # every module's pipeline-parallel size (the step plan's stages)
    data_ranks: tuple = ()  # every rank that builds data loaders in this layout
    # False under upstream's scalable reads (megatron_mimo_scalable_dp): the step skips its slice,
    # so the batch's tag is taken off by the step's get_batch instead (mimo_accel.runtime.patches.step).
    sliced_in_step: bool = True

    @property
    def groups(self) -> range:
        return owned_groups(self.dp_rank, self.dp_size, self.grid)

    @property
    def modules(self) -> Modules:
        sizes = self.dp_sizes or {self.module: self.dp_size}
        return Modules.of(*(module(name, dp, pp=self.stages.get(name, 1)) for name, dp in sizes.items()))


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


def data_loading_ranks(grids: Mapping[str, object]) -> tuple[int, ...]:
    """The ranks Bridge builds data loaders on, from the grids alone (no communication).

    Bridge (megatron/bridge/data/megatron_mimo/dp_utils.py ``_needs_data_for_module``): every
    language rank loads data; an encoder rank loads data on its first pipeline stage only.
    """
    ranks: set[int] = set()
    for name, grid in grids.items():
        for pp_group in grid.get_rank_enum(["pp"]):
            ranks.update(pp_group if name == LANGUAGE else pp_group[:1])
    return tuple(sorted(ranks))


def context_from_grids(parallelism_config, grids):
    """(ShardContext, module DP group) of this rank from the MIMO parallelism config and grids;
    (None, None) on a rank outside every module."""
    import torch.distributed as dist

    me = dist.get_rank()
    layout = Modules.from_parallelism(parallelism_config)
    dp_sizes = layout.dp_sizes
    for name, grid in grids.items():
        if grid.rank_offset <= me < grid.rank_offset + grid.size:
            dp = grid.get_pg(["dp"])
            return ShardContext(module=name, dp_rank=dp.rank(), dp_size=dp.size(),
                                grid=canonical_grid(dp_sizes.values()), dp_sizes=dp_sizes,
                                stages={m.name: m.pp for m in layout},
                                data_ranks=data_loading_ranks(grids)), dp
    return None, None


@dataclass(frozen=True)
class StepRole:
    """What this rank does in a forward step (from the MimoModel's role)."""

    is_language: bool
    is_first_stage: bool
    is_last_stage: bool
    sequence_parallel_size: int  # T must divide by this for sequence parallelism (tp·cp), else 1
    placeholder_ids: tuple = ()  # the modality placeholder token ids in input_ids
    context_parallel_size: int = 1  # the language grid's cp: packed segments align to 2·cp


@dataclass(frozen=True)
class ShardLengths:
    """How the language shard's real lengths are known, decided once a step: ``lengths`` from
    ``loss_mask`` and the placeholder tokens where the ``attention_mask`` marks no padding (all ones:
    Bridge's MegatronMIMODataset), else None (the mask marks them, and is the length source)."""

    lengths: Optional[list] = None
