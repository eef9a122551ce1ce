"""The forward-step pieces that replace upstream's per-step batch handling.

Bridge's MIMO ``forward_step`` (megatron/bridge/training/megatron_mimo_step.py) calls, in order:
``_get_module_dp_info(model)`` then ``slice_batch_for_megatron_mimo(batch, dp_rank, dp_size)``,
both looked up in its module globals at call time. mimo_accel wraps the first to learn the rank's
role for this step, and replaces the second with :func:`make_local_batch_fn`'s function, which

- passes a batch that sharded reads already made local straight through (checking that it was
  read for this very replica — never a silent mis-pairing), or slices a global batch as upstream;
- THD-packs the language shard when packing is on.

Under upstream's scalable reads (Megatron-Bridge #5525, ``dataset.megatron_mimo_scalable_dp``) the
step skips the slice: the loader already delivered the shard. There :func:`make_get_batch_fn`
takes the batch's tag off as ``get_batch`` returns it, and the ``_get_module_dp_info`` wrapper,
which the step calls next, checks it against the replica and records the batch.
"""

from __future__ import annotations

import logging
import threading
import warnings
import weakref
from dataclasses import dataclass
from typing import Callable, Optional

from mimo_accel.sampler import SHARD_TAG_KEY, ShardTag

logger = logging.getLogger(__name__)

LANGUAGE = "language"  # megatron.core.models.mimo.config.role.MIMO_LANGUAGE_MODULE_KEY


@dataclass(frozen=True)
class StepRole:
    """What this rank does in the current forward step (from the MimoModel's role)."""

    is_language: bool
    is_first_stage: bool
    is_last_stage: bool
    sequence_parallel_size: int  # T must divide by this for sequence parallelism (tp·cp), else 1
    placeholder_ids: tuple = ()  # the modality placeholder token ids in input_ids


_step = threading.local()


def current_role() -> Optional[StepRole]:
    return getattr(_step, "role", None)


def role_of(mimo_model) -> Optional[StepRole]:
    role = getattr(mimo_model, "role", None)
    if role is None or not role.has_language_module:
        return StepRole(False, True, True, 1) if role is not None else None
    sp = 1
    grids = getattr(getattr(mimo_model, "mimo_config", None), "module_to_grid_map", None) or {}
    grid = grids.get(LANGUAGE)
    tokens = tuple((getattr(mimo_model, "special_token_ids", None) or {}).values())
    lm = getattr(mimo_model, "language_model", None)
    lm_config = getattr(lm, "config", None)
    if grid is not None and getattr(lm_config, "sequence_parallel", False):
        dims = dict(zip(grid.dim_names, grid.shape))
        sp = dims.get("tp", 1) * dims.get("cp", 1)
    return StepRole(True, role.is_first_stage(LANGUAGE), role.is_last_stage(LANGUAGE), sp, tokens)


def capture_role(get_module_dp_info: Callable, *, profile: bool = False) -> Callable:
    """Wrap ``_get_module_dp_info(model)``: record the step's role, return upstream's answer.

    A model's role never changes, so it is worked out once per model, not per micro-batch. A batch
    whose tag :func:`make_get_batch_fn` took off is checked and recorded here, where the step's
    replica is known (upstream's step calls this right after ``get_batch``).
    """
    roles: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()

    def get_module_dp_info_and_role(megatron_mimo_model, *args, **kwargs):
        role = roles.get(megatron_mimo_model)
        if role is None:
            role = roles[megatron_mimo_model] = role_of(megatron_mimo_model)
        _step.role = role
        dp_rank, dp_size = get_module_dp_info(megatron_mimo_model, *args, **kwargs)
        taken, _step.taken = getattr(_step, "taken", None), None
        if taken is not None:
            tag, batch = taken
            check_replica(tag, dp_rank, dp_size)
            if profile:
                from mimo_accel import instrument

                # the same dict the step goes on with: on language ranks without the raw images
                instrument.record_batch(batch, read_samples=tag.samples, read_bytes=_tensor_bytes(batch),
                                        tagged=True)
        return dp_rank, dp_size

    get_module_dp_info_and_role.__wrapped__ = get_module_dp_info
    return get_module_dp_info_and_role


def check_replica(tag: ShardTag, dp_rank: int, dp_size: int) -> None:
    if (tag.dp_rank, tag.dp_size) != (dp_rank, dp_size):
        raise RuntimeError(
            f"mimo_accel: this batch was read for {tag.module} replica {tag.dp_rank}/{tag.dp_size} "
            f"but the forward step runs as replica {dp_rank}/{dp_size}. The data loader and the "
            "model disagree on the layout; build the loaders after the model (with the same "
            "MegatronMIMOParallelismConfig).")


