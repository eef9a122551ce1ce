"""The per-module memory model (mimo_accel.tools.layout.memory) as the job is configured: hand-worked
cases, Megatron-Bridge's own estimate computed by hand from its source for the same config (where it
has the terms: sequence parallelism on), the stages, the 27B preset under the launcher's defaults,
and an encoder's heaviest micro-batch from the data, whatever the draws."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests._hypothesis import examples

from mimo_accel.costs.flops import FlopsShape
from mimo_accel.modules import LANGUAGE, module
from mimo_accel.tools.layout import DataRequest, MachineRequest, Request, build
from mimo_accel.tools.layout.memory import GIB, JobSettings, Memory, ParameterCount, bytes_per_parameter, parameter_count
from mimo_accel.tools.layout.models import ModelSpec, ModuleModel
from mimo_accel.tools.layout.spec import stage_layers

SP = JobSettings(sequence_parallel=True, recompute="selective")  # what Bridge's estimate assumes
UNBOUNDED = SimpleNamespace(memory_gib=math.inf, reserve=0.0)


def _model(language: FlopsShape, encoder: FlopsShape | None = None, *, linear=(0, 0.0)) -> ModelSpec:
    enc = encoder or FlopsShape(layers=1, hidden=8, ffn_hidden=8, heads=2, query_groups=2, kv_channels=4,
                                causal=False, merge=2, out_hidden=8)
    lang = ModuleModel.from_shape(LANGUAGE, language)
    lang = ModuleModel(**{**lang.__dict__, "linear_layers": linear[0], "linear_bytes": linear[1]})
    return ModelSpec("m", {"vision": ModuleModel.from_shape("vision", enc), LANGUAGE: lang})


def _lang(tp: int, pp: int, dp: int):
    return module(LANGUAGE, dp, tp=tp, pp=pp)


def _memory(model: ModelSpec, seq: int, job: JobSettings = SP, rows: float = 0.0) -> Memory:
    return Memory(model, job, UNBOUNDED, seq, lambda m, k: rows * k)


def test_bytes_per_parameter_is_bridges():
    assert bytes_per_parameter(1) == 18.0 and bytes_per_parameter(4) == 9.0  # 6 + 12/dp
    assert bytes_per_parameter(4, distributed_optimizer=False) == 18.0
    assert bytes_per_parameter(8, trained=False) == 2.0  # a frozen module's bf16 weights
    assert bytes_per_parameter(4, precision="fp32") == 10.0 and bytes_per_parameter(4, trained=False,
                                                                                    precision="fp32") == 4.0


HAND = FlopsShape(layers=2, hidden=8, ffn_hidden=16, heads=2, query_groups=2, kv_channels=4, vocab=10)
HAND_ATTENTION = 2 * (8 + 2 * 8) + 2 * 8 + 4 * 2 + 8 * 4
LAYER = 8 * 8 + 16 + HAND_ATTENTION + 4 * 16  # bytes a token with sequence parallelism (over tp)


def test_a_hand_worked_language_model():
    # 2 layers of 4h² + 2·h·F (no gate), h 8, F 16, vocab 10: worked out on paper
    p = parameter_count(HAND)
    # per layer: Q,K,V,O 4·8·8 = 256, norms 4·8 = 32, MLP 2·8·16 = 256 -> 544; final norm 16; embeddings 80 each
    assert p == ParameterCount(layers=1088.0, embedding=80.0, output=80.0, other=16.0)
    mem = _memory(_model(HAND), seq=3)
    f = mem.language(_lang(2, 1, 2), 2, 4, (2,))  # tp 2, pp 1, dp 2, a local micro-batch of 3 tokens
    # states: (1088 + 80 + 80 + 16) / 2 = 632 params, at 6 + 12/2 = 12 bytes
    assert f.states == 632 * 12
    # activations: 3 tokens · 248 per layer · 2 layers + 8·3 + 3·8, one micro-batch (pp 1), plus the
    # output layer 4·3·8·(1 + 10/8), all over tp 2; a layer: its norms 8·8 + 16, attention
    # 2·(8 + 2·8) + 2·8 + 4·2 + 8·4 (flash's q, k, v, output, log-sum-exp; the rotary tables), the
    # MLP 4·16 (GeLU)
    assert (LAYER, HAND_ATTENTION) == (248, 104)
    per_mb = 3 * LAYER * 2 + 24 + 24
    assert f.activations == pytest.approx((per_mb + 4 * 3 * 8 * (1 + 10 / 8)) / 2)
    # pp 2: a layer a stage, the embedding on the first, two micro-batches in flight there
    g = mem.language(_lang(1, 2, 1), 1, 4, (1, 1))
    assert g.stage == 0 and g.states == (1088 / 2 + 80 + 16 / 2) * 18
    assert g.activations == pytest.approx((3 * LAYER * 1 + 24 + 24) * 2)
    assert g.total == g.states + g.activations and g.gib == g.total / GIB


def test_without_sequence_parallelism_tp_leaves_the_norms_and_masks_whole():
    """Without sequence parallelism the two norms' inputs and outputs (the column-parallel
    projections' inputs) and their statistics, 8h + 16 bytes a token, are whole on every TP rank
    (Korthikanti et al., Table 2); so is the embedding's 8 + h; the logits are split (a
    vocabulary-parallel output layer)."""
    mem = _memory(_model(HAND), seq=3, job=JobSettings())
    f = mem.language(_lang(2, 1, 2), 2, 4, (2,))
    layer = 8 * 8 + 16 + (HAND_ATTENTION + 4 * 16) / 2  # 164 bytes a token
    assert f.activations == pytest.approx(3 * (2 * layer + 8 + 8) + 4 * 3 * 8 + 4 * 3 * 10 / 2)
    assert f.unsplit == pytest.approx(3 * (2 * 80 + 8 + 8)) and f.logits == pytest.approx(4 * 3 * 8 + 4 * 3 * 10 / 2)
    full = _memory(_model(HAND), seq=3, job=JobSettings(recompute="full")).language(_lang(2, 1, 2), 2, 4, (2,))
    # full recompute: each layer's input (2h, whole without SP) and one layer recomputed at a time
    assert full.activations == pytest.approx(3 * (2 * 2 * 8 + 8 + 8) + 3 * layer + 4 * 3 * 8 + 4 * 3 * 10 / 2)
    assert full.activations < f.activations


def test_a_linear_attention_layer_stores_its_own_bytes():
    """A Gated DeltaNet layer stores its own activations in place of attention's (the part TP
    splits): the hybrid model's 48 of 64 layers are counted so."""
    plain = _memory(_model(HAND), seq=4).language(_lang(1, 1, 1), 1, 1, (2,))
    hybrid = _memory(_model(HAND, linear=(1, 100.0)), seq=4).language(_lang(1, 1, 1), 1, 1, (2,))
    assert hybrid.activations - plain.activations == pytest.approx(4 * (100.0 - HAND_ATTENTION))


