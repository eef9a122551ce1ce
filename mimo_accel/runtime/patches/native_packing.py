"""mimo_accel's packer in place of upstream main's step-time packing.

Megatron-Bridge main (training/megatron_mimo_step.py at 067f987) packs the language shard in its
``forward_step``; both names are looked up in the step's module globals at call time::

    pack_sequences_enabled = resolve_step_packing(state.cfg.dataset)
    ...  # slice; then on every language stage, from the sliced [B, S] attention_mask:
    pack_lengths = mask.to(torch.bool).sum(dim=1).to(torch.long)
    ...  # input_ids = None off the first LM stage, labels / loss_mask = None off the last
    data_batch, packing_kwargs = pack_language_shard(data_batch, lengths=pack_lengths)
    if packing_kwargs is not None:
        data_batch["packing_kwargs"] = packing_kwargs
    model(**data_batch)   # MimoModel builds PackedSeqParams(**packing_kwargs), qkv_format="thd"

With mimo_accel packing on, :func:`wrap_resolve_step_packing` turns step packing on (upstream's
own check still runs, so collate-time packing is still refused), and
:func:`wrap_pack_language_shard` packs exactly as mimo_accel does on 0.6: per-segment
``pad_multiple`` and sequence-parallel alignment of ``T``, lengths validated from the
``attention_mask`` (right padding only; loss_mask + placeholders when it is all ones),
``position_ids`` generated when absent, and ``pad_between_seqs`` in the kwargs (a
``PackedSeqParams`` field in megatron-core 0.19.2 and at the 0.20.0 pin). It returns what
upstream's does, ``(packed_batch, packing_kwargs)`` with ``attention_mask=None``. On 0.6 the step
packs nothing, and mimo_accel packs in its slice replacement instead (:mod:`mimo_accel.runtime.patches.step`).

The packer needs the rank's pipeline stage: the role of the model upstream's step asked
``_get_module_dp_info`` about earlier in the same step (``Runtime.step_role``), with or without a
slice in between (upstream's scalable reads run none).
"""

from __future__ import annotations

from typing import Callable

from mimo_accel.runtime.state import Runtime
from mimo_accel.runtime.patches.upstream_call import UpstreamCall, replacing, unknown


def wrap_resolve_step_packing(original: Callable, runtime: Runtime) -> Callable:
    """``resolve_step_packing(dataset_cfg) -> bool``: True (mimo_accel packing is on)."""

    @replacing(original)
    def resolve_step_packing(call: UpstreamCall):
        call.to(original)  # keeps upstream's refusal of collate-time packing
        return True

    return resolve_step_packing


def wrap_pack_language_shard(original: Callable, runtime: Runtime) -> Callable:
    """The replacement for main's ``pack_language_shard(data_batch, *, lengths=None)``: it packs
    in upstream's place (upstream's packer is not called), and says once which arguments upstream's
    step passed that it does not use.

    Packs as mimo_accel does on 0.6 (:func:`mimo_accel.runtime.local_batch.pack_for_language_model`): the
    caller's ``lengths`` are the row sums of the batch's ``attention_mask``, which that function
    derives itself, checking right padding. Where the mask marks no padding (all ones), the lengths
    come from ``loss_mask`` + placeholders, worked out earlier in the step (``Runtime.step_lengths``,
    by the slice, or under scalable reads by ``_get_module_dp_info``): the step has dropped
    ``input_ids`` off the first language stage and ``loss_mask`` off the last by now.
    """
    pad_multiple = runtime.config.pad_multiple

    @replacing(original)
    def pack_language_shard(call: UpstreamCall):
        from mimo_accel.runtime.local_batch import pack_for_language_model

        ignored = unknown(call, ("data_batch", "lengths"))
        if ignored:
            runtime.say_once(f"packing:ignored:{','.join(ignored)}",
                             f"mimo_accel packing: upstream's step passed {', '.join(ignored)} to pack_language_shard, "
                             "which mimo_accel's packer (in its place) does not use; it packs with pad_multiple "
                             "and TP/CP alignment, lengths from the attention_mask. Turn mimo_accel packing off "
                             "to pack with upstream's own packer.")
        data_batch = call["data_batch"]
        role = runtime.step_role
        if role is None or not role.is_language:
            raise RuntimeError(
                "mimo_accel: upstream's step asked to pack a language shard, but mimo_accel has not seen "
                "this step's _get_module_dp_info call, so it does not know the rank's pipeline stage. "
                "Call pack_language_shard only from megatron_mimo_step.forward_step, or disable packing.")
        # decided while input_ids and loss_mask were both in the batch: by the slice, or under
        # upstream's scalable reads at _get_module_dp_info (None: neither ran this step)
        known, runtime.step_lengths = runtime.step_lengths, None
        packed = pack_for_language_model(data_batch, role, pad_multiple, runtime.say_once, known)
        kwargs = packed.pop("packing_kwargs")
        if runtime.activity is not None:
            runtime.activity.saw_pack(data_batch, packed)
        if runtime.profiling is not None:
            runtime.profiling.record_packed(kwargs)
        return packed, kwargs

    return pack_language_shard
