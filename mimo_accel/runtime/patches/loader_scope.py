"""The MIMO loader builders open a loader scope (:mod:`mimo_accel.runtime.reading.scope`), and Bridge's
sampling-info lookup records the layout in it."""

from __future__ import annotations

from typing import Callable

from mimo_accel.runtime.patches.upstream_call import UpstreamCall, replacing
from mimo_accel.runtime import preflight
from mimo_accel.runtime.provider import start_model
from mimo_accel.runtime.reading.scope import current, datasets_seen_by, loader_scope
from mimo_accel.runtime.state import Runtime
from mimo_accel.runtime.upstream_reorder import settle_upstream_reorder


def wrap_loader_builder(original: Callable, runtime: Runtime) -> Callable:
    """Bridge's ``build_megatron_mimo_data_loaders``: upstream's own reorder asked for
    (:mod:`mimo_accel.runtime.upstream_reorder`), the provider's configs checked
    (:mod:`mimo_accel.runtime.preflight`), the start cost model read
    (:mod:`mimo_accel.runtime.provider`), then a loader scope that knows each dataset's split."""
    @replacing(original)
    def build_megatron_mimo_data_loaders(call: UpstreamCall):
        settle_upstream_reorder(call["cfg"], runtime)
        preflight.check_provider(getattr(call["cfg"], "model", None), runtime)
        provider = call["megatron_mimo_provider"]
        start_model(provider, runtime)
        with loader_scope(runtime) as scope, datasets_seen_by(scope, provider):
            return call.to(original)

    return build_megatron_mimo_data_loaders


OUTSIDE_A_SCOPE = (
    "mimo_accel: Bridge's MIMO sampling info was looked up outside the loader builders mimo_accel "
    "patches (build_megatron_mimo_data_loaders, or build_data_iterators under pretrain_megatron_mimo), "
    "so the loaders built next are upstream's: every rank reads the whole global micro-batch. If this "
    "script imported build_megatron_mimo_data_loaders before mimo_accel.enable(), call enable() first "
    "(or launch with `mimo-accel run`).")


def wrap_sampling_info(original: Callable, runtime: Runtime) -> Callable:
    """``get_megatron_mimo_sampling_info(megatron_mimo_cfg, grids)``: upstream's answer; inside a
    loader scope, the layout is recorded for the loaders built next in that scope."""

    @replacing(original)
    def get_megatron_mimo_sampling_info(call: UpstreamCall):
        result = call.to(original)
        megatron_mimo_cfg, grids = call["megatron_mimo_cfg"], call["grids"]
        scope = current()
        if scope is not None:
            scope.layout, scope.context, scope.dp_group, scope._resolved = (megatron_mimo_cfg, grids), None, None, False
            runtime.layout, runtime.context = (megatron_mimo_cfg, grids), None
        elif runtime.config.sharded_reads:
            runtime.say_once("scope:outside", OUTSIDE_A_SCOPE)
        return result

    return get_megatron_mimo_sampling_info