def test_the_last_stage_holds_the_logits_and_the_first_the_most_micro_batches():
    shape = FlopsShape(layers=8, hidden=64, ffn_hidden=128, heads=4, query_groups=4, kv_channels=16, vocab=100_000)
    mem = _memory(_model(shape), seq=512)
    # a huge vocabulary: the last stage's logits outweigh the first stage's extra micro-batches
    f = mem.language(_lang(1, 2, 1), 1, 8, (4, 4))
    assert f.stage == 1 and f.logits == pytest.approx(4 * 512 * 64 + 4 * 512 * 100_000)
    # fewer layers on the last stage (an uneven split) take load off it
    assert mem.language(_lang(1, 2, 1), 1, 8, (6, 2)).total < f.total


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
def test_with_sequence_parallelism_the_language_model_matches_megatron_bridges_estimate(tp, pp, dp, W, distributed):
    """The states are Bridge's estimate; the activations are Bridge's with megatron-core's own layer
    (tests/test_layout_terms.py counts it) in place of Korthikanti's 18h + 4F a token."""
    cfg = dict(L=32, h=4096, F=11008, n=32, g=8, kv=128, V=32768)
    shape = FlopsShape(layers=32, hidden=4096, ffn_hidden=11008, heads=32, query_groups=8, kv_channels=128,
                       gated=True, vocab=32768)
    job = JobSettings(sequence_parallel=True, recompute="selective", distributed_optimizer=distributed)
    model = _model(shape)
    ours = _memory(model, 4096, job).language(_lang(tp, pp, dp), dp, W, stage_layers(32, pp))
    weights, acts = _bridge_estimate(**cfg, tp=tp, pp=pp, dp=dp, seq=4096, mbs=1, W=W, distributed=distributed)
    assert ours.stage == 0 and ours.states == pytest.approx(weights, rel=1e-12)
    lang = model.modules[LANGUAGE]
    layer = 8 * 4096 + 16 + lang.attention_bytes + lang.mlp_bytes
    assert lang.mlp_bytes == 6 * 11008  # SwiGLU: fc1's 2F output and the activation's F, not 4F
    moved = 4096 * 32 * min(1, W / pp) * (layer - (18 * 4096 + 4 * 11008)) / tp
    assert ours.activations == pytest.approx(acts + moved, rel=1e-12)


