"""What each patched upstream name becomes, for a given AccelConfig.

One factory per upstream function (keyed by its name); each returns the replacement for the
original object. The engine calls a factory once per original object and installs that same
replacement at every site the original is bound, so the sites stay identical to each other.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import sys
from typing import Callable, Optional

from mimo_accel.config import AccelConfig


def _sampling_info(original: Callable, cfg: AccelConfig) -> Callable:
    from mimo_accel import sampler

    @functools.wraps(original)
    def get_megatron_mimo_sampling_info(megatron_mimo_cfg, grids, *args, **kwargs):
        result = original(megatron_mimo_cfg, grids, *args, **kwargs)
        sampler.arm(megatron_mimo_cfg, grids, sys._getframe(1))
        return result

    return get_megatron_mimo_sampling_info


def _arguments(signature: inspect.Signature, args, kwargs) -> dict:
    """Every argument of an upstream call by name, defaults included."""
    call = signature.bind(*args, **kwargs)
    call.apply_defaults()
    return call.arguments


def _pretraining_loader(original: Callable, cfg: AccelConfig) -> Callable:
    from mimo_accel import sampler

    signature = inspect.signature(original)

    @functools.wraps(original)
    def build_pretraining_data_loader(*args, **kwargs):
        loader = original(*args, **kwargs)
        a = _arguments(signature, args, kwargs)
        ctx = sampler.context_for_loader()
        # Only MIMO's global loaders (sampler dp_size=1 after a MIMO sampling-info lookup) are sharded.
        if ctx is None or a["data_parallel_size"] != 1:
            return loader
        split = sampler.take_split(a["dataset"])
        if loader is None or a["dataloader_type"] == "external":
            return loader
        return _shard(loader, a, ctx, split, cfg)

    return build_pretraining_data_loader


def _canonical_loader(original: Callable, cfg: AccelConfig) -> Callable:
    """Upstream's scalable reads (#5525 ``build_canonical_mimo_data_loader``): upstream already
    reads this replica's share on the same canonical grid, so sharded reads step aside. What
    mimo_accel adds on top: the batch tag (so the step can check the replica and the profiler can
    count), and with reorder the planned order, taken from upstream's own canonical-group
    samplers over *all* groups — the global micro-batch upstream reads, under ``single`` and
    ``cyclic`` alike — so every module plans the same micro-batch and keeps its own share."""
    from mimo_accel import sampler

    signature = inspect.signature(original)
    canonical = sys.modules[original.__module__]

    @functools.wraps(original)
    def build_canonical_mimo_data_loader(*args, **kwargs):
        loader = original(*args, **kwargs)
        a = _arguments(signature, args, kwargs)
        ctx = sampler.context_for_loader()
        if ctx is None:
            return loader
        split = sampler.take_split(a["dataset"])
        if loader is None:
            return loader
        grid = canonical.canonical_grid_size(list(a["module_dp_sizes"]))
        if (a["dp_rank"], a["dp_size"], grid) != (ctx.dp_rank, ctx.dp_size, ctx.grid):
            raise RuntimeError(
                f"mimo_accel: upstream's scalable reads build this loader for replica {a['dp_rank']}/"
                f"{a['dp_size']} on a grid of {grid}, but the MIMO layout puts this rank at {ctx.module} "
                f"replica {ctx.dp_rank}/{ctx.dp_size} on a grid of {ctx.grid}; refusing to mis-pair samples")
        ctx = dataclasses.replace(ctx, sliced_in_step=False)
        return _shard_canonical(loader, a, ctx, split, cfg, canonical)

    return build_canonical_mimo_data_loader


def _micro_batches_per_step() -> Optional[int]:
    """megatron-core's micro-batches per training step (None before its calculator is set up)."""
    from megatron.core import num_microbatches_calculator as nmc

    if getattr(nmc, "_GLOBAL_NUM_MICROBATCHES_CALCULATOR", None) is None:
        return None
    return int(nmc.get_num_microbatches())


