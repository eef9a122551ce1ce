"""This rank's place in the job: where its data goes and what it does in a forward step.

A :class:`ShardContext` is this rank's module, its replica in the module's DP group and the
canonical grid G, worked out from Bridge's MIMO parallelism config and grids (what the
sampling-info lookup is given). A :class:`StepRole` is what the rank does in a forward step, read
off the MimoModel it hosts; :class:`ShardLengths` how that step's language lengths are known. The
:class:`~mimo_accel.runtime.state.Runtime` holds all three, so they sit below every service.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Optional

from mimo_accel.grid import canonical_grid, owned_groups
from mimo_accel.modules import LANGUAGE, Modules, module


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
