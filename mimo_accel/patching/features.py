"""What each patched upstream name becomes, for a given AccelConfig.

One factory per upstream function (keyed by its name); each returns the replacement for the
original object. The engine calls a factory once per original object and installs that same
replacement at every site the original is bound, so the sites stay identical to each other.
"""

from __future__ import annotations

import functools
import inspect
from typing import Callable

from mimo_accel.config import AccelConfig


def _sampling_info(original: Callable, cfg: AccelConfig) -> Callable:
    from mimo_accel import sampler

    @functools.wraps(original)
    def get_megatron_mimo_sampling_info(megatron_mimo_cfg, grids, *args, **kwargs):
        result = original(megatron_mimo_cfg, grids, *args, **kwargs)
        sampler.set_context(*sampler.context_from_grids(megatron_mimo_cfg, grids))
        return result

    return get_megatron_mimo_sampling_info


def _pretraining_loader(original: Callable, cfg: AccelConfig) -> Callable:
    from mimo_accel import sampler

    signature = inspect.signature(original)

    @functools.wraps(original)
    def build_pretraining_data_loader(*args, **kwargs):
        loader = original(*args, **kwargs)
        call = signature.bind(*args, **kwargs)
        call.apply_defaults()
        a = call.arguments
        ctx = sampler.current_context()
        # Only MIMO's global loaders (sampler dp_size=1 after a MIMO sampling-info lookup) are sharded.
        if loader is None or ctx is None or a["data_parallel_size"] != 1 or a["dataloader_type"] == "external":
            return loader
        from mimo_accel import instrument

        if cfg.reorder and cfg.reorder_mode == "exchange":
            from mimo_accel.exchange import exchange_shard_loader
            from mimo_accel.planner import cost_model_for

            return exchange_shard_loader(loader, ctx, a["micro_batch_size"], sampler.current_dp_group(),
                                         cost_model=cost_model_for(cfg.cost_model),
                                         on_exchange=instrument.record_exchange)
        planner = None
        if cfg.reorder:
            from mimo_accel.planner import CostIndexPlanner, cost_index_for, cost_model_for

            modality_dps = [d for name, d in ctx.dp_sizes.items() if name != "language"]
            planner = CostIndexPlanner(cost_index_for(a["dataset"], cfg.cost_index),
                                       cost_model_for(cfg.cost_model), ctx.grid,
                                       vision_groups=max(modality_dps) if modality_dps else None)
        return sampler.shard_loader(loader, ctx, a["micro_batch_size"], planner=planner,
                                    on_batch=instrument.record_plan, window=cfg.reorder_window)

    return build_pretraining_data_loader


def _slice(original: Callable, cfg: AccelConfig, native_packing: bool) -> Callable:
    from mimo_accel.step import make_local_batch_fn

    return make_local_batch_fn(original, sharded_reads=cfg.sharded_reads,
                               packing=cfg.packing and not native_packing, pad_multiple=cfg.pad_multiple,
                               profile=cfg.profile is not None, fan_in_rows=_fan_in_enabled(cfg))


def _fan_in_enabled(cfg: AccelConfig) -> bool:
    """Uneven-row fan-in support comes with the data features; the profiler alone changes nothing."""
    return cfg.sharded_reads or cfg.packing


def _module_dp_info(original: Callable, cfg: AccelConfig) -> Callable:
    from mimo_accel.step import capture_role

    return capture_role(original)


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

    return fanin.wrap_attach_split_sizes if name.endswith("_attach_modality_split_sizes") \
        else fanin.wrap_split_at_batch_dim


def replacement_factory(name: str, cfg: AccelConfig, native_packing: bool) -> Callable[[Callable], Callable]:
    factories = {
        "get_megatron_mimo_sampling_info": lambda o: _sampling_info(o, cfg),
        "build_pretraining_data_loader": lambda o: _pretraining_loader(o, cfg),
        "slice_batch_for_megatron_mimo": lambda o: _slice(o, cfg, native_packing),
        "_get_module_dp_info": lambda o: _module_dp_info(o, cfg),
        "train_megatron_mimo": lambda o: _train_entry(o, cfg),
        "ModalitySubmodules.encode": lambda o: _encode(o, cfg),
        "MimoOptimizer.step": lambda o: _optimizer_step(o, cfg),
        "MimoModel._attach_modality_split_sizes": _fan_in("_attach_modality_split_sizes"),
        "BridgeCommunicator._split_tensor_at_batch_dim": _fan_in("_split_tensor_at_batch_dim"),
    }
    return factories[name]
