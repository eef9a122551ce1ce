"""The advisor's terms as megatron-core runs them: the loss over the vocabulary on the language model's
last stage (FLOPs mode), and the activations each layer kind keeps for its backward, counted on a
CPU forward of megatron-core's own layers (torch.autograd.graph.saved_tensors_hooks) against the
memory model."""

from __future__ import annotations

from dataclasses import replace

import pytest

from mimo_accel.modules import LANGUAGE
from mimo_accel.tools.layout import DataRequest, MachineRequest, Request, build
from mimo_accel.tools.layout.seconds import LOSS_BYTES_PER_LOGIT, FlopsSeconds
from mimo_accel.tools.layout.spec import parse_layout


def _h100():
    return build(Request(machine=MachineRequest("h100"), data=DataRequest(steps=1)))


def test_the_loss_over_the_vocabulary_is_priced_on_the_last_stage_at_the_memory_bandwidth():
    """The fused cross-entropy reads and writes LOSS_BYTES_PER_LOGIT bytes per logit of a TP rank's
    V/tp, at the GPU's HBM bandwidth: on the 27B preset's 248k vocabulary at tp4 on an H100, half a
    microsecond a token, on the last stage alone; a GPU of twice the bandwidth pays half."""
    problem = _h100()
    seconds, lang = problem.seconds, problem.model.modules[LANGUAGE]
    expected = LOSS_BYTES_PER_LOGIT * 248_320 / 4 / 3350e9
    assert seconds.loss_per_token(lang, 4) == pytest.approx(expected) and 4e-7 < expected < 6e-7
    layout = parse_layout("images=tp1,pp1,dp1 language=tp4,pp4,dp1 mbs=1 gbs=32")
    work = seconds._stage_work(seconds.layers(layout), 4)
    per_flop = seconds._per_flop(LANGUAGE, 4, True)
    assert work[-1, 1] - work[0, 1] == pytest.approx(lang.output_per_token * per_flop + expected)
    a = seconds.cost_model(layout).of(LANGUAGE).a
    faster = FlopsSeconds(problem.model, replace(problem.machine, memory_gbps=6700.0))
    assert a - faster.cost_model(layout).of(LANGUAGE).a == pytest.approx(expected / 2)
    assert "the loss at 3350 GB/s HBM" in seconds.describe() and "assumed, not measured" in seconds.describe()


# -- the activations megatron-core's layers keep, counted --------------------------------------------


@pytest.fixture(scope="module")
def megatron_cpu(tmp_path_factory):
    """A 1-rank gloo world with megatron-core's model parallelism on CPU (as tests/test_packing.py
    sets it up: ``torch.cuda.current_device`` -> cpu for the RoPE tables, megatron's inference RNG
    tracker, whose fork is a no-op; dropout is 0)."""
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import random as mrandom

    if dist.is_initialized() or parallel_state.model_parallel_is_initialized():
        pytest.fail("the saved-bytes tests need their own 1-rank world; this process already joined one")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(torch.cuda, "current_device", lambda: torch.device("cpu"))
        mp.setattr(mrandom, "_CUDA_RNG_STATE_TRACKER", mrandom._CUDA_RNG_STATE_TRACKER)
        mp.setattr(mrandom, "_CUDA_RNG_STATE_TRACKER_INITIALIZED", mrandom._CUDA_RNG_STATE_TRACKER_INITIALIZED)
        mrandom.initialize_rng_tracker(inference_rng_tracker=True, force_reset=True)
        dist.init_process_group("gloo", init_method=f"file://{tmp_path_factory.mktemp('pg') / 'pg'}", rank=0,
                                world_size=1)
        parallel_state.initialize_model_parallel()
        try:
            yield
        finally:
            parallel_state.destroy_model_parallel()
            dist.destroy_process_group()


