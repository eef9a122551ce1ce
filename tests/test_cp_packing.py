"""THD packing aligned for context parallelism (CP), derived from the language grid.

megatron-core's THD path under CP splits every *padded* segment (``cu_seqlens_q_padded``) into
``2·cp`` chunks and gives CP rank r chunks r and 2·cp−1−r (Transformer Engine's
``thd_get_partitioned_indices``, called by ``MimoModel``'s partition adapter; the THD RoPE
``_apply_rotary_pos_emb_thd`` divides each padded segment by cp and halves it again). A segment
that is not a multiple of 2·cp cannot be split: mimo_accel derives the alignment from the language
grid (``StepRole.context_parallel_size``, the parallelism config at set-up) and refuses a
``pad_multiple`` that does not satisfy it, naming the value that would.

Where CP can run here: nowhere on Bridge's loop, on CPU or GPU, with megatron-core 0.19.2.
``test_bridge_loop_with_language_cp2`` tries vision dp1 → language cp2 on three gloo ranks:

- with packing on and ``pad_multiple=1``, mimo_accel refuses in ``setup_megatron_mimo``, before the
  model is built, naming ``pad_multiple=4``;
- with ``pad_multiple=4`` the refusal is megatron-core's own, in ``setup_megatron_mimo``: on the
  language ranks while building the model, ``DotProductAttention`` (the local attention, the only
  one on a machine without Transformer Engine) asserts "Context parallelism is only supported by
  TEDotProductAttention!"; on the vision rank (and on any rank that got past the model, GPU and
  Transformer Engine included) ``BridgeCommunicator.__init__`` asserts "Destination grid CP size
  must be 1, got 2" for every non-colocated layout whose language grid has CP > 1, on every
  backend (its "CP support will be added in follow up PR");
  ``test_bridge_communicator_refuses_cp`` checks that one on its own.

So the alignment is tested on the packer, against megatron-core's own THD RoPE with a CP group of
two (pure torch), and at the step.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from mimo_accel.runtime import local_batch
from mimo_accel.packing import pack_language_shard
from mimo_accel.runtime.state import Runtime
from mimo_accel.config import AccelConfig
from mimo_accel_dev.rehearse.ranks import RankFailure, run_ranks

LENGTHS = [5, 11, 3, 8]
SEQ = 16


def _batch(lengths=LENGTHS, seq=SEQ):
    real = torch.arange(seq)[None, :] < torch.tensor(lengths)[:, None]
    ids = (torch.arange(len(lengths) * seq).reshape(len(lengths), seq) % 80 + 1) * real
    return {"input_ids": ids, "labels": torch.where(real, ids, torch.full_like(ids, -100)),
            "loss_mask": real.float(), "attention_mask": real.long()}


class _CPGroup:
    """What megatron-core's THD RoPE asks of a CP group: its size and this rank's place."""

    def __init__(self, size, rank):
        self._size, self._rank = size, rank

    def size(self):
        return self._size

    def rank(self):
        return self._rank


def _cp_indices(cu_padded, cp, r):
    """Transformer Engine's ``thd_get_partitioned_indices``, in Python: CP rank r's tokens are
    chunks r and 2cp-1-r of every padded segment."""
    out = []
    for a, b in zip(cu_padded, cu_padded[1:]):
        n = b - a
        assert n % (2 * cp) == 0, f"segment [{a}, {b}) cannot be split into {2 * cp} chunks"
        c = n // (2 * cp)
        out += list(range(a + r * c, a + (r + 1) * c)) + list(range(a + (2 * cp - 1 - r) * c, a + (2 * cp - r) * c))
    return out


@pytest.mark.parametrize("pad_multiple", [1, 2, 3])
def test_the_packer_refuses_a_pad_multiple_cp_cannot_split(pad_multiple):
    fix = {1: 4, 2: 4, 3: 12}[pad_multiple]
    with pytest.raises(ValueError, match=rf"context parallelism 2, which splits every packed segment into "
                                         rf"2\*cp = 4 chunks, but pad_multiple={pad_multiple} is not a multiple "
                                         rf"of 4\. Set pad_multiple={fix} \(enable\(pad_multiple={fix}\) or "
                                         rf"MIMO_ACCEL_PAD_MULTIPLE={fix}\)"):
        pack_language_shard(_batch(), pad_multiple=pad_multiple, cp_size=2)


@pytest.mark.parametrize("cp,tp,pad_multiple", [(2, 1, 4), (2, 2, 4), (4, 1, 8), (2, 1, 12), (4, 2, 8)])
def test_cp_aligned_pack_has_the_shapes_the_thd_path_expects(cp, tp, pad_multiple):
    from megatron.core.packed_seq_params import PackedSeqParams

    sp = tp * cp  # T under CP + sequence parallelism: tp·cp (StepRole.sequence_parallel_size)
    packed, kw = pack_language_shard(_batch(), pad_multiple=pad_multiple, tp_size=sp, cp_size=cp)
    T = packed["input_ids"].size(-1)
    cu, cu_padded = kw["cu_seqlens_q"].tolist(), kw["cu_seqlens_q_padded"].tolist()
    assert cu_padded[0] == 0 and cu_padded[-1] == T and T % sp == 0 and T % (2 * cp) == 0
    assert all((b - a) % (2 * cp) == 0 for a, b in zip(cu_padded, cu_padded[1:]))
    assert all(b - a >= n for a, b, n in zip(cu_padded, cu_padded[1:], (y - x for x, y in zip(cu, cu[1:]))))
    assert kw["max_seqlen_q"] == max(b - a for a, b in zip(cu_padded, cu_padded[1:]))
    params = PackedSeqParams(qkv_format="thd", total_tokens=T, **local_batch.thd_kwargs(kw))
    assert params.seq_idx.numel() == T  # one segment index per token, no extra segment past T
    # every CP rank holds T / cp tokens, each segment contributing 2 whole chunks
    parts = [_cp_indices(cu_padded, cp, r) for r in range(cp)]
    assert all(len(p) == T // cp for p in parts) and sorted(i for p in parts for i in p) == list(range(T))


def _rope_thd(t, cu_padded, freqs, cp, r):
    from megatron.core.models.common.embeddings.rope_utils import _apply_rotary_pos_emb_thd

    return _apply_rotary_pos_emb_thd(t, torch.tensor(cu_padded, dtype=torch.int32), freqs, cp_group=_CPGroup(cp, r))


def test_megatron_cores_thd_rope_under_cp2_takes_the_aligned_pack():
    """megatron-core's THD RoPE, run as each of two CP ranks on that rank's share of the packed
    tokens, equals the single-rank RoPE of the whole pack cut the same way; an unaligned pack
    does not fit its split."""
    cp, dim = 2, 8
    packed, kw = pack_language_shard(_batch(), pad_multiple=2 * cp, cp_size=cp)
    T = packed["input_ids"].size(-1)
    cu_padded = kw["cu_seqlens_q_padded"].tolist()
    g = torch.Generator().manual_seed(0)
    t = torch.randn(T, 2, dim, generator=g)
    freqs = torch.randn(kw["max_seqlen_q"], 1, 1, dim, generator=g)
    whole = _rope_thd(t, cu_padded, freqs, 1, 0)
    for r in range(cp):
        index = torch.tensor(_cp_indices(cu_padded, cp, r))
        torch.testing.assert_close(_rope_thd(t[index], cu_padded, freqs, cp, r), whole[index])
    # the tight pack (pad_multiple=1, what cp_size now refuses) does not fit megatron-core's split:
    # its segments' shares (length // cp each) do not add up to a rank's tokens. megatron-core 0.19
    # and 2a75ac1 raise there; Megatron-LM main's vectorised THD RoPE (#5944) takes it silently,
    # so the packer's own refusal (above) is what stands between a user and wrong positions.
    _, tight = pack_language_shard(_batch(), pad_multiple=1)
    tight_cu = tight["cu_seqlens_q_padded"].tolist()
    assert sum((b - a) // cp for a, b in zip(tight_cu, tight_cu[1:])) != tight_cu[-1] // cp


def _language_model(cp: int, tp: int = 1, sequence_parallel: bool = False):
    """A MimoModel stand-in with what role_of reads: role, language grid, language config."""
    grid = SimpleNamespace(dim_names=["tp", "cp", "dp", "pp"], shape=[tp, cp, 1, 1])
    role = SimpleNamespace(has_language_module=True, is_first_stage=lambda m: True, is_last_stage=lambda m: True)
    return SimpleNamespace(role=role, mimo_config=SimpleNamespace(module_to_grid_map={"language": grid}),
                           special_token_ids={"vision": 99},
                           language_model=SimpleNamespace(config=SimpleNamespace(sequence_parallel=sequence_parallel)))


def test_the_step_derives_cp_from_the_language_grid_and_refuses_misaligned_packing():
    role = local_batch.role_of(_language_model(cp=2, tp=2, sequence_parallel=True))
    assert (role.context_parallel_size, role.sequence_parallel_size) == (2, 4)
    assert local_batch.role_of(_language_model(cp=2)).context_parallel_size == 2
    runtime = Runtime(AccelConfig(packing=True))
    with pytest.raises(ValueError, match=r"Set pad_multiple=4"):
        local_batch.pack_for_language_model(_batch(), role, 1, runtime.say_once)
    packed = local_batch.pack_for_language_model(_batch(), role, 4, runtime.say_once)
    cu_padded = packed["packing_kwargs"]["cu_seqlens_q_padded"].tolist()
    assert all((b - a) % 4 == 0 for a, b in zip(cu_padded, cu_padded[1:])) and cu_padded[-1] % 4 == 0


def _provider(language_cp: int):
    from megatron.bridge.models.megatron_mimo.megatron_mimo_config import (
        MegatronMIMOParallelismConfig,
        ModuleParallelismConfig,
    )

    from mimo_accel_dev.rehearse import stack as st
    from mimo_accel_dev.rehearse.ranks import layout_of

    provider = st.build_provider(st.StackConfig(layout=layout_of(1, 1)))
    parallelism = MegatronMIMOParallelismConfig(module_parallelisms={
        "vision": ModuleParallelismConfig(data_parallel_size=1, rank_offset=0),
        "language": ModuleParallelismConfig(context_parallel_size=language_cp, data_parallel_size=1, rank_offset=1)})
    parallelism.finalize(1 + language_cp)
    provider.megatron_mimo_parallelism_config = parallelism
    return provider


@pytest.mark.megatron
def test_set_up_refuses_cp_packing_without_the_alignment():
    """``setup_megatron_mimo`` (patched) refuses before upstream builds anything."""
    import mimo_accel

    mimo_accel.enable(packing=True)
    try:
        from megatron.bridge.training import pretrain_megatron_mimo as pretrain

        state = SimpleNamespace(cfg=SimpleNamespace(model=_provider(language_cp=2)))
        with pytest.raises(ValueError, match=r"context parallelism 2.*Set pad_multiple=4"):
            pretrain.setup_megatron_mimo(state, None)
    finally:
        mimo_accel.disable()
    from mimo_accel.runtime import preflight

    preflight.check_provider(_provider(2), Runtime(AccelConfig(packing=True, pad_multiple=4)))  # aligned: passes
    preflight.check_provider(_provider(2), Runtime(AccelConfig(sharded_reads=True)))  # no packing: nothing to align


def _bridge_loop_cp2(rank, world, features):
    import mimo_accel

    mimo_accel.enable(**features)
    try:
        from mimo_accel_dev.rehearse import bridge_script as bs

        args = bs.parse_args(["--cpu", "--train-iters", "1", "--eval-interval", "0", "--mbs", "2", "--gbs", "2"])
        cfg = bs.build_config(args, bs.build_layout(args))
        cfg.model.megatron_mimo_parallelism_config = _provider(2).megatron_mimo_parallelism_config
        cfg.model.language_model_spec.params["config"].context_parallel_size = 2
        bs.pretrain_megatron_mimo(cfg=cfg, forward_step_func=bs.megatron_mimo_forward_step,
                                  build_data_iterators_fn=bs.make_build_data_iterators(args, bs._Trace(None)))
    finally:
        mimo_accel.disable()


@pytest.mark.distributed
def test_bridge_loop_with_language_cp2():
    with pytest.raises(RankFailure, match=r"(?s)in setup_megatron_mimo.*pad_multiple=1 is not a multiple of 4\. "
                                          r"Set pad_multiple=4"):
        run_ranks(_bridge_loop_cp2, 3, dict(packing=True), deadline_s=150)
    # the language ranks stop building their attention, the vision rank at the communicator
    # (whichever fails first is reported)
    with pytest.raises(RankFailure, match="Context parallelism is only supported by TEDotProductAttention|"
                                          "Destination grid CP size must be 1, got 2"):
        run_ranks(_bridge_loop_cp2, 3, dict(packing=True, pad_multiple=4), deadline_s=150)


def _communicator_cp2(rank, world):
    import torch as th
    from megatron.bridge.models.megatron_mimo.megatron_mimo_builder import build_hypercomm_grids
    from megatron.core.pipeline_parallel.multimodule_communicator import MultiModulePipelineCommunicator

    from mimo_accel_dev.rehearse import stack as st

    grids = build_hypercomm_grids(_provider(2).megatron_mimo_parallelism_config)
    config = st._transformer_config(1, 32, 4)
    config.pipeline_dtype = th.float32
    MultiModulePipelineCommunicator(grids, {"vision": ["language"], "language": []}, config,
                                    dim_mapping={"s": 0, "b": 1, "h": 2},
                                    module_output_ndim={"vision": 2, "language": 3})


@pytest.mark.distributed
def test_bridge_communicator_refuses_cp():
    with pytest.raises(RankFailure, match="Destination grid CP size must be 1, got 2"):
        run_ranks(_communicator_cp2, 3, deadline_s=120)
