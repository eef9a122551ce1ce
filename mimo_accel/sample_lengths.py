"""Each sample's real length in a language shard: what THD packing (:mod:`mimo_accel.packing`) cuts.

Lengths come from ``attention_mask`` (1 = real token, right-padded; it must cover the
image-placeholder tokens), which every pipeline stage has, so all stages pack to the same ``T``
(:func:`lengths_from_mask`, which checks the right padding). Bridge's ``MegatronMIMODataset``
builds ``attention_mask`` as ones over the whole padded ``seq_length``: there the lengths come from
``loss_mask`` and the placeholder tokens (:func:`lengths_from_loss_mask`), which only a batch that
still holds both ``loss_mask`` and ``input_ids`` can give. A mask of another shape than the
shard's sequence tensors is no length source at all (:func:`checked_attention_mask`).

Pure torch: no ``torch.distributed``, no megatron import.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

__all__ = ["SEQUENCE_KEYS", "checked_attention_mask", "checked_lengths", "lengths_from_loss_mask",
           "lengths_from_mask", "loss_mask_lengths", "real_lengths", "shard_shape"]

#: keys of a shard's ``[B, S]`` (``position_ids``: also ``[3, B, S]``) sequence tensors
SEQUENCE_KEYS = ("input_ids", "labels", "loss_mask", "position_ids")


def shard_shape(batch: Mapping[str, Any], is_first_stage: bool) -> tuple[int | None, int | None]:
    """``(B, S)`` of the shard's sequence tensors, checked to agree; ``(None, None)`` if none."""
    if is_first_stage and batch.get("input_ids") is None:
        raise ValueError(
            "the first language pipeline stage needs batch['input_ids'] to pack; on later stages "
            "pass is_first_stage=False"
        )
    shape: tuple[int, int] | None = None
    first_key = None
    for key in SEQUENCE_KEYS:
        t = batch.get(key)
        if t is None:
            continue
        if not isinstance(t, torch.Tensor):
            raise TypeError(
                f"batch[{key!r}] must be a torch.Tensor or None, got {type(t).__name__}"
            )
        if key == "position_ids" and t.dim() == 3:
            if t.size(0) != 3:
                raise ValueError(
                    f"3-D position_ids must be MRoPE [3, B, S], got shape {tuple(t.shape)}"
                )
            bs = (t.size(1), t.size(2))
        elif t.dim() == 2:
            bs = (t.size(0), t.size(1))
        else:
            allowed = "[B, S] or MRoPE [3, B, S]" if key == "position_ids" else "[B, S]"
            raise ValueError(f"batch[{key!r}] must be {allowed}, got shape {tuple(t.shape)}")
        if shape is None:
            shape, first_key = bs, key
        elif bs != shape:
            raise ValueError(
                f"batch[{key!r}] has [B, S] = {list(bs)} but batch[{first_key!r}] has "
                f"{list(shape)}; all sequence tensors of a shard must agree"
            )
    return shape if shape is not None else (None, None)


def checked_attention_mask(batch: Mapping[str, Any]) -> torch.Tensor:
    """The shard's ``attention_mask``, checked to be ``[B, S]`` of its sequence tensors' B and S."""
    return _checked_mask(batch, *shard_shape(batch, is_first_stage=False))


def _checked_mask(batch: Mapping[str, Any], batch_size: int | None, seq_len: int | None) -> torch.Tensor:
    mask = batch.get("attention_mask")
    if mask is None:
        raise ValueError(
            "pack_language_shard needs batch['attention_mask'] ([B, S], 1 = real token, "
            "right-padded) to find each sample's real length, or explicit lengths=..."
        )
    if not isinstance(mask, torch.Tensor) or mask.dim() != 2:
        shape = tuple(mask.shape) if isinstance(mask, torch.Tensor) else type(mask).__name__
        raise ValueError(f"attention_mask must be a 2-D [B, S] tensor, got {shape}")
    if batch_size is not None and mask.size(0) != batch_size:
        raise ValueError(
            f"attention_mask has batch size {mask.size(0)} but the sequence tensors have "
            f"{batch_size}; slice the mask together with the batch"
        )
    if seq_len is not None and mask.size(1) != seq_len:
        raise ValueError(
            f"attention_mask width {mask.size(1)} does not match the sequence tensors' width "
            f"{seq_len}; lengths derived from it would corrupt the pack"
        )
    return mask


def lengths_from_mask(
    batch: Mapping[str, Any], batch_size: int | None, seq_len: int | None
) -> tuple[list[int], int]:
    mask = _checked_mask(batch, batch_size, seq_len)
    real = mask != 0
    lengths = real.sum(dim=1)
    prefix = torch.arange(mask.size(1), device=mask.device) < lengths[:, None]
    rows_ok = (prefix == real).all(dim=1)
    # one device -> host copy for both the lengths and the check
    host = torch.stack([lengths, rows_ok.to(lengths.dtype)]).tolist()
    bad_rows = [i for i, ok in enumerate(host[1]) if not ok]
    if bad_rows:
        raise ValueError(
            f"attention_mask rows {bad_rows[:8]} are not a prefix of ones: left padding and "
            "holes are unsupported; pack_language_shard needs right-padded samples"
        )
    return host[0], mask.size(1)