class _FlashAttention:
    """Stands in for Transformer Engine's flash attention, which needs a GPU: flash attention keeps
    q, k and v as contiguous tensors (flash-attn's ``maybe_contiguous``), its output and the
    log-sum-exp, which torch's CPU flash kernel (``scaled_dot_product_attention``) keeps too."""

    def __new__(cls, *args, **kwargs):
        import torch

        class FlashAttention(torch.nn.Module):
            def __init__(self, config, *a, **kw):
                super().__init__()

            def forward(self, query, key, value, attention_mask, **kw):
                s, b, n, d = query.shape
                q, k, v = (t.transpose(0, 1).contiguous().transpose(1, 2) for t in (query, key, value))
                out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
                return out.transpose(1, 2).transpose(0, 1).reshape(s, b, n * d)  # a view (b = 1)

        return FlashAttention(*args, **kwargs)


def _saved_per_token(fn, params, tokens: int) -> float:
    """The bytes a forward of ``fn`` keeps for its backward, a token: every tensor autograd saves,
    by the storage it keeps alive (each storage once; the parameters' left out)."""
    import torch

    kept: dict[int, int] = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            kept[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(kept.values()) / tokens


H, HEADS, GROUPS, KV_CHANNELS, FFN, VOCAB, SEQ = 128, 4, 2, 32, 256, 2048, 512


def _config(**kw):
    import torch
    from megatron.core.transformer.transformer_config import TransformerConfig

    return TransformerConfig(num_layers=1, hidden_size=H, num_attention_heads=HEADS, num_query_groups=GROUPS,
                             kv_channels=KV_CHANNELS, ffn_hidden_size=FFN, gated_linear_unit=True,
                             activation_func=torch.nn.functional.silu, bias_activation_fusion=True, add_bias_linear=False,
                             normalization="LayerNorm", use_cpu_initialization=True, hidden_dropout=0.0,
                             attention_dropout=0.0, params_dtype=torch.bfloat16, bf16=True, **kw)


@pytest.mark.distributed  # in-process 1-rank gloo world running real megatron-core
@pytest.mark.parametrize("gate", [True, False])
def test_the_memory_model_keeps_what_megatron_cores_layers_save(megatron_cpu, gate):
    """A CPU forward of megatron-core's own transformer layer (its local spec: the norms, the qkv and
    output projections, q/k norms and the output gate as Qwen3.5's attention layers have them, or
    plain GQA; the SwiGLU MLP with its fused activation, as Bridge's Qwen providers set
    ``bias_activation_fusion``), in bf16, and of its final norm, output layer and vocabulary-parallel
    cross-entropy: the bytes each keeps for its backward, a token, are the memory model's within
    10 %, per layer kind. torch.compile runs megatron-core's fused regions (its ``jit_fuser``), as
    on a GPU. LayerNorm, not RMSNorm: torch's CPU RMSNorm is not one kernel and keeps fp32 copies a
    GPU's fused norm does not. Gated DeltaNet: see the next test."""
    import torch
    from megatron.core import tensor_parallel
    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.spec_utils import build_module
    from megatron.core.transformer.torch_norm import WrappedTorchNorm

    from mimo_accel.costs.flops import FlopsShape
    from mimo_accel.tools.layout.memory import stored_per_token
    from mimo_accel.tools.layout.models import ModuleModel

    config = _config(qk_layernorm=gate, attention_output_gate=gate)
    spec = get_gpt_layer_local_spec(qk_layernorm=gate, normalization="LayerNorm")
    spec.submodules.self_attention.submodules.core_attention = _FlashAttention
    torch.manual_seed(0)
    layer = build_module(spec, config=config, layer_number=1)
    norm = WrappedTorchNorm(config, hidden_size=H)
    output = tensor_parallel.ColumnParallelLinear(H, VOCAB, config=config, init_method=config.init_method,
                                                  bias=False, gather_output=False)
    params = {p.untyped_storage().data_ptr() for m in (layer, norm, output) for p in m.parameters()}
    x = torch.randn(SEQ, 1, H, dtype=torch.bfloat16, requires_grad=True)
    rope = RotaryEmbedding(kv_channels=KV_CHANNELS, rotary_percent=1.0)
    labels = torch.randint(0, VOCAB, (SEQ, 1))

    measured = {
        "attention": lambda: layer.self_attention(layer.input_layernorm(x), attention_mask=None,
                                                  rotary_pos_emb=rope(SEQ)),
        "mlp": lambda: layer.mlp(layer.pre_mlp_layernorm(x)),
        "logits": lambda: tensor_parallel.vocab_parallel_cross_entropy(output(norm(x))[0], labels),
    }
    shape = FlopsShape(layers=1, hidden=H, ffn_hidden=FFN, heads=HEADS, query_groups=GROUPS, kv_channels=KV_CHANNELS,
                       gated=True, vocab=VOCAB, output_gate=gate)
    model = ModuleModel.from_shape("language", shape, qk_norm=gate)
    for kind, fn in measured.items():
        got = _saved_per_token(fn, params, SEQ)
        assert stored_per_token(model, kind) == pytest.approx(got, rel=0.10), kind
    # the terms that moved: SwiGLU keeps fc1's 2F output and the activation's F (6F bytes), not 4F
    assert _saved_per_token(measured["mlp"], params, SEQ) > 4 * H + 5 * FFN


def _fla_stand_ins():
    """FLA's GPU kernels (Triton) that megatron-core's Gated DeltaNet calls, stood in for on CPU:
    each saves what FLA's own autograd function saves (fla-org/flash-linear-attention:
    ``modules/convolution.py`` the conv's contiguous input and weight; ``modules/l2norm.py`` the
    output and rstd; ``ops/gated_delta_rule/chunk.py`` q, k, v, g's chunked cumsum in fp32, β and
    the WY factors A of 64-token chunks in bf16), and its backward reads them, as FLA's does. Its
    outputs have FLA's shapes; their values are not FLA's (only what is kept is measured)."""
    import torch

    class Conv(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, weight):
            x = x.contiguous()
            ctx.save_for_backward(x, weight)
            return torch.nn.functional.silu(x)

        @staticmethod
        def backward(ctx, dy):
            x, _ = ctx.saved_tensors
            return dy * x, None

    class L2Norm(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            rstd = torch.rsqrt((x.float() ** 2).sum(-1) + 1e-6)
            y = (x.float() * rstd[..., None]).to(x.dtype)
            ctx.save_for_backward(y, rstd)
            return y

        @staticmethod
        def backward(ctx, dy):
            y, rstd = ctx.saved_tensors
            return dy * y * rstd[..., None].to(y.dtype)

    class Rule(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, g, beta):
            a = torch.zeros(*k.shape[:3], 64, dtype=k.dtype)
            ctx.save_for_backward(q, k, v, g.float().cumsum(1), beta, a)
            return v.clone()

        @staticmethod
        def backward(ctx, do):
            q, k, v, g, beta, _ = ctx.saved_tensors
            return do * q, do * k, do * v, g, beta

    def conv(x, weight, bias=None, **kw):
        return Conv.apply(x, weight), None

    def rule(q, k, v, g=None, beta=None, **kw):
        return Rule.apply(q, k, v, g, beta), None

    return conv, lambda x, **kw: L2Norm.apply(x), rule


@pytest.mark.distributed  # in-process 1-rank gloo world running real megatron-core
def test_the_memory_model_keeps_what_megatron_cores_gated_deltanet_saves(megatron_cpu, request):
    """megatron-core's GatedDeltaNet, as it runs on GPUs, needs FLA's Triton kernels (its CPU path,
    deterministic mode, still calls FLA's l2norm, and megatron-core refuses to build the layer
    without FLA) and Transformer Engine's fused norm + input projection (megatron-core's local
    backend has none): here those are stood in for (:func:`_fla_stand_ins`; a norm and a
    ColumnParallelLinear keep what TE's LayerNormColumnParallelLinear keeps), and the rest is
    megatron-core's own layer: the input projection's split, q and k repeated up to the value heads,
    g and β, the gated norm (its torch.compile region), the output projection. What it keeps a
    token is the memory model's within 10 %; without the repeat the model would be 11 % low here (13
    % on the 27B preset, whose 48 value heads are three times its 16 key heads)."""
    import torch
    from megatron.core import tensor_parallel
    from megatron.core.process_groups_config import ProcessGroupCollection
    from megatron.core.ssm.gated_delta_net import common, gdn
    from megatron.core.transformer.spec_utils import ModuleSpec, build_module
    from megatron.core.transformer.torch_norm import WrappedTorchNorm

    from mimo_accel.costs.flops import FlopsShape
    from mimo_accel.tools.layout.memory import linear_attention_bytes, stored_per_token
    from mimo_accel.tools.layout.models import ModuleModel

    assert not common.HAVE_FLA  # the reason for the stand-ins: FLA is not installed on CPU machines
    if hasattr(gdn.GatedDeltaNet, "_compute_gates"):
        # megatron-core main (Megatron-LM 2a75ac1, d98e8a6) computes the gates from slices of the input
        # projection's output inside its fused region, and the slice it saves keeps that whole output
        # alive (1,048 B a token here): 23 % over the memory model, which prices 0.19's layer
        request.applymarker(pytest.mark.xfail(strict=True, reason="megatron-core main keeps the input projection's "
                                              "output for the gates' backward; the memory model prices 0.19's"))

    class LayerNormColumnParallelLinear(torch.nn.Module):
        def __init__(self, input_size, output_size, *, config, init_method, bias, **kw):
            super().__init__()
            self.norm = WrappedTorchNorm(config, hidden_size=input_size)
            self.linear = tensor_parallel.ColumnParallelLinear(input_size, output_size, config=config,
                                                               init_method=init_method, bias=bias, gather_output=False)

        def forward(self, x):
            return self.linear(self.norm(x))

    conv, l2norm, rule = _fla_stand_ins()
    key_heads, value_heads, dim = 2, 6, 32
    config = _config(experimental_attention_variant="gated_delta_net", linear_attention_freq=1,
                     linear_num_key_heads=key_heads, linear_num_value_heads=value_heads, linear_key_head_dim=dim,
                     linear_value_head_dim=dim, linear_conv_kernel_dim=4)
    spec = ModuleSpec(module=gdn.GatedDeltaNet, submodules=common.GatedDeltaNetSubmodules(
        in_proj=LayerNormColumnParallelLinear, out_norm=WrappedTorchNorm, out_proj=tensor_parallel.RowParallelLinear))
    with pytest.MonkeyPatch.context() as mp:
        for module, name, value in ((common, "HAVE_FLA", True), (common, "l2norm", l2norm),
                                    (gdn, "causal_conv1d", conv), (gdn, "chunk_gated_delta_rule", rule)):
            mp.setattr(module, name, value)
        torch.manual_seed(0)
        layer = build_module(spec, config=config, layer_number=1,
                             pg_collection=ProcessGroupCollection.use_mpu_process_groups())
        params = {p.untyped_storage().data_ptr() for p in layer.parameters()}
        x = torch.randn(SEQ, 1, H, dtype=torch.bfloat16, requires_grad=True)
        got = _saved_per_token(lambda: layer(x, attention_mask=None), params, SEQ)
    model = ModuleModel.from_shape("language", FlopsShape(layers=1, hidden=H, ffn_hidden=FFN, heads=HEADS,
                                                          query_groups=GROUPS, kv_channels=KV_CHANNELS, vocab=VOCAB))
    model = ModuleModel(**{**model.__dict__, "linear_bytes": linear_attention_bytes(key_heads, value_heads, dim, dim)})
    assert stored_per_token(model, "linear_attention") == pytest.approx(got, rel=0.10)
    repeated = 2 * 2 * (value_heads - key_heads) * dim  # what the repeat of q and k adds
    assert got - repeated < 0.92 * got
