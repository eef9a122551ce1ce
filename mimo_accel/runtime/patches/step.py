"""The forward-step pieces that replace upstream's per-step batch handling.

Bridge's MIMO ``forward_step`` (megatron/bridge/training/megatron_mimo_step.py) calls, in order:
``get_batch(data_iterator)``, ``_get_module_dp_info(model)`` and then
``slice_batch_for_megatron_mimo(batch, dp_rank, dp_size)``, all looked up in its module globals
at call time. mimo_accel wraps the second to learn the role of the model whose step runs
(``Runtime.step_role``, read by the slice and the packer that follow in the same step), and
replaces the third with :func:`wrap_slice`'s function, which

- passes a batch that sharded reads already made local straight through (checking that it was
  read for this very replica — never a silent mis-pairing), or slices a global batch as upstream;
- THD-packs the language shard when packing is on (on upstream main the step packs itself, in
  mimo_accel's packer: :mod:`mimo_accel.runtime.patches.native_packing`).

Under upstream's scalable reads (Megatron-Bridge #5525, ``dataset.megatron_mimo_scalable_dp``) the
step skips the slice: the loader already delivered the shard. There :func:`wrap_get_batch` takes
the batch's tag off as ``get_batch`` returns it, checks it against this rank's replica and
records the batch, and where main's step packs, :func:`wrap_module_dp_info` works out the shard's
lengths as the slice would.
"""

from __future__ import annotations

import contextvars
import warnings
from typing import Callable, Optional

from mimo_accel.modules import LANGUAGE
from mimo_accel.runtime.local_batch import (batch_size, check_replica, pack_for_language_model, role_of_rank,
                                            shard_lengths, tensor_bytes)
from mimo_accel.runtime.reading.shard import SHARD_TAG_KEY, ShardTag
from mimo_accel.runtime.state import Runtime
from mimo_accel.runtime.patches.upstream_call import UpstreamCall, replacing


def wrap_module_dp_info(original: Callable, runtime: Runtime) -> Callable:
    """``_get_module_dp_info(model)``: upstream's (dp_rank, dp_size); the model's role becomes the
    step's (``runtime.step_role``) for the slice and the packer that follow. Where no slice follows
    (scalable reads) and main's step packs, the shard's lengths are worked out here, the last call
    before the step drops the fields they come from."""

    @replacing(original)
    def _get_module_dp_info(call: UpstreamCall):
        role = runtime.step_role = role_of_rank(runtime, call["megatron_mimo_model"])
        unsliced, runtime.step_batch = runtime.step_batch, None
        if unsliced is not None and role is not None and role.is_language:
            runtime.step_lengths = shard_lengths(unsliced, role, runtime.say_once)
        return call.to(original)

    return _get_module_dp_info


def wrap_get_batch(original: Callable, runtime: Runtime) -> Callable:
    """The step's ``get_batch(data_iterator)`` (#5525's shape): a batch read under upstream's
    scalable reads never reaches the slice, so its tag is taken off here (the model must not see
    it), checked against this rank's replica and recorded. Other batches pass untouched: the
    slice takes their tag."""

    @replacing(original)
    def get_batch(call: UpstreamCall):
        batch = call.to(original)
        tag = batch.get(SHARD_TAG_KEY) if isinstance(batch, dict) else None
        ctx = runtime.shard_context()
        # no slice follows under upstream's scalable reads (a batch of upstream's own reorder is
        # untagged): the shard's lengths are worked out once the step's role is known (_get_module_dp_info)
        sliced = tag.sliced_in_step if isinstance(tag, ShardTag) else ctx is None or ctx.sliced_in_step
        if runtime.config.packing and runtime.native_packing and not sliced:
            runtime.step_batch = batch
        if isinstance(tag, ShardTag) and not tag.sliced_in_step:
            del batch[SHARD_TAG_KEY]
            if ctx is not None:
                check_replica(tag, ctx.dp_rank, ctx.dp_size)
            if runtime.activity is not None:
                runtime.activity.saw_batch(tag.samples, tag.samples * tag.dp_size, tag.share)
            if runtime.profiling is not None:
                # the dict the step goes on with: language ranks drop the raw encoder inputs
                seen = {k: v for k, v in batch.items() if not (tag.module == LANGUAGE and k == "modality_inputs")}
                runtime.profiling.record_batch(batch, read_samples=tag.samples, read_bytes=tensor_bytes(seen),
                                               tag=tag, count_tokens=not (runtime.config.packing and
                                                                          tag.module == LANGUAGE))
        return batch

    return get_batch


