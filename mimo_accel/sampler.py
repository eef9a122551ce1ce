"""Sharded (and planned) batch sampling on top of Megatron Bridge's own samplers.

Upstream builds every MIMO data rank's sampler with dp_size=1, so every rank reads the whole
global micro-batch. Here the upstream sampler is kept exactly as it is — it still decides the
*global* order (so ``single``/``cyclic``, epoch seeds, ``consumed_samples`` resume and
``drop_last`` behave as upstream, identically on every module) — and a wrapper yields only the
share of each global micro-batch that this rank's module replica owns on the canonical grid.
With a planner (reordering), the share is taken from the planned order instead of the loaded one.

Data flows one way: the sampler decides what a rank reads → the loader reads it → the step packs it.
"""

from __future__ import annotations

import sys
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional, Sequence

from mimo_accel.grid import canonical_grid, check_micro_batch, owned_groups

SHARD_TAG_KEY = "mimo_accel_shard"

# planner(global_indices, micro_batches) -> (the same indices in canonical-group order, predicted
# spread or None); with micro_batches > 1 the indices are a window of consecutive micro-batches.
Planner = Callable[[Sequence[int], int], "tuple[list[int], Optional[float]]"]


@dataclass(frozen=True)
class ShardContext:
    """Where this rank's data goes: its module, its replica in the module DP group, and G."""

    module: str
    dp_rank: int
    dp_size: int
    grid: int
    dp_sizes: dict = field(default_factory=dict)  # every module's DP size (what G came from)
    data_ranks: tuple = ()  # every rank that builds data loaders in this layout
    # False under upstream's scalable reads (megatron_mimo_scalable_dp): the step skips its slice,
    # so the batch's tag is taken off by the step's get_batch instead (mimo_accel.step).
    sliced_in_step: bool = True

    @property
    def groups(self) -> range:
        return owned_groups(self.dp_rank, self.dp_size, self.grid)


@dataclass(frozen=True)
class ShardTag:
    """Rides in a sharded batch (key ``SHARD_TAG_KEY``) so the step knows it is already local."""

    module: str
    dp_rank: int
    dp_size: int
    grid: int
    samples: int
    sliced_in_step: bool = True  # see ShardContext.sliced_in_step


# Bridge's build_megatron_mimo_data_loaders (megatron/bridge/data/megatron_mimo/loaders.py) looks
# up the sampling info once, then builds the train, validation and test loaders in this order.
SPLITS = ("train", "validation", "test")

_lock = threading.Lock()
_context: Optional[ShardContext] = None
_dp_group = None  # this rank's module DP process group (not part of the picklable context)
_lookup = None  # (parallelism config, grids) of the last sampling-info lookup, resolved lazily
_armed_by: Optional[tuple] = None  # (id, code) of the frame that looked the sampling info up
_loaders_built = 0  # loaders built since the context was set: which split comes next


def set_context(ctx: Optional[ShardContext], dp_group=None) -> None:
    global _context, _dp_group, _lookup, _armed_by, _loaders_built
    with _lock:
        _context, _dp_group, _lookup, _armed_by, _loaders_built = ctx, dp_group, None, None, 0


def arm(parallelism_config, grids, caller) -> None:
    """Record a sampling-info lookup made by the frame ``caller`` (Bridge's
    build_megatron_mimo_data_loaders, or a script's own build_data_iterators).

    The context is resolved only when a loader is built, and loaders are sharded only while that
    frame is still running: a lookup on its own (a unit test, a tool) never leaks into a later,
    unrelated build_pretraining_data_loader call.
    """
    global _context, _dp_group, _lookup, _armed_by, _loaders_built
    with _lock:
        _context, _dp_group, _loaders_built = None, None, 0
        _lookup = (parallelism_config, grids)
        _armed_by = (id(caller), caller.f_code) if caller is not None else None


def _resolve() -> None:
    global _context, _dp_group, _lookup
    if _lookup is not None:
        lookup, _lookup = _lookup, None
        _context, _dp_group = context_from_grids(*lookup)


# The local names of the three datasets in Bridge's build_megatron_mimo_data_loaders, in SPLITS order.
_SPLIT_LOCALS = ("train_ds", "valid_ds", "test_ds")


