"""Tests of mimo_accel.packing: THD packing of a MegatronMIMO language shard."""

from __future__ import annotations

import itertools
import math
import typing

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mimo_accel.packing import LABEL_PAD, PackingStats, pack_language_shard, pack_layout
from mimo_accel.runtime.local_batch import thd_kwargs
from tests._hypothesis import examples

PLACEHOLDER = 99  # an image-placeholder token id; never used as padding here


def make_batch(lengths, seq_len, *, mrope=False, seed=0, images=()):
    """A right-padded shard like Bridge's MIMO collate produces; ``images[i]`` placeholders
    open sample ``i``. Token ids are unique per (sample, position) so order is checkable."""
    g = torch.Generator().manual_seed(seed)
    n = len(lengths)
    real = torch.arange(seq_len)[None, :] < torch.tensor(lengths, dtype=torch.long)[:, None]
    ids = torch.randint(1, 90, (n, seq_len), generator=g)
    for i, k in enumerate(images):
        ids[i, : min(k, lengths[i])] = PLACEHOLDER
    ids = ids * real
    labels = torch.where(real, torch.roll(ids, -1, 1), torch.full_like(ids, LABEL_PAD))
    loss_mask = (real & (labels != PLACEHOLDER)).float()
    if mrope:
        base = torch.arange(seq_len)
        pos = torch.stack([base, base // 2, base % 5])[:, None, :].repeat(1, n, 1)
        pos = pos + torch.arange(n)[None, :, None] * 1000  # distinct per sample
    else:
        pos = torch.arange(seq_len)[None, :].repeat(n, 1) + torch.arange(n)[:, None] * 1000
    return {
        "input_ids": ids,
        "labels": labels,
        "loss_mask": loss_mask,
        "attention_mask": real.long(),
        "position_ids": pos * real,
        "modality_inputs": {"images": object()},
    }


def segments(packed_row, kwargs, padded=False):
    """Split a packed ``[..., T]`` row into its per-segment real (or padded) slices."""
    cu = kwargs["cu_seqlens_q"].tolist()
    start = kwargs["cu_seqlens_q_padded"].tolist()
    out = []
    for i in range(len(cu) - 1):
        end = start[i + 1] if padded else start[i] + cu[i + 1] - cu[i]
        out.append(packed_row[..., start[i] : end])
    return out


# ------------------------------------------------------------------ layout and content


def test_real_tokens_conserved_in_sample_order():
    lengths = [5, 1, 8, 3]
    batch = make_batch(lengths, 8, images=(2, 0, 3, 1))
    packed, kw = pack_language_shard(batch)
    assert packed["input_ids"].shape == (1, sum(lengths))
    for i, (ids, lab, lm) in enumerate(
        zip(
            segments(packed["input_ids"][0], kw),
            segments(packed["labels"][0], kw),
            segments(packed["loss_mask"][0], kw),
        )
    ):
        n = lengths[i]
        assert torch.equal(ids, batch["input_ids"][i, :n])
        assert torch.equal(lab, batch["labels"][i, :n])
        assert torch.equal(lm, batch["loss_mask"][i, :n])
    # placeholders keep their row-major order: the splice pairs the same encoder rows
    want = torch.cat([batch["input_ids"][i, :n] for i, n in enumerate(lengths)])
    assert torch.equal(packed["input_ids"][0], want)
    assert (packed["input_ids"] == PLACEHOLDER).sum() == (batch["input_ids"] == PLACEHOLDER).sum()


def test_cu_seqlens_and_max_seqlen():
    packed, kw = pack_language_shard(make_batch([3, 2, 4], 6))
    for key in ("cu_seqlens_q", "cu_seqlens_kv", "cu_seqlens_q_padded", "cu_seqlens_kv_padded"):
        assert kw[key].dtype == torch.int32
        assert kw[key].tolist() == [0, 3, 5, 9]
    assert kw["max_seqlen_q"] == kw["max_seqlen_kv"] == 4
    assert isinstance(kw["max_seqlen_q"], int)
    assert kw["pad_between_seqs"] is False
    assert packed["attention_mask"] is None


def test_pad_multiple_pads_each_segment():
    lengths = [3, 2, 4, 1]
    batch = make_batch(lengths, 6)
    packed, kw = pack_language_shard(batch, pad_multiple=4, pad_token_id=7)
    assert kw["cu_seqlens_q"].tolist() == [0, 3, 5, 9, 10]
    assert kw["cu_seqlens_q_padded"].tolist() == [0, 4, 8, 12, 16]
    assert kw["max_seqlen_q"] == 4
    assert kw["pad_between_seqs"] is True
    assert packed["input_ids"].shape == (1, 16)
    for i, (ids, lab, lm, pos) in enumerate(
        zip(*(segments(packed[k][0], kw, padded=True)
              for k in ("input_ids", "labels", "loss_mask", "position_ids")))
    ):
        n = lengths[i]
        assert torch.equal(ids[:n], batch["input_ids"][i, :n])
        assert (ids[n:] == 7).all() and (lab[n:] == LABEL_PAD).all()
        assert (lm[n:] == 0).all() and (pos[n:] == 0).all()


def test_tp_alignment_extends_last_segment():
    batch = make_batch([3, 2, 4], 6)
    packed, kw = pack_language_shard(batch, pad_multiple=2, tp_size=8)
    t = packed["input_ids"].size(1)
    assert t % 8 == 0 and t == 16
    assert kw["cu_seqlens_q_padded"].tolist() == [0, 4, 6, 16]  # last segment 4 -> 10
    assert kw["cu_seqlens_q"].tolist() == [0, 3, 5, 9]
    assert kw["max_seqlen_q"] == 10  # the extended last segment is the longest
    # tp padding is padding: labels ignored, no loss
    assert (packed["labels"][0, 10:] == LABEL_PAD).all()
    assert (packed["loss_mask"][0, 10:] == 0).all()


def test_tp_and_pad_multiple_keep_every_segment_a_multiple():
    # lcm(4, 6) = 12: the tp extension keeps the last segment a multiple of 4
    _, kw = pack_language_shard(make_batch([3, 2], 6), pad_multiple=4, tp_size=6)
    cu = kw["cu_seqlens_q_padded"].tolist()
    assert cu == [0, 4, 12]
    assert all(c % 4 == 0 for c in cu) and cu[-1] % 6 == 0


def test_mrope_positions_are_3_1_t_and_reset_per_sample():
    lengths = [4, 2, 3]
    batch = make_batch(lengths, 5, mrope=True)
    packed, kw = pack_language_shard(batch, pad_multiple=2)
    pos = packed["position_ids"]
    assert pos.shape == (3, 1, packed["input_ids"].size(1))
    for i, seg in enumerate(segments(pos[:, 0, :], kw)):
        assert torch.equal(seg, batch["position_ids"][:, i, : lengths[i]])


def test_positions_taken_from_each_sample_or_generated():
    lengths = [4, 2, 3]
    batch = make_batch(lengths, 5)
    packed, kw = pack_language_shard(batch)
    for i, seg in enumerate(segments(packed["position_ids"][0], kw)):
        assert torch.equal(seg, batch["position_ids"][i, : lengths[i]])
    del batch["position_ids"]
    packed, kw = pack_language_shard(batch, pad_multiple=4)
    assert packed["position_ids"].tolist() == [[0, 1, 2, 3, 0, 1, 0, 0, 0, 1, 2, 0]]


def test_non_first_stages_pack_to_the_same_t():
    lengths = [7, 3, 5, 1]
    batch = make_batch(lengths, 8)
    first, kw_first = pack_language_shard(batch, pad_multiple=4, tp_size=2)
    middle = {"input_ids": None, "labels": None, "loss_mask": None,
              "position_ids": batch["position_ids"], "attention_mask": batch["attention_mask"],
              "modality_inputs": None}
    last = dict(middle, labels=batch["labels"], loss_mask=batch["loss_mask"])
    t = first["input_ids"].size(1)
    for stage in (middle, last):
        packed, kw = pack_language_shard(stage, pad_multiple=4, tp_size=2, is_first_stage=False)
        assert packed["input_ids"] is None
        assert packed["position_ids"].size(-1) == t
        assert {k: (v.tolist() if torch.is_tensor(v) else v) for k, v in kw.items()} == {
            k: (v.tolist() if torch.is_tensor(v) else v) for k, v in kw_first.items()
        }
    packed, _ = pack_language_shard(last, pad_multiple=4, tp_size=2, is_first_stage=False)
    assert torch.equal(packed["labels"], first["labels"])
    assert torch.equal(packed["loss_mask"], first["loss_mask"])


def test_reordering_then_packing_permutes_segments():
    lengths = [5, 2, 7, 4, 1]
    batch = make_batch(lengths, 8, mrope=True)
    perm = [3, 0, 4, 2, 1]
    permuted = {k: (v[:, perm] if k == "position_ids" else v[perm]) if torch.is_tensor(v) else v
                for k, v in batch.items()}
    packed, kw = pack_language_shard(batch, pad_multiple=2)
    packed_p, kw_p = pack_language_shard(permuted, pad_multiple=2)
    for key in ("input_ids", "labels", "loss_mask", "position_ids"):
        segs, segs_p = segments(packed[key], kw), segments(packed_p[key], kw_p)
        for j, i in enumerate(perm):
            assert torch.equal(segs_p[j], segs[i])


def test_other_keys_pass_through_and_input_untouched():
    batch = make_batch([3, 1], 4)
    before = {k: v.clone() for k, v in batch.items() if torch.is_tensor(v)}
    extra = object()
    batch["extra"] = extra
    packed, _ = pack_language_shard(batch, pad_multiple=2)
    assert packed["modality_inputs"] is batch["modality_inputs"]
    assert packed["extra"] is extra
    assert packed is not batch
    for k, v in before.items():
        assert torch.equal(batch[k], v)


def test_empty_samples_get_no_segment():
    batch = make_batch([3, 0, 2], 4)
    packed, kw = pack_language_shard(batch, pad_multiple=2)
    assert kw["cu_seqlens_q"].tolist() == [0, 3, 5]
    assert kw["cu_seqlens_q_padded"].tolist() == [0, 4, 6]
    assert pack_layout([3, 0, 2], 4, pad_multiple=2).segment_samples == (0, 2)


def test_explicit_lengths_win_over_the_mask():
    batch = make_batch([4, 4], 4)
    batch["attention_mask"] = torch.ones(2, 4, dtype=torch.long)  # Bridge 0.6.2's dataset: all ones
    packed, kw = pack_language_shard(batch, [3, 2])
    assert kw["cu_seqlens_q"].tolist() == [0, 3, 5]
    packed2, _ = pack_language_shard(batch, torch.tensor([3, 2]))
    assert torch.equal(packed["input_ids"], packed2["input_ids"])
    # no mask needed at all with explicit lengths
    del batch["attention_mask"]
    assert pack_language_shard(batch, [1, 1])[0]["input_ids"].shape == (1, 2)


def test_stats():
    batch = make_batch([3, 2, 4, 1], 8)
    _, _, stats = pack_language_shard(batch, pad_multiple=4, return_stats=True)
    assert stats == PackingStats(num_samples=4, tokens_before=32, real_tokens=10, tokens_after=16)
    assert stats.alignment_padding == 6
    assert stats.padding_fraction_before == pytest.approx(22 / 32)
    assert stats.padding_fraction_after == pytest.approx(6 / 16)
    assert stats.tokens_saved_fraction == pytest.approx(0.5)


def test_tensors_stay_on_the_batch_device_and_dtype():
    batch = make_batch([3, 2], 4)
    batch["loss_mask"] = batch["loss_mask"].to(torch.bfloat16)
    packed, kw = pack_language_shard(batch, pad_multiple=4)
    assert packed["loss_mask"].dtype == torch.bfloat16
    assert packed["input_ids"].dtype == batch["input_ids"].dtype
    assert kw["cu_seqlens_q"].device == batch["input_ids"].device


# ------------------------------------------------------------------ bad input


def _bad(**changes):
    batch = make_batch([3, 2], 4)
    batch.update(changes)
    return batch


@pytest.mark.parametrize(
    "batch, kwargs, error, match",
    [
        (_bad(attention_mask=None), {}, ValueError, r"needs batch\['attention_mask'\].*lengths="),
        (_bad(attention_mask=torch.ones(2, 4, 1)), {}, ValueError, "2-D"),
        (_bad(attention_mask=torch.ones(3, 4)), {}, ValueError, "batch size 3 .* 2"),
        (_bad(attention_mask=torch.ones(2, 5)), {}, ValueError, "width 5 .* width 4"),
        (_bad(attention_mask=torch.ones(2, 3)), {}, ValueError, "width 3 .* width 4"),
        (_bad(attention_mask=torch.tensor([[0, 1, 1, 1], [1, 1, 0, 0]])), {}, ValueError,
         r"rows \[0\].*left padding and holes are unsupported"),
        (_bad(attention_mask=torch.tensor([[1, 1, 0, 0], [1, 0, 1, 0]])), {}, ValueError,
         r"rows \[1\].*holes"),
        (_bad(attention_mask=torch.zeros(2, 4)), {}, ValueError,
         "empty language shard: all 2 samples have length 0.*attention_mask"),
        (_bad(), {"lengths": [0, 0]}, ValueError, "empty language shard"),
        (_bad(), {"lengths": [3]}, ValueError, "1 lengths for a shard of 2"),
        (_bad(), {"lengths": [3, 5]}, ValueError, r"lengths\[1\] = 5 is outside \[0, 4\]"),
        (_bad(), {"lengths": [3, -1]}, ValueError, "outside"),
        (_bad(), {"lengths": torch.tensor([[3, 2]])}, ValueError, "1-D integer"),
        (_bad(), {"lengths": [2.5, 1]}, ValueError, "integers"),
        (_bad(), {"pad_multiple": 0}, ValueError, "pad_multiple must be a positive int"),
        (_bad(), {"tp_size": 2.0}, ValueError, "tp_size must be a positive int"),
        (_bad(input_ids=None), {}, ValueError,
         "first language pipeline stage needs.*is_first_stage=False"),
        (_bad(labels=torch.zeros(2, 5, dtype=torch.long)), {}, ValueError, "must agree"),
        (_bad(position_ids=torch.zeros(4, 2, 4, dtype=torch.long)), {}, ValueError,
         r"MRoPE \[3, B, S\]"),
        (_bad(loss_mask=torch.zeros(2, 4, 1)), {}, ValueError, r"must be \[B, S\]"),
        (_bad(labels=[[1, 2, 3, 4]]), {}, TypeError, "torch.Tensor or None"),
    ],
)
def test_bad_input_raises_with_a_clear_message(batch, kwargs, error, match):
    with pytest.raises(error, match=match):
        pack_language_shard(batch, **kwargs)


def test_bad_argument_types():
    with pytest.raises(TypeError, match="batch must be a dict"):
        pack_language_shard([torch.ones(2, 3)])
    with pytest.raises(TypeError, match="pad_token_id must be an int"):
        pack_language_shard(make_batch([3, 2], 4), pad_token_id=0.0)


def test_a_stage_with_only_the_mask_still_gets_kwargs_and_positions():
    mask = make_batch([3, 1], 4)["attention_mask"]
    packed, kw, stats = pack_language_shard(
        {"attention_mask": mask}, is_first_stage=False, pad_multiple=2, return_stats=True
    )
    assert kw["cu_seqlens_q_padded"].tolist() == [0, 4, 6]
    assert packed["position_ids"].tolist() == [[0, 1, 2, 0, 0, 0]]
    assert stats.tokens_before == 8
    # explicit lengths with nothing but the mask: S still comes from the mask
    _, _, stats = pack_language_shard(
        {"attention_mask": mask}, [3, 1], is_first_stage=False, return_stats=True
    )
    assert stats.tokens_before == 8


# ------------------------------------------------------------------ properties


@st.composite
def shards(draw):
    seq_len = draw(st.integers(1, 24))
    lengths = draw(st.lists(st.integers(0, seq_len), min_size=1, max_size=6))
    if not any(lengths):
        lengths[draw(st.integers(0, len(lengths) - 1))] = draw(st.integers(1, seq_len))
    return lengths, seq_len


@settings(max_examples=examples(150), deadline=None)
@given(
    shard=shards(),
    k=st.integers(1, 8),
    tp=st.integers(1, 6),
    mrope=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_packing_properties(shard, k, tp, mrope, seed):
    lengths, seq_len = shard
    batch = make_batch(lengths, seq_len, mrope=mrope, seed=seed)
    packed, kw, stats = pack_language_shard(batch, pad_multiple=k, tp_size=tp, return_stats=True)
    cu, cu_pad = kw["cu_seqlens_q"].tolist(), kw["cu_seqlens_q_padded"].tolist()
    nonempty = [n for n in lengths if n]
    t = packed["input_ids"].size(1)

    assert cu == [0, *itertools.accumulate(nonempty)]
    assert cu_pad[0] == 0 and cu_pad[-1] == t
    assert all(c % k == 0 for c in cu_pad) and t % math.lcm(k, tp) == 0
    widths = [b - a for a, b in zip(cu_pad, cu_pad[1:])]
    assert all(w >= n for w, n in zip(widths, nonempty))
    assert all(w - n < k for w, n in zip(widths[:-1], nonempty[:-1]))  # no gratuitous padding
    assert kw["max_seqlen_q"] == kw["max_seqlen_kv"] == max(widths)
    assert kw["pad_between_seqs"] == (cu[:-1] != cu_pad[:-1])
    assert stats.real_tokens == sum(lengths) and stats.tokens_after == t
    assert stats.tokens_before == len(lengths) * seq_len
    assert t - sum(lengths) < len(nonempty) * k + math.lcm(k, tp)

    # real tokens conserved, in order, with their labels/loss_mask/positions
    real_rows = [i for i, n in enumerate(lengths) if n]
    for key in ("input_ids", "labels", "loss_mask", "position_ids"):
        src = batch[key]
        for seg, i in zip(segments(packed[key], kw), real_rows):
            want = src[:, i, : lengths[i]] if src.dim() == 3 else src[i, : lengths[i]]
            assert torch.equal(seg.reshape(want.shape), want)
    # everything else is padding
    is_real = torch.zeros(t, dtype=torch.bool)
    for a, b, c in zip(cu_pad, cu, cu[1:]):
        is_real[a : a + c - b] = True
    assert (packed["labels"][0, ~is_real] == LABEL_PAD).all()
    assert (packed["loss_mask"][0, ~is_real] == 0).all()
    assert (packed["input_ids"][0, ~is_real] == 0).all()
    assert packed["position_ids"].shape == ((3, 1, t) if mrope else (1, t))

    # later pipeline stages agree on T and on the kwargs
    later = dict(batch, input_ids=None)
    packed_l, kw_l = pack_language_shard(later, pad_multiple=k, tp_size=tp, is_first_stage=False)
    assert kw_l["cu_seqlens_q_padded"].tolist() == cu_pad
    assert torch.equal(packed_l["labels"], packed["labels"])


@settings(max_examples=examples(100), deadline=None)
@given(shard=shards(), k=st.integers(1, 8), tp=st.integers(1, 6), data=st.data())
def test_packing_commutes_with_sample_permutation(shard, k, tp, data):
    lengths, seq_len = shard
    perm = data.draw(st.permutations(range(len(lengths))))
    batch = make_batch(lengths, seq_len)
    packed, kw = pack_language_shard(batch, pad_multiple=k, tp_size=tp)
    permuted = {key: v[list(perm)] if torch.is_tensor(v) else v for key, v in batch.items()}
    packed_p, kw_p = pack_language_shard(permuted, pad_multiple=k, tp_size=tp)
    real = [i for i, n in enumerate(lengths) if n]
    seg_of = {i: s for s, i in enumerate(real)}
    segs, segs_p = segments(packed["input_ids"][0], kw), segments(packed_p["input_ids"][0], kw_p)
    assert [s.tolist() for s in segs_p] == [segs[seg_of[i]].tolist() for i in perm if lengths[i]]


# ------------------------------------------------------------------ real megatron-core


def _import_megatron():
    # megatron declares Python >= 3.12; on 3.11 it needs typing.override back-ported
    if not hasattr(typing, "override"):
        import typing_extensions

        typing.override = typing_extensions.override
    import megatron.core.packed_seq_params as psp  # required: the suite fails loudly without megatron

    return psp


def test_packed_seq_params_accepts_the_kwargs():
    psp_mod = _import_megatron()
    batch = make_batch([3, 2, 4], 6)
    for k, tp in ((1, 1), (4, 2)):
        _, kw = pack_language_shard(batch, pad_multiple=k, tp_size=tp)
        params = psp_mod.PackedSeqParams(qkv_format="thd", **thd_kwargs(kw))
        assert params.cu_seqlens_q_padded is kw["cu_seqlens_q_padded"]
        assert params.max_seqlen_q == kw["max_seqlen_q"]


def test_mimo_model_builds_thd_params_from_the_kwargs():
    _import_megatron()
    import megatron.core.models.mimo.model.base as base
    _, kw = pack_language_shard(make_batch([3, 2, 4], 6), pad_multiple=2)
    # _build_packed_seq_params does not touch self; it is what MimoModel.forward runs
    params = base.MimoModel._build_packed_seq_params(None, thd_kwargs(kw))
    assert params.qkv_format == "thd"
    assert params.cu_seqlens_q_padded.tolist() == [0, 4, 6, 10]


@pytest.fixture
def megatron_cpu(monkeypatch, tmp_path):
    """A 1-rank gloo world with megatron model parallelism on CPU.

    Redirects (CPU only; none are needed on a GPU):
    - ``torch.cuda.current_device`` -> ``cpu`` (RoPE ``inv_freq``, the global memory buffer);
    - the RNG tracker -> megatron's inference tracker, whose ``fork()`` is a no-op
      (``model_parallel_cuda_manual_seed`` calls ``torch.cuda.manual_seed``); dropout is 0.
    """
    _import_megatron()
    import torch.distributed as dist
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import random as mrandom

    monkeypatch.setattr(torch.cuda, "current_device", lambda: torch.device("cpu"))
    monkeypatch.setattr(mrandom, "_CUDA_RNG_STATE_TRACKER", mrandom._CUDA_RNG_STATE_TRACKER)
    monkeypatch.setattr(
        mrandom, "_CUDA_RNG_STATE_TRACKER_INITIALIZED", mrandom._CUDA_RNG_STATE_TRACKER_INITIALIZED
    )
    mrandom.initialize_rng_tracker(inference_rng_tracker=True, force_reset=True)
    own_world = not dist.is_initialized()
    if own_world:
        dist.init_process_group(
            "gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1
        )
    elif dist.get_world_size() != 1:
        pytest.fail("the packed-GPT test needs a 1-rank world, but this process already joined a larger one")
    own_mp = not parallel_state.model_parallel_is_initialized()
    if own_mp:
        parallel_state.initialize_model_parallel()
    elif parallel_state.get_tensor_model_parallel_world_size() != 1:
        pytest.fail("the packed-GPT test needs tensor parallel size 1, but model parallel is already set up")
    try:
        yield
    finally:
        if own_mp:
            parallel_state.destroy_model_parallel()
        if own_world:
            dist.destroy_process_group()


def _segmented_core_attention():
    """The packed-THD local attention the CPU stack uses (mimo_accel_dev.rehearse.stack.packed_local_attention)."""
    from mimo_accel_dev.rehearse.stack import packed_local_attention

    def causal(n):
        return torch.triu(torch.ones(n, n, dtype=torch.bool), 1)[None, None]

    return packed_local_attention(), causal


@pytest.mark.distributed  # in-process 1-rank gloo world running real megatron-core
@pytest.mark.parametrize("position_embedding", ["rope", "learned_absolute", "mrope"])
def test_real_gpt_model_packed_loss_matches_unpacked(megatron_cpu, position_embedding):
    """A real tiny megatron-core GPTModel on CPU: per-token loss and gradients on the packed
    shard equal those on the padded shard, for every alignment; a pack that lets samples
    attend to each other does not (the check is sensitive)."""
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.packed_seq_params import PackedSeqParams
    from megatron.core.transformer.transformer_config import TransformerConfig

    attention_cls, causal = _segmented_core_attention()
    torch.manual_seed(0)
    extra = {"mrope_section": [2, 1, 1]} if position_embedding == "mrope" else {}
    config = TransformerConfig(
        num_layers=2, hidden_size=32, num_attention_heads=4, num_query_groups=2,
        use_cpu_initialization=True, init_method_std=0.3, hidden_dropout=0.0,
        attention_dropout=0.0, **extra,
    )
    spec = get_gpt_layer_local_spec()
    spec.submodules.self_attention.submodules.core_attention = attention_cls
    seq_len = 16
    model = GPTModel(config=config, transformer_layer_spec=spec, vocab_size=100,
                     max_sequence_length=seq_len, position_embedding_type=position_embedding,
                     rotary_base=100)
    lengths = [5, 15, 1, 9]  # k=4 pads 15 -> 16: max_seqlen > longest real sample
    batch = make_batch(lengths, seq_len, mrope=position_embedding == "mrope", images=(3, 0, 1, 4))
    batch["position_ids"] = batch["position_ids"] % 1000  # per-sample positions from 0
    real = batch["attention_mask"].bool()

    def run(packed_batch=None, packing_kwargs=None):
        model.zero_grad()
        b = packed_batch or batch
        params = None
        if packing_kwargs is not None:
            params = PackedSeqParams(qkv_format="thd", **thd_kwargs(packing_kwargs))
        loss = model(b["input_ids"], b["position_ids"], None if params else causal(seq_len),
                     labels=b["labels"], packed_seq_params=params)
        (loss * b["loss_mask"]).sum().backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        return loss.detach(), grads

    ref_loss, ref_grads = run()
    for k, tp in ((1, 1), (4, 1), (2, 3)):
        packed, kw = pack_language_shard(batch, pad_multiple=k, tp_size=tp)
        loss, grads = run(packed, kw)
        assert loss.shape == packed["input_ids"].shape
        got = torch.cat(segments(loss[0], kw))
        torch.testing.assert_close(got, ref_loss[real], rtol=1e-5, atol=1e-5)
        assert grads.keys() == ref_grads.keys()
        for name in ref_grads:
            torch.testing.assert_close(grads[name], ref_grads[name], rtol=1e-4, atol=1e-5)

    # sensitivity: one segment for the whole pack (cross-sample attention) changes the loss
    packed, kw = pack_language_shard(batch)
    t = packed["input_ids"].size(1)
    whole = torch.tensor([0, t], dtype=torch.int32)
    leaky = dict(kw, cu_seqlens_q=whole, cu_seqlens_kv=whole, cu_seqlens_q_padded=whole,
                 cu_seqlens_kv_padded=whole, max_seqlen_q=t, max_seqlen_kv=t,
                 pad_between_seqs=False)
    loss, _ = run(packed, leaky)
    assert not torch.allclose(loss[0, lengths[0]:], ref_loss[real][lengths[0]:], atol=1e-3)