def make_get_batch_fn(upstream_get_batch: Callable) -> Callable:
    """The replacement for the step's ``get_batch(data_iterator)`` (#5525's shape): a batch read
    under upstream's scalable reads never reaches the slice, so its tag is taken off here (the
    model must not see it) and handed to the ``_get_module_dp_info`` wrapper. Other batches pass
    untouched: the slice takes their tag."""

    def get_batch(data_iterator, *args, **kwargs):
        batch = upstream_get_batch(data_iterator, *args, **kwargs)
        tag = batch.get(SHARD_TAG_KEY) if isinstance(batch, dict) else None
        if isinstance(tag, ShardTag) and not tag.sliced_in_step:
            del batch[SHARD_TAG_KEY]
            _step.taken = (tag, batch)
        return batch

    get_batch.__wrapped__ = upstream_get_batch
    get_batch.__doc__ = upstream_get_batch.__doc__
    return get_batch


def make_local_batch_fn(upstream_slice: Callable, *, sharded_reads: bool, packing: bool,
                        pad_multiple: int = 1, profile: bool = False) -> Callable:
    """The replacement for ``slice_batch_for_megatron_mimo(batch, dp_rank, dp_size)``.

    It is also bound in ``dp_utils``, where upstream's slice calls itself by module-global name
    for nested dicts (``modality_inputs``): those nested calls must reach upstream's slice, not
    run the step's work (tag check, profiling, packing) once more per nested dict.
    """
    warned = []
    inside = threading.local()

    def local_batch_for_megatron_mimo(batch: dict, dp_rank: int, dp_size: int) -> dict:
        if getattr(inside, "active", False):
            return upstream_slice(batch, dp_rank, dp_size)
        inside.active = True
        try:
            return _local_batch(batch, dp_rank, dp_size)
        finally:
            inside.active = False

    def _local_batch(batch: dict, dp_rank: int, dp_size: int) -> dict:
        tag: Optional[ShardTag] = batch.pop(SHARD_TAG_KEY, None) if isinstance(batch, dict) else None
        loaded_bytes = _tensor_bytes(batch) if profile else 0
        if tag is not None:
            check_replica(tag, dp_rank, dp_size)
            local, read = batch, tag.samples
        else:
            if sharded_reads and dp_size > 1 and not warned:
                warned.append(True)
                warnings.warn(
                    "mimo_accel sharded_reads is on, but this rank loaded a whole global micro-batch "
                    "(the loader was built without mimo_accel: enable() ran after the script imported "
                    "build_pretraining_data_loader, or dataloader_type='external'). Slicing it as "
                    "upstream does; call mimo_accel.enable() before importing megatron.bridge, or use "
                    "`mimo-accel run`.", RuntimeWarning, stacklevel=2)
            local, read = upstream_slice(batch, dp_rank, dp_size), _batch_size(batch)
        role = current_role()
        if profile:
            from mimo_accel import instrument

            instrument.record_batch(local, read_samples=read, read_bytes=loaded_bytes, tagged=tag is not None)
        if packing:
            if role is not None and role.is_language:
                local = pack_for_language_model(local, role, pad_multiple)
        return local

    local_batch_for_megatron_mimo.__wrapped__ = upstream_slice
    return local_batch_for_megatron_mimo


def _tensor_bytes(obj) -> int:
    """Bytes of the tensors in a (nested) batch: what this rank loaded for the step (metadata only)."""
    if hasattr(obj, "element_size") and hasattr(obj, "numel"):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(_tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_tensor_bytes(v) for v in obj)
    return 0


def _batch_size(batch: dict) -> int:
    ids = batch.get("input_ids") if isinstance(batch, dict) else None
    return int(ids.size(0)) if ids is not None and ids.dim() == 2 else 0


def pack_for_language_model(batch: dict, role: StepRole, pad_multiple: int) -> dict:
    """THD-pack the language shard. Lengths come from the padding ``attention_mask``; when it is all
    ones (Bridge 0.6.2's MegatronMIMODataset), from ``loss_mask`` and the placeholder tokens."""
    from mimo_accel.notices import say_once
    from mimo_accel.packing import lengths_from_loss_mask, pack_language_shard

    mask = batch.get("attention_mask")
    if mask is None:
        raise ValueError(
            "mimo_accel packing needs the batch's [batch, seq] attention_mask (1 = real token) as "
            "its length source on every language pipeline stage, but it is None. Keep the padding "
            "mask in the batch (Bridge's Qwen3.5-VL example keeps it when packing is on); the "
            "packer drops it before the model.")
    lengths = None
    if bool((mask != 0).all()):
        lengths = lengths_from_loss_mask(batch, role.placeholder_ids)
        say_once("packing:length-source", "mimo_accel packing: the attention_mask marks no padding "
                 "(all ones), so sample lengths come from loss_mask and the placeholder tokens")
    packed, kwargs = pack_language_shard(batch, lengths, pad_multiple=pad_multiple,
                                         tp_size=role.sequence_parallel_size,
                                         is_first_stage=role.is_first_stage)
    packed["packing_kwargs"] = kwargs
    return packed