def _data_ranks(ctx):
    """The data-loading ranks as a gather group (None in a single process)."""
    import torch.distributed as dist

    from mimo_accel.agree import RankSet

    return RankSet(ctx.data_ranks) if dist.is_initialized() and len(ctx.data_ranks) > 1 else None


def _plan(dataset, sampler_settings: list, ctx, split: str, cfg: AccelConfig):
    """(planner, cost model, window, micro-batches per step) for one split's loader; first checks
    that every data-loading rank plans from the same inputs (collective over those ranks)."""
    from mimo_accel import agree, sampler

    plan_inputs = {
        "layout": agree.digest([sorted(ctx.dp_sizes.items()), ctx.grid]),
        "options": agree.digest({k: v for k, v in dataclasses.asdict(cfg).items() if k != "profile"}),
        "dataset": agree.digest([type(dataset).__name__, len(dataset)]),
        "sampler": agree.digest(sampler_settings),
    }
    planner, model, window, step_mbs = None, None, 1, None
    if cfg.reorder:
        from mimo_accel.datasets.split_index import cost_index_for, index_digest
        from mimo_accel.planner import CostIndexPlanner, cost_model_for

        model = cost_model_for(cfg.cost_model)
        plan_inputs["cost model"] = agree.digest(dataclasses.asdict(model))
        if cfg.reorder_mode == "plan":
            index = cost_index_for(dataset, cfg.cost_index, split, group=_data_ranks(ctx))
            plan_inputs["cost index"] = index_digest(index)
            modality_dps = [d for name, d in ctx.dp_sizes.items() if name != "language"]
            planner = CostIndexPlanner(index, model, ctx.grid,
                                       vision_groups=max(modality_dps) if modality_dps else None)
            # Windows span the micro-batches of one training step; evaluation plans each
            # micro-batch on its own (its micro-batches per pass follow other settings).
            if split == "train" and cfg.reorder_window > 1:
                window, step_mbs = cfg.reorder_window, _micro_batches_per_step()
                sampler.check_window(window, step_mbs)
    agree.check_same_everywhere(plan_inputs, ctx.data_ranks, f"{split} loader")
    return planner, model, window, step_mbs


def _shard(loader, a: dict, ctx, split: str, cfg: AccelConfig):
    """This rank's sharded (and, with reorder, planned) loader for one split."""
    from mimo_accel import instrument, sampler

    planner, model, window, step_mbs = _plan(
        a["dataset"], [a[k] for k in ("consumed_samples", "dataloader_type", "micro_batch_size", "drop_last",
                                      "seed", "data_sharding")], ctx, split, cfg)
    if cfg.reorder and cfg.reorder_mode == "exchange":
        from mimo_accel.exchange import exchange_shard_loader

        return exchange_shard_loader(loader, ctx, a["micro_batch_size"], sampler.current_dp_group(),
                                     cost_model=model, on_exchange=instrument.record_exchange)
    return sampler.shard_loader(loader, ctx, a["micro_batch_size"], planner=planner,
                                on_batch=instrument.record_plan, window=window, step_micro_batches=step_mbs)


def _shard_canonical(loader, a: dict, ctx, split: str, cfg: AccelConfig, canonical):
    """On top of upstream's canonical loader (scalable reads): tagged, and with reorder planned."""
    from mimo_accel import instrument, sampler

    if not cfg.reorder:
        return sampler.tagged_loader(loader, ctx, loader.batch_sampler)  # upstream's own shard
    planner, model, window, step_mbs = _plan(
        a["dataset"], [a[k] for k in ("consumed_samples", "dataloader_type", "micro_batch_size", "drop_last",
                                      "data_sharding")], ctx, split, cfg)
    if cfg.reorder_mode == "exchange":
        from mimo_accel.exchange import exchange_shard_loader

        return exchange_shard_loader(loader, ctx, a["micro_batch_size"], sampler.current_dp_group(),
                                     cost_model=model, on_exchange=instrument.record_exchange,
                                     local_batch_sampler=loader.batch_sampler)
    # upstream's own per-group samplers for every group: the global micro-batch, in canonical order
    everything = canonical.build_canonical_group_batch_sampler(
        dataloader_type=a["dataloader_type"], dataset=a["dataset"], consumed_samples=a["consumed_samples"],
        micro_batch_size=a["micro_batch_size"], grid_size=ctx.grid, groups=list(range(ctx.grid)),
        data_sharding=a["data_sharding"], drop_last=a["drop_last"])
    return sampler.shard_loader(loader, ctx, a["micro_batch_size"], planner=planner,
                                on_batch=instrument.record_plan, window=window, step_micro_batches=step_mbs,
                                global_sampler=everything, start=(a["consumed_samples"], a["micro_batch_size"]))