def take_split(dataset=None) -> str:
    """The split of the loader being built now.

    Bridge builds the train, validation and test loaders in that order, but skips the builder for
    a split without a dataset in some versions (#5525's ``_make_loader`` returns None first) and
    not in others, so counting calls alone can mislabel a test loader as validation. The dataset
    is looked up among the armed frame's datasets first; counting is the fallback.
    """
    global _loaders_built
    with _lock:
        n, _loaders_built = _loaders_built, _loaders_built + 1
    frame = _armed_caller()
    if dataset is not None and frame is not None:
        names = frame.f_locals
        hits = [s for s, local in zip(SPLITS, _SPLIT_LOCALS) if names.get(local) is dataset]
        if len(hits) == 1:  # the same dataset object for two splits: fall back to the order
            return hits[0]
    return SPLITS[n] if n < len(SPLITS) else f"loader{n}"


def current_context() -> Optional[ShardContext]:
    with _lock:
        _resolve()
        return _context


def context_for_loader() -> Optional[ShardContext]:
    """The context when the loader being built belongs to the call that looked up the sampling
    info (that frame is on the stack now), else None."""
    if _armed_by is None:
        return current_context()  # set directly (set_context): no frame to scope it
    return current_context() if _armed_caller() is not None else None


def _armed_caller():
    """The frame that looked the sampling info up, if it is on the stack now (else None)."""
    armed = _armed_by
    if armed is None:
        return None
    f = sys._getframe(1)
    while f is not None:
        if id(f) == armed[0] and f.f_code is armed[1]:
            return f
        f = f.f_back
    return None


def current_dp_group():
    with _lock:
        _resolve()
        return _dp_group


def context_from_grids(parallelism_config, grids):
    """(ShardContext, module DP group) of this rank from the MIMO parallelism config and grids;
    (None, None) on a rank outside every module."""
    import torch.distributed as dist

    from mimo_accel.agree import data_loading_ranks

    me = dist.get_rank()
    dp_sizes = {name: p.data_parallel_size for name, p in parallelism_config.module_parallelisms.items()}
    for name, grid in grids.items():
        if grid.rank_offset <= me < grid.rank_offset + grid.size:
            dp = grid.get_pg(["dp"])
            return ShardContext(module=name, dp_rank=dp.rank(), dp_size=dp.size(),
                                grid=canonical_grid(dp_sizes.values()), dp_sizes=dp_sizes,
                                data_ranks=data_loading_ranks(grids)), dp
    return None, None


def check_window(window: int, step_micro_batches: Optional[int]) -> None:
    """A reorder window must tile the micro-batches of a training step, so that samples move between
    the micro-batches of one step and never into another step (resume restarts at a step)."""
    if window < 1:
        raise ValueError(f"reorder window must be >= 1 micro-batch, got {window}")
    if window == 1:
        return
    if step_micro_batches is None:
        raise ValueError(
            f"mimo_accel reorder_window={window} needs the number of micro-batches per training step, "
            "which megatron-core's num-microbatches calculator did not have when the loader was built "
            "(Bridge's setup_megatron_mimo initialises it); set reorder_window=1 or build the loaders "
            "inside pretrain_megatron_mimo's build_data_iterators")
    if step_micro_batches % window:
        valid = [w for w in range(1, step_micro_batches + 1) if step_micro_batches % w == 0]
        raise ValueError(
            f"mimo_accel reorder_window={window} does not divide the {step_micro_batches} micro-batches "
            f"of a training step, so a window would take samples from the next step. Valid values: "
            f"{valid} ({step_micro_batches} balances the whole global batch).")


