"""The per-module memory model (mimo_accel.costs.memory): hand-worked cases, and Megatron-Bridge's own
estimate computed by hand from its source for the same config."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests._hypothesis import examples

from mimo_accel.costs.flops import FlopsShape
from mimo_accel.costs.memory import (GIB, Footprint, ParameterCount, activation_bytes_per_token, bytes_per_parameter,
                                     encoder_memory, fits, language_memory, parameter_count)


def test_bytes_per_parameter_is_bridges():
    assert bytes_per_parameter(1) == 18.0 and bytes_per_parameter(4) == 9.0  # 6 + 12/dp
    assert bytes_per_parameter(4, distributed_optimizer=False) == 18.0
    assert bytes_per_parameter(8, trained=False) == 2.0  # a frozen module's bf16 weights


def test_a_hand_worked_language_model():
    # 2 layers of 4h² + 2·h·F (no gate), h 8, F 16, vocab 10: worked out on paper
    shape = FlopsShape(layers=2, hidden=8, ffn_hidden=16, heads=2, query_groups=2, kv_channels=4, vocab=10)
    p = parameter_count(shape)
    # per layer: Q,K,V,O 4·8·8 = 256, norms 4·8 = 32, MLP 2·8·16 = 256 -> 544; final norm 16; embeddings 80 each
    assert p == ParameterCount(layers=1088.0, embedding=80.0, output=80.0, other=16.0)
    f = language_memory(p, layers=2, hidden=8, ffn_hidden=16, vocab=10, tp=2, pp=1, dp=2, tokens=3, micro_batches=4)
    # states: (1088 + 80 + 80 + 16) / 2 = 632 params, at 6 + 12/2 = 12 bytes
    assert f.states == 632 * 12
    # activations: 3 tokens · 8·(18 + 4·2) per layer · 2 layers + 8·3 + 3·8, one micro-batch (pp 1),
    # plus the output layer 4·3·8·(1 + 10/8), all over tp 2
    per_mb = 3 * 8 * 26 * 2 + 24 + 24
    assert f.activations == pytest.approx((per_mb + 4 * 3 * 8 * (1 + 10 / 8)) / 2)
    # pp 2: half the layers and one embedding per stage, two micro-batches in flight, no output term
    g = language_memory(p, layers=2, hidden=8, ffn_hidden=16, vocab=10, tp=1, pp=2, dp=1, tokens=3, micro_batches=4)
    assert g.states == (1088 / 2 + 80 + 16 / 2) * 18
    assert g.activations == pytest.approx((3 * 8 * 26 * 1 + 24 + 24) * 2)
    assert g.total == g.states + g.activations and g.gib == g.total / GIB


def test_an_encoder_holds_the_micro_batches_in_flight_before_the_language_model():
    shape = FlopsShape(layers=3, hidden=16, ffn_hidden=64, heads=4, query_groups=4, kv_channels=4, causal=False,
                       merge=2, out_hidden=32)
    p = parameter_count(shape, encoder=True)
    assert p.embedding == p.output == 0
    assert p.other == 2 * 16 + (16 * 4) ** 2 + 16 * 4 * 32  # final norm + the merger's two projections
    # the encoder is the stage before the language model's 2 stages: 3 micro-batches in flight (of W 8)
    f = encoder_memory(p, layers=3, hidden=16, ffn_hidden=64, tp=1, dp=1, rows=100, micro_batches=8, stages_after=2)
    assert f.activations == 100 * activation_bytes_per_token(16, 64) * 3 * 3
    assert encoder_memory(p, layers=3, hidden=16, ffn_hidden=64, tp=1, dp=1, rows=100, micro_batches=2,
                          stages_after=2).activations == f.activations * 2 / 3  # W 2: two at most
    frozen = encoder_memory(p, layers=3, hidden=16, ffn_hidden=64, tp=2, dp=1, rows=100, micro_batches=8,
                            stages_after=2, trained=False)
    assert frozen == Footprint(p.total / 2 * 2.0, 0.0)


def _bridge_estimate(*, L, h, F, n, g, kv, V, tp, pp, dp, seq, mbs, W, distributed=True):
    """Megatron-Bridge's estimate_training_memory, by hand from its source
    (src/megatron/bridge/training/utils/theoretical_memory_utils.py): _count_parameters,
    _dense_parameters_on_most_loaded_shard (no uneven stages), _embedding_parameters_on_most_loaded_shard
    (untied), _bytes_per_parameter over DP·CP (CP 1), _compute_activation_memory_bytes (no virtual PP),
    SwiGLU with silu (factor 3), a vocabulary already a multiple of 128·tp (no padding)."""
    q = kv * n
    attention = 2 * h * h * ((1 + g / n) * (q / h))
    dense = L * (attention + 4 * h + 3 * h * F) + 2 * h
    embedding = h * V
    per_gpu = dense / (pp * tp) + embedding / tp + (embedding / tp if pp == 1 else 0.0)
    weights = per_gpu * ((6 + 12 / dp) if distributed else 18)
    act = seq * mbs * h * (18 + 4 * (F / h)) * L
    act += 8 * seq * mbs * pp
    act += seq * mbs * h * pp
    if pp > 1:
        act *= min(1, W / pp)
    else:
        act += seq * mbs * h * 4 * (1 + V / h)
    return weights, act / tp


@pytest.mark.parametrize("tp, pp, dp, W, distributed", [(2, 2, 4, 8, True), (4, 1, 2, 4, True), (1, 4, 1, 2, False),
                                                        (2, 8, 2, 16, True)])
def test_the_language_model_matches_megatron_bridges_estimate(tp, pp, dp, W, distributed):
    cfg = dict(L=32, h=4096, F=11008, n=32, g=8, kv=128, V=32768)
    shape = FlopsShape(layers=32, hidden=4096, ffn_hidden=11008, heads=32, query_groups=8, kv_channels=128,
                       gated=True, vocab=32768)
    ours = language_memory(parameter_count(shape), layers=32, hidden=4096, ffn_hidden=11008, vocab=32768, tp=tp, pp=pp,
                           dp=dp, tokens=4096, micro_batches=W, distributed_optimizer=distributed)
    weights, acts = _bridge_estimate(**cfg, tp=tp, pp=pp, dp=dp, seq=4096, mbs=1, W=W, distributed=distributed)
    assert ours.states == pytest.approx(weights, rel=1e-12)
    assert ours.activations == pytest.approx(acts, rel=1e-12)


@settings(max_examples=examples(200), deadline=None)
@given(tp=st.sampled_from([1, 2, 4, 8]), pp=st.sampled_from([1, 2, 4]), dp=st.integers(1, 16),
       tokens=st.integers(1, 1 << 14), w=st.integers(1, 32))
def test_more_parallelism_never_needs_more_memory(tp, pp, dp, tokens, w):
    shape = FlopsShape(layers=8, hidden=1024, ffn_hidden=4096, heads=16, query_groups=8, kv_channels=64, vocab=1 << 15)
    p = parameter_count(shape)

    def mem(**change):
        args = dict(layers=8, hidden=1024, ffn_hidden=4096, vocab=1 << 15, tp=tp, pp=pp, dp=dp, tokens=tokens,
                    micro_batches=w)
        args.update(change)
        return language_memory(p, **args)

    base = mem()
    assert mem(tp=2 * tp).total <= base.total
    assert mem(dp=2 * dp).states <= base.states and mem(dp=2 * dp).activations == base.activations
    assert mem(tokens=2 * tokens).activations >= base.activations
    assert fits(base, math.inf, 0.1) and not fits(base, base.total / GIB * 0.99, 0.0)