def _slice(original: Callable, cfg: AccelConfig, native_packing: bool) -> Callable:
    from mimo_accel.step import make_local_batch_fn

    return make_local_batch_fn(original, sharded_reads=cfg.sharded_reads,
                               packing=cfg.packing and not native_packing, pad_multiple=cfg.pad_multiple,
                               profile=cfg.profile is not None)


def _module_dp_info(original: Callable, cfg: AccelConfig) -> Callable:
    from mimo_accel.step import capture_role

    return capture_role(original, profile=cfg.profile is not None)


def _get_batch(original: Callable, cfg: AccelConfig) -> Callable:
    from mimo_accel.step import make_get_batch_fn

    return make_get_batch_fn(original)


def _train_entry(original: Callable, cfg: AccelConfig) -> Callable:
    from mimo_accel import instrument

    return instrument.wrap_train_entry(original, cfg)


def _encode(original: Callable, cfg: AccelConfig) -> Callable:
    from mimo_accel import instrument

    return instrument.wrap_encode(original)


def _optimizer_step(original: Callable, cfg: AccelConfig) -> Callable:
    from mimo_accel import instrument

    return instrument.wrap_optimizer_step(original, cfg)


def _fan_in(name: str) -> Callable[[Callable], Callable]:
    from mimo_accel import fanin

    wrappers = {"_attach_modality_split_sizes": fanin.wrap_attach_split_sizes,
                "_communicate_shapes": fanin.wrap_communicate_shapes,
                "_split_tensor_at_batch_dim": fanin.wrap_split_at_batch_dim}
    return wrappers[name.rsplit(".", 1)[-1]]


def _native_pack(name: str, cfg: AccelConfig) -> Callable[[Callable], Callable]:
    """Upstream main's step-time packing (sequence_pack.py): mimo_accel's packer instead."""
    from mimo_accel import native_pack

    if name == "resolve_step_packing":
        return native_pack.wrap_resolve_step_packing
    return lambda o: native_pack.make_pack_language_shard(o, cfg.pad_multiple)


def replacement_factory(name: str, cfg: AccelConfig, native_packing: bool) -> Callable[[Callable], Callable]:
    factories = {
        "get_megatron_mimo_sampling_info": lambda o: _sampling_info(o, cfg),
        "build_pretraining_data_loader": lambda o: _pretraining_loader(o, cfg),
        "slice_batch_for_megatron_mimo": lambda o: _slice(o, cfg, native_packing),
        "_get_module_dp_info": lambda o: _module_dp_info(o, cfg),
        "build_canonical_mimo_data_loader": lambda o: _canonical_loader(o, cfg),
        "get_batch": lambda o: _get_batch(o, cfg),
        "train_megatron_mimo": lambda o: _train_entry(o, cfg),
        "ModalitySubmodules.encode": lambda o: _encode(o, cfg),
        "MimoOptimizer.step": lambda o: _optimizer_step(o, cfg),
        "MimoModel._attach_modality_split_sizes": _fan_in("_attach_modality_split_sizes"),
        "BridgeCommunicator._communicate_shapes": _fan_in("_communicate_shapes"),
        "BridgeCommunicator._split_tensor_at_batch_dim": _fan_in("_split_tensor_at_batch_dim"),
        "pack_language_shard": _native_pack("pack_language_shard", cfg),
        "resolve_step_packing": _native_pack("resolve_step_packing", cfg),
    }
    return factories[name]
