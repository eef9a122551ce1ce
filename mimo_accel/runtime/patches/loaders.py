"""This rank's loader for one split: its share of every global micro-batch, planned or not.

Upstream's loader builders run as they are (``build_pretraining_data_loader`` with the sampler's
dp_size=1, or #5525's ``build_canonical_mimo_data_loader``); inside a loader scope
(:mod:`mimo_accel.runtime.reading.scope`) their loader is replaced by one that reads only this replica's
share, on the canonical grid: in upstream's global order (sharded reads), in the planned order
(reorder, plan mode), or exchanged after decoding (reorder, exchange mode). Before the first
batch every data-loading rank checks that it plans from the same inputs
(:mod:`mimo_accel.runtime.reading.plan_inputs`).
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Callable

from mimo_accel.runtime.reading import scope
from mimo_accel.runtime.reading.loader_order import loader_order_for, plan_check_for
from mimo_accel.runtime.resume import check_order
from mimo_accel.runtime.state import Runtime
from mimo_accel.runtime.patches.upstream_call import UpstreamCall, replacing


# the sampler settings the data ranks compare (each a declared parameter of the target: targets.py)
_SETTINGS = ("consumed_samples", "dataloader_type", "micro_batch_size", "drop_last", "seed", "data_sharding")
_SOME_UPSTREAMS_LACK = ("seed",)  # declared optional in targets.py


def _settings(a: UpstreamCall, names=_SETTINGS) -> list:
    return [a.get(k) if k in _SOME_UPSTREAMS_LACK else a[k] for k in names]


def _resumes_in_order(runtime: Runtime, a: UpstreamCall, split: str, window: int, canonical: bool) -> None:
    """A resumed run's train loader reads on from the next sample of the checkpoint's global order,
    or the run stops here, before its first step (:mod:`mimo_accel.runtime.resume`)."""
    if split == "train" and runtime.resumed is not None:
        check_order(runtime.resumed, samples=len(a["dataset"]), consumed=int(a["consumed_samples"] or 0),
                    window=window, canonical=canonical)


def wrap_pretraining_loader(original: Callable, runtime: Runtime) -> Callable:
    """``build_pretraining_data_loader``: upstream's loader; inside a loader scope with a MIMO layout
    (the sampler's dp_size=1 after the scope's sampling-info lookup), this rank's share of it."""

    @replacing(original)
    def build_pretraining_data_loader(a: UpstreamCall):
        loader = a.to(original)
        open_scope = scope.current()
        ctx = open_scope.shard_context() if open_scope is not None else None
        if ctx is None or a["data_parallel_size"] != 1:
            return loader
        split = open_scope.split_of(a["dataset"])
        if loader is None or a["dataloader_type"] == "external":
            return loader
        return _share(loader, a, ctx, split, open_scope.dp_group, runtime)

    return build_pretraining_data_loader


def _share(loader, a: UpstreamCall, ctx, split: str, dp_group, runtime: Runtime):
    """This rank's sharded (and, with reorder, planned) loader for one split."""
    from mimo_accel.runtime.reading import sampler

    cfg = runtime.config
    order = loader_order_for(a["dataset"], _settings(a), ctx, split, runtime, a["micro_batch_size"], loader)
    _resumes_in_order(runtime, a, split, order.window, canonical=False)
    if runtime.reorders and cfg.reorder_mode == "exchange":
        from mimo_accel.runtime.reading.exchange import exchange_shard_loader
        from mimo_accel.runtime.reading.plan_check import FirstPlanCheck

        return exchange_shard_loader(loader, ctx, a["micro_batch_size"], dp_group, cost_model=order.cost_model,
                                     notify=runtime.say_once,
                                     check=plan_check_for(ctx, f"{split} loader", FirstPlanCheck))
    return sampler.shard_loader(loader, ctx, a["micro_batch_size"], planner=order.planner, window=order.window,
                                check=order.check, models=order.models)