def test_an_encoder_holds_the_micro_batches_in_flight_before_the_language_model():
    shape = FlopsShape(layers=3, hidden=16, ffn_hidden=64, heads=4, query_groups=4, kv_channels=4, causal=False,
                       merge=2, out_hidden=32)
    p = parameter_count(shape, encoder=True)
    assert p.embedding == p.output == 0
    assert p.other == 2 * 16 + (16 * 4) ** 2 + 16 * 4 * 32  # final norm + the merger's two projections
    mem = _memory(_model(HAND, shape), seq=3, rows=100.0)  # each sample at most 100 rows
    # the encoder is the stage before the language model's 2 stages: 3 micro-batches of 1 sample in flight (W 8)
    f = mem.encoder(module("vision", 1), 1, 8, 2)
    # a layer: its norms 8·16 + 16, attention 2·(16 + 2·16) + 2·16 + 4·4 + 8·4, the GeLU MLP 4·64
    assert f.activations == 3 * 100 * (8 * 16 + 16 + 176 + 4 * 64) * 3
    assert mem.encoder(module("vision", 1), 1, 2, 2).activations == f.activations * 2 / 3  # W 2: two at most
    model = _model(HAND, shape).with_frozen(("vision",))
    frozen = _memory(model, seq=3, rows=100.0).encoder(module("vision", 1, tp=2), 1, 8, 2)
    assert frozen.states == p.total / 2 * 2.0 and frozen.activations == 0.0


def test_no_language_model_of_8_gpus_or_fewer_fits_the_27b_preset_as_the_launcher_runs_it():
    """With upstream's launcher's settings (no sequence parallelism, no recompute: megatron-core's
    defaults) no layout's language model of 8 GPUs or fewer fits an H100 (the tutorial: "smaller
    8-GPU candidates did not fit"), and the reason names the term; with sequence parallelism on,
    tp4 pp2 dp1 fits, as Bridge's estimate (which assumes it) says."""
    for job in (JobSettings(), JobSettings(sequence_parallel=True)):
        problem = build(Request(machine=MachineRequest("h100"), settings=job, data=DataRequest(steps=1)))
        fits = {(t, p, d) for t in (1, 2, 4) for p in (1, 2, 4, 8) for d in (1, 2, 4, 8) if t * p * d <= 8
                for f in [problem.memory.language(_lang(t, p, d), d, 32 // d, stage_layers(64, p))]
                if problem.memory.why_not({LANGUAGE: f}) is None}
        assert fits == (set() if not job.sequence_parallel else {(4, 2, 1)})
    problem = build(Request(machine=MachineRequest("h100"), data=DataRequest(steps=1)))
    why = problem.memory.why_not({LANGUAGE: problem.memory.language(_lang(4, 2, 1), 1, 32, (32, 32))})
    assert "what TP splits only with sequence parallelism" in why and "over the 72.0 GiB usable" in why
    from mimo_accel.tools.layout import NoLayoutFits, Search, advise

    with pytest.raises(NoLayoutFits, match="fits 9 GPUs of H100 SXM .*the nearest.*what TP splits only with sequence "
                                           "parallelism.*give --gpus"):
        advise(problem, Search(9))


def test_an_encoders_heaviest_micro_batch_is_the_datas_whatever_the_draws():
    """The encoder's memory holds the heaviest samples the data can form (a profile's stated tail;
    every sample of a cost index), not the heaviest of the steps drawn: the same at 4 and 64 draws."""
    spec = "images=tp1,pp1,dp1 language=tp4,pp4,dp1 mbs=1 gbs=32"
    from mimo_accel.tools.layout.spec import parse_layout

    seen = []
    for steps in (4, 64):
        problem = build(Request(machine=MachineRequest("h100"), data=DataRequest("mixed_chat", steps=steps)))
        seen.append(problem.memory.of_layout(parse_layout(spec))["images"].total)
    assert seen[0] == seen[1] > 0


@settings(max_examples=examples(200), deadline=None)
@given(tp=st.sampled_from([1, 2, 4, 8]), pp=st.sampled_from([1, 2, 4]), dp=st.integers(1, 16),
       seq=st.integers(1, 1 << 14), w=st.integers(1, 32), sp=st.booleans(), recompute=st.sampled_from(
           ["none", "full"]))
def test_more_parallelism_never_needs_more_memory(tp, pp, dp, seq, w, sp, recompute):
    shape = FlopsShape(layers=8, hidden=1024, ffn_hidden=4096, heads=16, query_groups=8, kv_channels=64, vocab=1 << 15)
    mem = _memory(_model(shape), seq, JobSettings(sequence_parallel=sp, recompute=recompute))

    def at(t=tp, d=dp, s=seq):
        m = mem if s == seq else _memory(_model(shape), s, JobSettings(sequence_parallel=sp, recompute=recompute))
        return m.language(_lang(t, pp, d), d, w, stage_layers(8, pp))

    base = at()
    assert at(t=2 * tp).total <= base.total
    assert at(d=2 * dp).states <= base.states and at(d=2 * dp).activations == base.activations
    assert at(s=2 * seq).activations >= base.activations
    assert np.isfinite(base.total)