def lengths_from_loss_mask(batch: Mapping[str, Any], placeholder_ids: Sequence[int]) -> list[int]:
    """Real lengths of right-padded samples whose ``attention_mask`` is all ones.

    Bridge 0.6.2's ``MegatronMIMODataset`` (megatron/bridge/data/megatron_mimo/dataset.py) pads to
    ``seq_length`` and sets ``attention_mask`` to ones, but its ``loss_mask`` is 1 exactly where the
    target ``input_ids[i + 1]`` is a real, non-placeholder token before the last real one. So if p
    is a sample's last loss position, tokens ``p + 2 ...`` up to the real length are placeholders,
    and the real length is p + 2 extended over the placeholders that follow (1 when there is no
    loss position). What remains must be padding — one repeated token id — or this source does not
    describe the batch and packing refuses rather than cut real tokens.
    """
    loss_mask, ids = batch.get("loss_mask"), batch.get("input_ids")
    if not isinstance(loss_mask, torch.Tensor) or not isinstance(ids, torch.Tensor):
        raise ValueError(
            "mimo_accel packing: attention_mask is all ones (no padding marked), and the batch has no "
            "loss_mask and input_ids to take the real lengths from; there is no length source. Give "
            "the collate a padding attention_mask (1 = real token), or turn packing off.")
    if loss_mask.shape != ids.shape or loss_mask.dim() != 2:
        raise ValueError(f"loss_mask {tuple(loss_mask.shape)} and input_ids {tuple(ids.shape)} must both be [B, S]")
    lengths, described = loss_mask_lengths(ids, loss_mask, placeholder_ids)
    host_lengths, host_described = torch.stack([lengths, described.to(lengths.dtype)]).tolist()  # one copy
    for row, ok in enumerate(host_described):
        if not ok:
            raise ValueError(
                f"mimo_accel packing: attention_mask is all ones and sample {row}'s loss_mask does not "
                "mark where its real tokens end (what follows is not one repeated pad token), so its "
                "length cannot be known. Give the collate a padding attention_mask (1 = real token).")
    return host_lengths


def loss_mask_lengths(ids: torch.Tensor, loss_mask: torch.Tensor,
                      placeholder_ids: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`lengths_from_loss_mask`'s rule on ``[B, S]`` tensors, computed where they lie (no
    host copy): each sample's length, and whether the rule describes it (what follows is one
    repeated pad token)."""
    seq = ids.size(1)
    positions = torch.arange(seq, device=ids.device)
    last = torch.where(loss_mask != 0, positions, -1).max(dim=1).values
    start = torch.where(last >= 0, last + 2, 1).clamp(max=seq)
    placeholder = torch.isin(ids, torch.tensor([int(t) for t in placeholder_ids], dtype=ids.dtype, device=ids.device))
    # the first position from the start that is no placeholder: the real length
    lengths = torch.where((positions >= start[:, None]) & ~placeholder, positions, seq).min(dim=1).values
    pad = ids.gather(1, lengths.clamp(max=max(seq - 1, 0))[:, None])
    described = ~((positions >= lengths[:, None]) & (ids != pad)).any(dim=1)
    return lengths, described


def real_lengths(batch: Mapping[str, Any], placeholder_ids: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Each sample's real length as packing takes it, computed where the batch lies (no host copy;
    the profiler counts the tokens of batches that are not packed): the ``attention_mask``'s rows
    where it marks padding, else the ``loss_mask`` rule (:func:`loss_mask_lengths`). Returns the
    lengths, a sample neither source describes counted as its whole row, and which samples those
    are; None where the batch has neither source (no ``[B, S]`` attention_mask, no loss_mask and
    input_ids)."""
    ids, loss_mask, mask = batch.get("input_ids"), batch.get("loss_mask"), batch.get("attention_mask")
    rule = (isinstance(ids, torch.Tensor) and isinstance(loss_mask, torch.Tensor) and ids.dim() == 2
            and loss_mask.shape == ids.shape)
    if not (isinstance(mask, torch.Tensor) and mask.dim() == 2 and (not rule or mask.shape == ids.shape)):
        mask = None
    if mask is None and not rule:
        return None
    if rule:
        from_loss, described = loss_mask_lengths(ids, loss_mask, placeholder_ids)
        guessed = torch.where(described, from_loss, ids.size(1))
    if mask is None:
        return guessed, ~described
    rows = (mask != 0).sum(dim=1)
    marks = (mask == 0).any()  # a mask that marks padding is the source (as packing decides it)
    if not rule:
        return rows, ~marks.expand(rows.shape)
    return torch.where(marks, rows, guessed), ~marks & ~described


def checked_lengths(lengths: Any, batch_size: int | None) -> list[int]:
    if isinstance(lengths, torch.Tensor):
        if lengths.dim() != 1 or lengths.is_floating_point() or lengths.is_complex():
            raise ValueError(
                f"lengths must be a 1-D integer tensor, got {lengths.dtype} {tuple(lengths.shape)}"
            )
        values = lengths.tolist()
    else:
        values = list(lengths)
        if any(isinstance(n, bool) or int(n) != n for n in values):
            raise ValueError(f"lengths must be integers, got {values}")
        values = [int(n) for n in values]
    if batch_size is not None and len(values) != batch_size:
        raise ValueError(f"got {len(values)} lengths for a shard of {batch_size} samples")
    return values
