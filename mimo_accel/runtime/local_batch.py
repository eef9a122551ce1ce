"""The local batch a forward step works on: the role of the model whose step runs, the check that a
batch read for one replica is this replica's, what it weighs, and its THD packing for the language
model. Called by the step's patches (:mod:`mimo_accel.runtime.patches.step`, and upstream main's
step packing: :mod:`mimo_accel.runtime.patches.native_packing`)."""

from __future__ import annotations

from typing import Callable, Optional

from mimo_accel.modules import LANGUAGE
from mimo_accel.nvtx import ranged
from mimo_accel.runtime.context import ShardLengths, StepRole
from mimo_accel.runtime.reading.shard import ShardTag
from mimo_accel.runtime.state import Runtime


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
    dims = dict(zip(grid.dim_names, grid.shape)) if grid is not None else {}
    cp = int(dims.get("cp", 1))
    if grid is not None and getattr(lm_config, "sequence_parallel", False):
        sp = dims.get("tp", 1) * cp
    return StepRole(True, role.is_first_stage(LANGUAGE), role.is_last_stage(LANGUAGE), sp, tokens, cp)


def role_of_rank(runtime: Runtime, mimo_model) -> Optional[StepRole]:
    """The role of ``mimo_model``, worked out once per model (a model's role never changes)."""
    if mimo_model in runtime.roles:
        return runtime.roles[mimo_model]
    role = runtime.roles[mimo_model] = role_of(mimo_model)
    if runtime.profiling is not None:  # the model this rank runs, seen once: what to time and by which name
        runtime.profiling.saw_model(mimo_model)
    return role


def check_replica(tag: ShardTag, dp_rank: int, dp_size: int) -> None:
    if (tag.dp_rank, tag.dp_size) != (dp_rank, dp_size):
        raise RuntimeError(
            f"mimo_accel: this batch was read for {tag.module} replica {tag.dp_rank}/{tag.dp_size} "
            f"but the forward step runs as replica {dp_rank}/{dp_size}. The data loader and the "
            "model disagree on the layout; build the loaders after the model (with the same "
            "MegatronMIMOParallelismConfig).")


def tensor_bytes(obj) -> int:
    """Bytes of the tensors in a (nested) batch: what this rank loaded for the step (metadata only)."""
    if hasattr(obj, "element_size") and hasattr(obj, "numel"):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(tensor_bytes(v) for v in obj)
    return 0


def batch_size(batch: dict) -> int:
    ids = batch.get("input_ids") if isinstance(batch, dict) else None
    return int(ids.size(0)) if ids is not None and ids.dim() == 2 else 0


def shard_lengths(batch: dict, role: StepRole, say_once: Callable[[str, str], object]) -> ShardLengths:
    """Where the language shard's real lengths come from (:class:`ShardLengths`)."""
    from mimo_accel.sample_lengths import checked_attention_mask, lengths_from_loss_mask

    if batch.get("attention_mask") is None:
        raise ValueError(
            "mimo_accel packing needs the batch's [batch, seq] attention_mask (1 = real token) as "
            "its length source on every language pipeline stage, but it is None. Keep the padding "
            "mask in the batch (Bridge's Qwen3.5-VL example keeps it when packing is on); the "
            "packer drops it before the model.")
    mask = checked_attention_mask(batch)  # a mask of another shape than the batch is no length source
    if not bool((mask != 0).all()):
        return ShardLengths()
    lengths = lengths_from_loss_mask(batch, role.placeholder_ids)
    say_once("packing:length-source", "mimo_accel packing: the attention_mask marks no padding "
             "(all ones), so sample lengths come from loss_mask and the placeholder tokens")
    return ShardLengths(lengths)


@ranged("mimo_accel/pack")  # NVTX on CUDA only (mimo_accel.nvtx)
def pack_for_language_model(batch: dict, role: StepRole, pad_multiple: int,
                            say_once: Callable[[str, str], object], known: Optional[ShardLengths] = None) -> dict:
    """THD-pack the language shard, its lengths as ``known`` says (decided earlier in the step, where
    the batch still held what they come from), else as :func:`shard_lengths` decides now."""
    from mimo_accel.packing import pack_language_shard

    lengths = (known if known is not None else shard_lengths(batch, role, say_once)).lengths
    packed, kwargs = pack_language_shard(batch, lengths, pad_multiple=pad_multiple,
                                         tp_size=role.sequence_parallel_size,
                                         cp_size=role.context_parallel_size,
                                         is_first_stage=role.is_first_stage)
    packed["packing_kwargs"] = thd_kwargs(kwargs)
    return packed


def thd_kwargs(kwargs: dict) -> dict:
    """The packer's kwargs as the installed megatron-core's ``PackedSeqParams`` takes them: a core
    before ``pad_between_seqs`` (#4986's pin, adfb8ec79) has none, and Transformer Engine infers it."""
    from megatron.core.packed_seq_params import PackedSeqParams

    return {k: v for k, v in kwargs.items() if k != "pad_between_seqs" or k in PackedSeqParams.__dataclass_fields__}
