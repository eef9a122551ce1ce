"""THD sequence packing of a MegatronMIMO language shard.

The language model of MegatronMIMO receives ``[B, S]`` tensors that are right-padded to ``S``.
:func:`pack_language_shard` concatenates the real tokens of the shard's samples, in sample
order, into one ``[1, T]`` sequence and returns the ``packing_kwargs`` that
``MimoModel.forward(packing_kwargs=...)`` turns into a THD ``PackedSeqParams``: attention becomes
block-diagonal per sample through ``cu_seqlens`` and the LM does no padding compute.

Layout of the packed sequence (``k = pad_multiple``)::

    | sample 0 real | pad0 | sample 1 real | pad1 | ... | sample n real | pad_n + tp pad |
    ^ cu_seqlens_q_padded[0]=0   ^ cu_seqlens_q_padded[1]           cu_seqlens_q_padded[-1]=T ^

* Every segment starts at ``cu_seqlens_q_padded[i]`` (a multiple of ``k``), holds its real tokens
  first, then ``round_up(len_i, k) - len_i`` alignment tokens. ``cu_seqlens_q`` keeps the real
  lengths (Transformer Engine's padded-THD convention), so real tokens never attend to padding.
  Context parallelism needs ``k`` a multiple of ``2 * cp`` (``cp_size`` refuses any other,
  naming the value that would do).
* ``tp_size``: the total ``T`` is rounded up to a multiple of ``lcm(k, tp_size)`` so that
  sequence parallelism can scatter it evenly. The extra tokens **extend the last segment**: there
  is no extra segment, ``cu_seqlens_q_padded[-1] == T`` (megatron-core's THD RoPE splits the
  packed tensor by the padded cu_seqlens and needs them to cover all ``T`` rows; TE's CP
  partitioner indexes by them too), and every padded segment stays a multiple of ``k``. Under
  CP + SP pass ``tp_size = tp * cp``: each CP rank holds ``T / cp`` tokens that SP then splits
  ``tp`` ways.
* ``max_seqlen_q/kv`` is the longest *padded* segment (tp extension included), a Python int.
  That is what TE expects for padded THD, and what megatron-core's ``RotaryEmbedding`` sizes its
  frequency table with (``get_rotary_seq_len`` returns ``max(max_seqlen_q, max_seqlen_kv)``;
  the THD RoPE path applies it per padded segment).
* Padding tokens: ``input_ids = pad_token_id`` (must not be an image-placeholder id),
  ``labels = -100``, ``loss_mask = 0``, ``position_ids = 0`` (in every MRoPE channel). Position 0
  is always a valid index of any position table (learned absolute embeddings included); the
  value never reaches a real token because ``cu_seqlens_q`` excludes padding from attention.
* Samples of length 0 contribute no segment (they are left out of ``cu_seqlens``: a zero-length
  segment buys nothing, and not every THD kernel path is known to accept one).
  ``PackedLayout.segment_samples`` maps segments back to samples.

Each sample's real length comes from ``lengths``, else from its ``attention_mask``
(:mod:`mimo_accel.sample_lengths`).

Image-placeholder tokens are ordinary tokens here: they keep their order, and samples keep
theirs, so the row-major splice of encoder rows into placeholder positions
(``align_embeddings_by_token_positions``) pairs the same rows with the same samples as unpacked.

Where this differs from Megatron-Bridge main's ``data/megatron_mimo/sequence_pack.py``
(``pack_language_shard(data_batch, *, lengths=None)``):
  - ``lengths`` is the second positional parameter; when it is ``None`` the lengths are derived
    from ``batch["attention_mask"]`` and validated (right padding only). Upstream returns the batch
    unpacked when ``lengths`` is ``None`` and lets its caller sum the mask without checking holes.
  - Alignment padding (``pad_multiple``, ``tp_size``); upstream packs tight, so its padded
    cu_seqlens equal the real ones and CP > 1 / SP need segment lengths that happen to divide.
  - ``max_seqlen`` is the longest padded segment; ``pad_between_seqs`` is filled in from the host
    (TE otherwise infers it with a device-side ``torch.equal`` of the cu_seqlens, a host sync,
    in every attention call).
  - Zero-length samples get no segment; upstream keeps zero-length segments.
  - ``position_ids`` are generated (``arange`` per sample) when the batch has none.
  - ``is_first_stage`` makes a missing ``input_ids`` on the first stage an error instead of a
    silently token-less pack; ``return_stats`` reports what packing saved.

Pure torch: no ``torch.distributed``, no megatron import.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from mimo_accel.sample_lengths import SEQUENCE_KEYS, checked_lengths, lengths_from_mask, shard_shape

__all__ = [
    "LABEL_PAD",
    "PackedLayout",
    "PackingStats",
    "check_alignment",
    "cp_alignment",
    "pack_language_shard",
    "pack_layout",
]

#: label value of padding tokens (the ignore index of Megatron's cross entropy)
LABEL_PAD = -100


@dataclass(frozen=True)
class PackingStats:
    """What packing one shard did to the language model's token count.

    ``tokens_before`` is what the LM computes unpacked (``B * S``), ``tokens_after`` what it
    computes packed (``T``, alignment padding included).
    """

    num_samples: int
    tokens_before: int
    real_tokens: int
    tokens_after: int

    @property
    def alignment_padding(self) -> int:
        """Tokens added by ``pad_multiple`` / ``tp_size`` alignment (``T - real``)."""
        return self.tokens_after - self.real_tokens

    @property
    def padding_fraction_before(self) -> float:
        """Share of the unpacked ``B * S`` tokens that were padding."""
        return 1.0 - self.real_tokens / self.tokens_before if self.tokens_before else 0.0

    @property
    def padding_fraction_after(self) -> float:
        """Share of the packed ``T`` tokens that are alignment padding."""
        return self.alignment_padding / self.tokens_after if self.tokens_after else 0.0

    @property
    def tokens_saved_fraction(self) -> float:
        """``1 - T / (B * S)``: share of LM token compute removed (negative if alignment costs
        more than the padding removed, possible only for nearly unpadded shards)."""
        return 1.0 - self.tokens_after / self.tokens_before if self.tokens_before else 0.0


@dataclass(frozen=True)
class PackedLayout:
    """Host-side layout of a packed shard; all tuples are per segment (non-empty sample)."""

    segment_samples: tuple[int, ...]  # sample index of each segment, ascending
    cu_seqlens: tuple[int, ...]  # real lengths, cumulative, starts at 0
    cu_seqlens_padded: tuple[int, ...]  # segment starts, multiples of pad_multiple; [-1] == T
    max_seqlen: int  # longest padded segment
    stats: PackingStats

    @property
    def total(self) -> int:
        """``T``, the packed length."""
        return self.cu_seqlens_padded[-1]

    @property
    def pad_between_seqs(self) -> bool:
        """True when a segment other than the last has padding (TE's ``pad_between_seqs``)."""
        return self.cu_seqlens[:-1] != self.cu_seqlens_padded[:-1]

    def packing_kwargs(self, device: torch.device | str | None = None) -> dict[str, Any]:
        """The kwargs ``PackedSeqParams(**kw)`` / ``MimoModel(packing_kwargs=kw)`` take."""
        cu = torch.tensor(self.cu_seqlens, dtype=torch.int32, device=device)
        cu_padded = torch.tensor(self.cu_seqlens_padded, dtype=torch.int32, device=device)
        return {
            "cu_seqlens_q": cu,
            "cu_seqlens_kv": cu,
            "cu_seqlens_q_padded": cu_padded,
            "cu_seqlens_kv_padded": cu_padded,
            "max_seqlen_q": self.max_seqlen,
            "max_seqlen_kv": self.max_seqlen,
            "pad_between_seqs": self.pad_between_seqs,
        }


def _check_positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


def _round_up(n: int, k: int) -> int:
    return -(-n // k) * k


def cp_alignment(cp_size: int) -> int:
    """The segment alignment THD context parallelism needs: megatron-core splits every padded
    segment into ``2 * cp`` chunks (``thd_get_partitioned_indices`` over ``cu_seqlens_q_padded``;
    the THD RoPE divides each padded segment by ``cp``), so each must be a multiple of ``2 * cp``."""
    cp = _check_positive_int("cp_size", cp_size)
    return 2 * cp if cp > 1 else 1


def check_alignment(pad_multiple: int, cp_size: int = 1) -> None:
    """Refuse a ``pad_multiple`` that context parallelism of ``cp_size`` cannot split, naming the
    value that would do (the smallest multiple of both)."""
    need = cp_alignment(cp_size)
    k = _check_positive_int("pad_multiple", pad_multiple)
    if k % need:
        fix = math.lcm(k, need)
        raise ValueError(
            f"mimo_accel packing: the language model runs with context parallelism {cp_size}, which splits "
            f"every packed segment into 2*cp = {need} chunks, but pad_multiple={k} is not a multiple of "
            f"{need}. Set pad_multiple={fix} (enable(pad_multiple={fix}) or MIMO_ACCEL_PAD_MULTIPLE={fix}).")


def pack_layout(
    lengths: Sequence[int],
    seq_len: int,
    *,
    pad_multiple: int = 1,
    tp_size: int = 1,
    cp_size: int = 1,
) -> PackedLayout:
    """Lay out a shard of samples with real ``lengths`` (right-padded to ``seq_len``) as one
    packed sequence; see the module docstring for the layout. Pure Python, no tensors.
    ``cp_size``: the language model's context parallelism; ``pad_multiple`` must then be a
    multiple of ``2 * cp_size`` (:func:`check_alignment`)."""
    k = _check_positive_int("pad_multiple", pad_multiple)
    tp = _check_positive_int("tp_size", tp_size)
    check_alignment(k, cp_size)
    lengths = [int(n) for n in lengths]
    bad = [(i, n) for i, n in enumerate(lengths) if not 0 <= n <= seq_len]
    if bad:
        i, n = bad[0]
        raise ValueError(f"lengths[{i}] = {n} is outside [0, {seq_len}] (the sequence length)")
    segment_samples = tuple(i for i, n in enumerate(lengths) if n > 0)
    if not segment_samples:
        raise ValueError(
            f"cannot pack an empty language shard: all {len(lengths)} samples have length 0. "
            "Check that attention_mask marks real tokens with 1 (or pass lengths=...), and drop "
            "empty samples before packing."
        )
    real = [lengths[i] for i in segment_samples]
    padded = [_round_up(n, k) for n in real]
    # tp alignment extends the last segment; a multiple of lcm keeps it a multiple of k
    total = _round_up(sum(padded), math.lcm(k, tp))
    padded[-1] += total - sum(padded)
    cu, cu_padded = [0], [0]
    for n, p in zip(real, padded):
        cu.append(cu[-1] + n)
        cu_padded.append(cu_padded[-1] + p)
    stats = PackingStats(
        num_samples=len(lengths),
        tokens_before=len(lengths) * seq_len,
        real_tokens=cu[-1],
        tokens_after=total,
    )
    return PackedLayout(segment_samples, tuple(cu), tuple(cu_padded), max(padded), stats)


def pack_language_shard(
    batch: Mapping[str, Any],
    lengths: Sequence[int] | torch.Tensor | None = None,
    *,
    pad_multiple: int = 1,
    tp_size: int = 1,
    cp_size: int = 1,
    is_first_stage: bool = True,
    pad_token_id: int = 0,
    return_stats: bool = False,
) -> tuple[dict[str, Any], dict[str, Any]] | tuple[dict[str, Any], dict[str, Any], PackingStats]:
    """Pack a language shard's real tokens into one ``[1, T]`` THD sequence.

    Args:
        batch: the shard, ``input_ids`` / ``labels`` / ``loss_mask`` ``[B, S]`` (any may be None
            on pipeline stages that don't use them), ``position_ids`` ``[B, S]`` or MRoPE
            ``[3, B, S]`` (generated per sample when absent), ``attention_mask`` ``[B, S]``.
            Other keys pass through untouched. The input is not modified.
        lengths: real length per sample; by default derived from ``attention_mask`` (which
            every pipeline stage has, so all stages pack to the same ``T``). Explicit lengths
            win over the mask and are not cross-checked against it.
        pad_multiple: every segment is padded to a multiple of this (``2 * cp`` under CP).
        tp_size: ``T`` is padded to a multiple of this (``tp`` under SP, ``tp * cp`` under
            CP + SP); the padding extends the last segment.
        cp_size: the language model's context parallelism: ``pad_multiple`` must be a multiple
            of ``2 * cp_size``, else ValueError naming the value that would do.
        is_first_stage: the first LM pipeline stage must have ``input_ids``.
        pad_token_id: ``input_ids`` value of alignment padding; must not be a placeholder id.
        return_stats: also return a :class:`PackingStats`.

    Returns:
        ``(packed_batch, packing_kwargs)`` (plus ``stats`` with ``return_stats``).
        ``packed_batch`` has the packed ``[1, T]`` tensors (``position_ids`` ``[1, T]`` or
        ``[3, 1, T]``) and ``attention_mask=None``; ``packing_kwargs`` has int32
        ``cu_seqlens_{q,kv}`` / ``cu_seqlens_{q,kv}_padded`` on the batch's device, int
        ``max_seqlen_{q,kv}`` and bool ``pad_between_seqs``: ``PackedSeqParams(**kw)`` accepts it.

    Raises:
        ValueError: missing/malformed attention_mask, left padding or holes, inconsistent
            shapes or lengths, an all-empty shard, bad ``pad_multiple`` / ``tp_size``.
    """
    if not isinstance(batch, Mapping):
        raise TypeError(f"batch must be a dict of tensors, got {type(batch).__name__}")
    if isinstance(pad_token_id, bool) or not isinstance(pad_token_id, int):
        raise TypeError(f"pad_token_id must be an int, got {pad_token_id!r}")
    batch_size, seq_len = shard_shape(batch, is_first_stage)
    mask = batch.get("attention_mask")
    if lengths is None:
        lengths_list, seq_len = lengths_from_mask(batch, batch_size, seq_len)
    else:
        lengths_list = checked_lengths(lengths, batch_size)
        if seq_len is None:  # nothing to pack but the kwargs: S only feeds the stats
            has_mask = isinstance(mask, torch.Tensor) and mask.dim() == 2
            seq_len = mask.size(1) if has_mask else max(lengths_list, default=0)
    plan = pack_layout(lengths_list, seq_len, pad_multiple=pad_multiple, tp_size=tp_size, cp_size=cp_size)

    tensors = [batch.get(k) for k in SEQUENCE_KEYS] + [mask]
    ref = next((t for t in tensors if isinstance(t, torch.Tensor)), None)
    device = ref.device if ref is not None else torch.device("cpu")
    gather = _Gather(plan, seq_len, device)

    packed = dict(batch)
    if batch.get("input_ids") is not None:
        packed["input_ids"] = gather(batch["input_ids"], pad_token_id)
    for key, pad in (("labels", LABEL_PAD), ("loss_mask", 0)):
        if batch.get(key) is not None:
            packed[key] = gather(batch[key], pad)
    position_ids = batch.get("position_ids")
    packed["position_ids"] = (
        gather.positions() if position_ids is None else gather(position_ids, 0)
    )
    packed["attention_mask"] = None  # block-diagonal attention comes from cu_seqlens

    kwargs = plan.packing_kwargs(device)
    if return_stats:
        return packed, kwargs, plan.stats
    return packed, kwargs


class _Gather:
    """Index maps from ``[B, S]`` to ``[T]``, built once per shard, on the batch's device."""

    def __init__(self, plan: PackedLayout, seq_len: int, device: torch.device):
        self.total = plan.total
        real = plan.cu_seqlens[-1]
        cu = plan.cu_seqlens
        # Per segment: where its real tokens start in the packed sequence (tight and padded)
        # and in the flattened [B * S] batch, each minus the segment's tight start, so that
        # adding the packed-real-token counter j gives the token's index. One host -> device
        # copy, then a repeat_interleave and adds: no per-element gathers, no syncs.
        table = torch.tensor(
            [
                [b - a for a, b in zip(cu, cu[1:])],
                [-a for a in cu[:-1]],
                [i * seq_len - a for i, a in zip(plan.segment_samples, cu[:-1])],
                [p - a for p, a in zip(plan.cu_seqlens_padded[:-1], cu[:-1])],
            ],
            dtype=torch.long,
        ).to(device)
        per_token = torch.repeat_interleave(table[1:], table[0], dim=1, output_size=real)
        per_token += torch.arange(real, device=device)
        offset, src, dst = per_token.unbind(0)  # offset: position inside its sample
        if plan.cu_seqlens_padded == plan.cu_seqlens:
            # tight pack: real token j lands at j
            self.src, self.offset, self.pad = src, offset, None
        else:
            # padded pack: gather index and position over all T slots (padding slots read
            # element 0 and are overwritten), so each tensor costs one gather + one fill
            self.pad = torch.ones(self.total, dtype=torch.bool, device=device)
            self.pad.index_fill_(0, dst, False)
            self.src = torch.zeros(self.total, dtype=torch.long, device=device)
            self.src.index_copy_(0, dst, src)
            self.offset = torch.zeros(self.total, dtype=torch.long, device=device)
            self.offset.index_copy_(0, dst, offset)

    def __call__(self, t: torch.Tensor, pad: int) -> torch.Tensor:
        """``[B, S]`` -> ``[1, T]``; MRoPE ``[3, B, S]`` -> ``[3, 1, T]``."""
        flat = t.reshape(t.size(0), -1) if t.dim() == 3 else t.reshape(-1)
        out = flat.index_select(-1, self.src)
        if self.pad is not None:
            out.masked_fill_(self.pad, pad)
        return out.unsqueeze(-2)

    def positions(self) -> torch.Tensor:
        """``arange`` per sample, ``[1, T]``, padding 0."""
        return self.offset.unsqueeze(0)