class ShardedBatchSampler:
    """Yields this replica's share of every global micro-batch the upstream sampler yields.

    With a planner and ``window`` > 1, ``window`` consecutive micro-batches are planned together;
    ``window`` must divide ``step_micro_batches`` and the sampler must start at a window boundary
    (a resume starts at a step), so a window never spans two training steps.
    """

    def __init__(self, global_sampler, ctx: ShardContext, planner: Optional[Planner] = None,
                 on_batch: Optional[Callable[[list, list, Optional[float]], None]] = None, window: int = 1,
                 step_micro_batches: Optional[int] = None, start: Optional[tuple[int, int]] = None):
        window = window if planner is not None else 1
        check_window(window, step_micro_batches)
        self.global_sampler = global_sampler
        # (consumed_samples, micro_batch_size) where the global sampler starts; default: its own
        # attributes (Megatron's flat samplers have them, #5525's canonical-group sampler does not)
        self.start = start
        self.ctx = ctx
        self.planner = planner
        self.on_batch = on_batch  # (global indices, local indices, predicted spread) -> None
        self.window = window
        self.step_micro_batches = step_micro_batches

    def _windows(self) -> Iterator[list[list]]:
        consumed, mbs = self.start or (getattr(self.global_sampler, "consumed_samples", None),
                                       getattr(self.global_sampler, "micro_batch_size", None))
        if self.window > 1 and consumed and mbs and (consumed // mbs) % self.window:
            raise ValueError(
                f"mimo_accel reorder_window={self.window}: the loader starts at consumed_samples="
                f"{consumed}, {consumed // mbs} micro-batches in, which is not the start of a window; "
                "resume from a checkpoint taken at the end of a training step")
        pending: list[list] = []
        for global_indices in self.global_sampler:
            pending.append(list(global_indices))
            if len(pending) == self.window:
                yield pending
                pending = []
        if pending:
            yield pending

    def __iter__(self) -> Iterator[list]:
        for batches in self._windows():
            sizes = {len(b) for b in batches}
            for b in batches:
                check_micro_batch(len(b), self.ctx.grid, "global micro-batch size")
            window = [i for b in batches for i in b]
            if self.planner is None:
                order, spread = window, None
            elif len(sizes) == 1:
                order, spread = self.planner(window, len(batches))
            else:  # a short last micro-batch (drop_last=False): plan it on its own
                parts = [self.planner(b, 1) for b in batches]
                order, spread = [i for p in parts for i in p[0]], max(p[1] for p in parts)
            if sorted(order) != sorted(window):
                raise RuntimeError("mimo_accel planner returned a different set of samples than the "
                                   "global micro-batch it was given; refusing to mis-pair samples")
            g = self.ctx.groups
            start = 0
            for b in batches:
                micro = order[start:start + len(b)]
                start += len(b)
                per_group = len(b) // self.ctx.grid
                local = micro[g.start * per_group: g.stop * per_group]
                if self.on_batch is not None:
                    self.on_batch(b, local, spread)
                yield local

    def __len__(self) -> int:
        return len(self.global_sampler)

    def __getattr__(self, name: str) -> Any:
        # consumed_samples, micro_batch_size, ... stay the upstream sampler's (global) values
        return getattr(self.__dict__["global_sampler"], name)


class TaggingCollate:
    """Collate the local samples, then tag the batch as already sharded for this replica."""

    def __init__(self, collate_fn, ctx: ShardContext):
        self.collate_fn = collate_fn
        self.ctx = ctx

    def __call__(self, samples):
        batch = self.collate_fn(samples) if self.collate_fn is not None else samples
        if not isinstance(batch, dict):
            raise TypeError("mimo_accel sharded reads need the collate function to return a dict "
                            f"(MegatronMIMO batches are dicts), got {type(batch).__name__}")
        batch[SHARD_TAG_KEY] = ShardTag(self.ctx.module, self.ctx.dp_rank, self.ctx.dp_size,
                                        self.ctx.grid, len(samples), self.ctx.sliced_in_step)
        return batch


def shard_loader(loader, ctx: ShardContext, micro_batch_size: int, planner: Optional[Planner] = None,
                 on_batch=None, window: int = 1, step_micro_batches: Optional[int] = None,
                 global_sampler=None, start: Optional[tuple[int, int]] = None):
    """A DataLoader over the same dataset/collate/workers that reads only this replica's share of
    ``global_sampler``'s micro-batches (default: the upstream loader's own, global, batch sampler)."""
    check_micro_batch(micro_batch_size, ctx.grid)
    if global_sampler is None and getattr(loader, "batch_sampler", None) is None:
        raise TypeError("mimo_accel sharded reads: the upstream loader has no batch sampler to shard "
                        "(dataloader_type 'external' passes the dataset through). Use 'single' or "
                        "'cyclic', or turn sharded_reads off.")
    sampler = ShardedBatchSampler(global_sampler or loader.batch_sampler, ctx, planner, on_batch, window,
                                  step_micro_batches, start)
    return tagged_loader(loader, ctx, sampler)


def tagged_loader(loader, ctx: ShardContext, batch_sampler):
    """The upstream loader's dataset, collate and workers over ``batch_sampler``, batches tagged."""
    from torch.utils.data import DataLoader

    return DataLoader(loader.dataset, batch_sampler=batch_sampler, num_workers=loader.num_workers,
                      collate_fn=TaggingCollate(loader.collate_fn, ctx),
                      pin_memory=loader.pin_memory, worker_init_fn=loader.worker_init_fn,
                      persistent_workers=loader.persistent_workers if loader.num_workers > 0 else False)
