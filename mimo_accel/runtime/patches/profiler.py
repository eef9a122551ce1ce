"""The measuring hooks at upstream's sites: the encoders' ``encode`` (timed per module, paused under
evaluation; installed only when ``profile`` or online calibration is on), the optimizer step (a
step ends) and ``train_megatron_mimo`` (the run starts and finishes; with every feature: rank 0's
step line). The timing itself is :class:`mimo_accel.runtime.measuring.profiling.Profiling`, the
line :class:`mimo_accel.runtime.measuring.activity.Activity`."""

from __future__ import annotations

from typing import Callable, Optional

from mimo_accel.runtime.measuring.profiling import Profiling, evaluating
from mimo_accel.runtime.patches.upstream_call import UpstreamCall, replacing
from mimo_accel.runtime.state import Runtime


def wrap_encode(original: Callable, runtime: Runtime) -> Callable:
    @replacing(original)
    def encode(call: UpstreamCall):
        profiling = runtime.profiling
        if profiling is not None and evaluating():
            with profiling.paused_timers():  # an evaluation pass is not part of a training step
                return call.to(original)
        encoders_data_batch = call["encoders_data_batch"]
        if profiling is not None and encoders_data_batch:
            profiling.time_encoders(call["self"], encoders_data_batch)
        return call.to(original)

    return encode


def wrap_optimizer_step(original: Callable, runtime: Runtime) -> Callable:
    @replacing(original)
    def step(call: UpstreamCall):
        result = call.to(original)
        if runtime.profiling is not None:
            runtime.profiling.end_step()
        if runtime.activity is not None:
            runtime.activity.end_step()
        return result

    return step


def wrap_train_entry(original: Callable, runtime: Runtime) -> Callable:
    @replacing(original)
    def train_megatron_mimo(call: UpstreamCall):
        profiling: Optional[Profiling] = runtime.profiling
        if profiling is not None:
            profiling.start_run(call["global_state"], call["model"])
        if runtime.activity is not None:
            runtime.activity.start_run(call["global_state"])
        failed = True
        try:
            out = call.to(original)
            failed = False
            return out
        finally:
            profiling: Optional[Profiling] = runtime.profiling
            if profiling is not None:
                profiling.finish(failed=failed)
            if runtime.activity is not None:
                runtime.activity.finish(failed=failed)

    return train_megatron_mimo