def wrap_slice(original: Callable, runtime: Runtime) -> Callable:
    """The replacement for ``slice_batch_for_megatron_mimo(batch, dp_rank, dp_size, ...)``.

    It is also bound in ``dp_utils``, where upstream's slice calls itself by module-global name
    for nested dicts (``modality_inputs``): those nested calls must reach upstream's slice, not
    run the step's work (tag check, profiling, packing) once more per nested dict.
    """
    cfg = runtime.config
    pack_here = cfg.packing and not runtime.native_packing  # else main's step packs what this returns
    inside: contextvars.ContextVar[bool] = contextvars.ContextVar("mimo_accel_slicing", default=False)

    @replacing(original)
    def local_batch_for_megatron_mimo(call: UpstreamCall) -> dict:
        if inside.get():
            return call.to(original)
        token = inside.set(True)
        try:
            return _local_batch(call)
        finally:
            inside.reset(token)

    def _local_batch(call: UpstreamCall) -> dict:
        batch, dp_rank, dp_size = call["batch"], call["dp_rank"], call["dp_size"]
        tag: Optional[ShardTag] = batch.pop(SHARD_TAG_KEY, None) if isinstance(batch, dict) else None
        profiling = runtime.profiling
        loaded_bytes = tensor_bytes(batch) if profiling is not None else 0
        if tag is not None:
            check_replica(tag, dp_rank, dp_size)
            # the share was collated alone: upstream's slice takes it whole, as one replica's batch
            # (Bridge #4986's slice then takes its sparse modality indices off; elsewhere a no-op)
            local, read, whole = call.but(dp_rank=0, dp_size=1).to(original), tag.samples, tag.samples * tag.dp_size
        else:
            if cfg.sharded_reads and dp_size > 1:
                _warn_whole_batch_once(runtime)
            local, read = call.to(original), batch_size(batch)
            whole = read
        if runtime.activity is not None:
            runtime.activity.saw_batch(read, whole, tag.share if tag is not None else None)
        # dp_rank stays upstream's plain int (its slice computes offsets from it): the role comes by the runtime
        role = runtime.step_role
        packs = cfg.packing and role is not None and role.is_language  # here, or in main's step next
        if profiling is not None:
            profiling.record_batch(local, read_samples=read, read_bytes=loaded_bytes, tag=tag, count_tokens=not packs)
        if pack_here and packs:
            padded, local = local, pack_for_language_model(local, role, cfg.pad_multiple, runtime.say_once)
            if runtime.activity is not None:
                runtime.activity.saw_pack(padded, local)
            if profiling is not None:
                profiling.record_packed(local["packing_kwargs"])
        elif packs:  # main's step packs next, after it drops the fields these lengths come from
            runtime.step_lengths = shard_lengths(local, role, runtime.say_once)
        return local

    return local_batch_for_megatron_mimo


def _warn_whole_batch_once(runtime: Runtime) -> None:
    message = ("mimo_accel sharded_reads is on, but this rank loaded a whole global micro-batch "
               "(the loader was built without mimo_accel: enable() ran after the script imported "
               "Bridge's loader builders, the loaders were built outside pretrain_megatron_mimo and "
               "build_megatron_mimo_data_loaders, or dataloader_type='external'). Slicing it as "
               "upstream does; call mimo_accel.enable() before importing megatron.bridge, or use "
               "`mimo-accel run`.")
    if runtime.say_once("sharded_reads:whole-batch", message):
        warnings.warn(message, RuntimeWarning, stacklevel=4)