def wrap_canonical_loader(original: Callable, runtime: Runtime) -> Callable:
    """Upstream's scalable reads (#5525 ``build_canonical_mimo_data_loader``): upstream already
    reads this replica's share on the same canonical grid, so sharded reads step aside. What
    mimo_accel adds on top: the batch tag (so the step can check the replica and the profiler can
    count), and with reorder the planned order, taken from upstream's own canonical-group
    samplers over *all* groups — the global micro-batch upstream reads, under ``single`` and
    ``cyclic`` alike — so every module plans the same micro-batch and keeps its own share."""
    canonical = sys.modules[original.__module__]

    @replacing(original)
    def build_canonical_mimo_data_loader(a: UpstreamCall):
        loader = a.to(original)
        open_scope = scope.current()
        ctx = open_scope.shard_context() if open_scope is not None else None
        if ctx is None:
            return loader
        split = open_scope.split_of(a["dataset"])
        if loader is None:
            return loader
        grid = canonical.canonical_grid_size(list(a["module_dp_sizes"]))
        if (a["dp_rank"], a["dp_size"], grid) != (ctx.dp_rank, ctx.dp_size, ctx.grid):
            raise RuntimeError(
                f"mimo_accel: upstream's scalable reads build this loader for replica {a['dp_rank']}/"
                f"{a['dp_size']} on a grid of {grid}, but the MIMO layout puts this rank at {ctx.module} "
                f"replica {ctx.dp_rank}/{ctx.dp_size} on a grid of {ctx.grid}; refusing to mis-pair samples")
        ctx = dataclasses.replace(ctx, sliced_in_step=False)
        return _canonical_share(loader, a, ctx, split, open_scope.dp_group, runtime, canonical)

    return build_canonical_mimo_data_loader


def _canonical_share(loader, a: UpstreamCall, ctx, split: str, dp_group, runtime: Runtime, canonical):
    """On top of upstream's canonical loader (scalable reads): tagged, and with reorder planned."""
    from mimo_accel.runtime.reading import sampler

    cfg = runtime.config
    if runtime.upstream_moves_samples is not None or not runtime.reorders:
        _resumes_in_order(runtime, a, split, 1, canonical=True)
    if runtime.upstream_moves_samples is not None and split == "train":
        # upstream's buffer exchanges this loader's samples after reading: no tag could follow them
        return loader
    if not runtime.reorders:
        return sampler.tagged_loader(loader, ctx, loader.batch_sampler)  # upstream's own shard
    order = loader_order_for(a["dataset"], _settings(a, [k for k in _SETTINGS if k != "seed"]), ctx, split,
                             runtime, a["micro_batch_size"], loader)
    _resumes_in_order(runtime, a, split, order.window, canonical=True)
    if cfg.reorder_mode == "exchange":
        from mimo_accel.runtime.reading.exchange import exchange_shard_loader
        from mimo_accel.runtime.reading.plan_check import FirstPlanCheck

        return exchange_shard_loader(loader, ctx, a["micro_batch_size"], dp_group, cost_model=order.cost_model,
                                     local_batch_sampler=loader.batch_sampler, notify=runtime.say_once,
                                     check=plan_check_for(ctx, f"{split} loader", FirstPlanCheck))
    # upstream's own per-group samplers for every group: the global micro-batch, in canonical order
    everything = canonical.build_canonical_group_batch_sampler(
        dataloader_type=a["dataloader_type"], dataset=a["dataset"], consumed_samples=a["consumed_samples"],
        micro_batch_size=a["micro_batch_size"], grid_size=ctx.grid, groups=list(range(ctx.grid)),
        data_sharding=a["data_sharding"], drop_last=a["drop_last"])
    return sampler.shard_loader(loader, ctx, a["micro_batch_size"], planner=order.planner, window=order.window,
                                global_sampler=everything,
                                start=(a["consumed_samples"], a["micro_batch_size"]), check=order.check,
                                models=order.models)
