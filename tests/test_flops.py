"""Model FLOPs per module (mimo_accel.costs.flops): a ViT layer counted by hand, the language model
against Megatron-Bridge's own count for the same config, the device peak table, the per-step
figures, and the shapes read from a MegatronMIMOProvider's configs (mimo_accel.runtime.measuring.model_flops)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from mimo_accel.costs.flops import FlopsShape, peak_tflops_of, shape_of, step_flops, throughput

# ------------------------------------------------------------------------------- by hand


def test_a_vit_layer_counted_by_hand():
    """One bidirectional layer, hidden 64, 4 heads of 16, MLP 256 (GELU, two projections), over two
    images of 10 and 6 rows, each attending over its own rows. A matmul (a×b)(b×c) is 2abc."""
    vit = FlopsShape(layers=1, hidden=64, ffn_hidden=256, heads=4, query_groups=4, kv_channels=16, causal=False)

    def image(n: int) -> int:
        qkv = 3 * 2 * n * 64 * 64  # Q, K, V: (n×64)(64×64) each
        out = 2 * n * 64 * 64  # the output projection
        scores = 4 * 2 * n * 16 * n  # QKᵀ per head: (n×16)(16×n)
        mix = 4 * 2 * n * n * 16  # attention × V per head: (n×n)(n×16)
        mlp = 2 * n * 64 * 256 + 2 * n * 256 * 64  # fc1, fc2
        return qkv + out + scores + mix + mlp

    assert image(10) == 245_760 + 81_920 + 12_800 + 12_800 + 655_360 == 1_008_640
    forward = image(10) + image(6)
    assert vit.forward(tokens=10 + 6, sq_tokens=10**2 + 6**2) == forward
    assert step_flops(vit, 16, 136) == 3 * forward  # trained: forward + backward
    assert step_flops(vit, 16, 136, trained=False) == forward  # frozen: forward only
    # causal (the language model): half the (query, key) pairs; a gated MLP: three projections
    causal = FlopsShape(layers=1, hidden=64, ffn_hidden=256, heads=4, query_groups=4, kv_channels=16)
    assert causal.forward(10, 100) == image(10) - (12_800 + 12_800) // 2
    gated = FlopsShape(layers=1, hidden=64, ffn_hidden=256, heads=4, query_groups=4, kv_channels=16, gated=True,
                       causal=False)
    assert gated.forward(10, 100) == image(10) + 2 * 10 * 64 * 256
    # grouped queries (2 KV heads of 16): K and V are 32 wide; the output layer: 2·n·h·V
    gqa = FlopsShape(layers=1, hidden=64, ffn_hidden=256, heads=4, query_groups=2, kv_channels=16, vocab=100,
                     causal=False)
    assert gqa.forward(10, 100) == image(10) - 2 * (2 * 10 * 64 * 32) + 2 * 10 * 64 * 100


def test_the_shape_is_read_from_a_transformer_config_and_what_it_leaves_out_is_said():
    config = SimpleNamespace(num_layers=2, hidden_size=64, num_attention_heads=4, num_query_groups=None,
                             kv_channels=None, ffn_hidden_size=None, gated_linear_unit=True)
    shape, why = shape_of(config, vocab=1000)
    assert why is None and shape == FlopsShape(layers=2, hidden=64, ffn_hidden=256, heads=4, query_groups=4,
                                               kv_channels=16, gated=True, vocab=1000)
    assert FlopsShape.from_dict(shape.to_dict()) == shape
    moe = SimpleNamespace(**vars(config), num_moe_experts=8)
    assert shape_of(moe) == (None, "MoE layers (num_moe_experts) are not counted")
    assert shape_of(SimpleNamespace(hidden_size=64))[0] is None


# -------------------------------------------------------------------------- the figures


def test_a_steps_figures_are_per_gpu_of_the_module():
    shape = FlopsShape(layers=2, hidden=64, ffn_hidden=256, heads=4, query_groups=4, kv_channels=16, vocab=1000)
    got = throughput(samples=8, tokens=1000, sq_tokens=150_000, step_time_s=2.0, ranks=4, shape=shape,
                     peak_tflops=100.0)
    assert got["samples_per_s"] == 4.0
    assert got["tokens_per_s_per_gpu"] == 1000 / (2.0 * 4)
    tflops = 3 * shape.forward(1000, 150_000) / (2.0 * 4) / 1e12
    assert got["tflops_per_gpu"] == pytest.approx(tflops)
    assert got["mfu"] == pytest.approx(tflops / 100.0)
    assert throughput(samples=8, tokens=1000, sq_tokens=1, step_time_s=2.0, ranks=4, shape=shape)["mfu"] is None
    no_shape = throughput(samples=8, tokens=1000, sq_tokens=1, step_time_s=2.0, ranks=4, peak_tflops=100.0)
    assert no_shape["tflops_per_gpu"] is None and no_shape["mfu"] is None and no_shape["tokens_per_s_per_gpu"] == 125
    assert set(throughput(samples=8, tokens=1, sq_tokens=1, step_time_s=0.0, ranks=4).values()) == {None}


@pytest.mark.parametrize("name, gpu, peak", [
    ("NVIDIA H100 80GB HBM3", "H100 SXM", 989.0), ("NVIDIA H100 PCIe", "H100 PCIe", 756.0),
    ("NVIDIA H100 NVL", "H100 NVL", 835.0), ("NVIDIA H200", "H200 SXM", 989.0),
    ("NVIDIA A100-SXM4-80GB", "A100", 312.0), ("NVIDIA A100 80GB PCIe", "A100", 312.0),
    ("NVIDIA B200", "B200", 2250.0), ("NVIDIA GH200 480GB", "GH200", 989.0), ("NVIDIA L40S", "L40S", 362.0),
    ("NVIDIA L4", "L4", 121.0), ("NVIDIA A10", "A10", 125.0),
])
def test_the_peak_table_names_the_gpu(name, gpu, peak):
    assert peak_tflops_of(name) == (gpu, peak)


@pytest.mark.parametrize("name", [None, "", "NVIDIA A10G", "Tesla V100-SXM2-16GB", "NVIDIA GeForce RTX 4090"])
def test_a_device_not_in_the_table_has_no_peak(name):
    assert peak_tflops_of(name) is None


# ---------------------------------------------------------------- against Megatron-Bridge


def _bridge():
    from mimo_accel_dev.rehearse import cpu

    cpu.prepare_imports()  # Python 3.11: the typing.override back-port megatron.training needs
    from megatron.bridge.training.utils import flop_utils

    return flop_utils


@pytest.mark.parametrize("gated, groups, tp", [(True, 2, 1), (False, 8, 2)])
def test_the_language_model_counts_as_megatron_bridge_does(gated, groups, tp):
    """Bridge's ``num_floating_point_operations`` for a GPT config: the same FLOPs for the same real
    lengths. Bridge pads the vocabulary to make_vocab_size_divisible_by × TP (here the output
    layer's own size counts: it is given Bridge's padded size), and without per-sample lengths it
    counts every sample at seq_length (here: real tokens only; fed seq_length per sample, the same)."""
    flop_utils = _bridge()
    from megatron.bridge.models.gpt_provider import GPTModelProvider
    from megatron.bridge.utils.vocab_utils import calculate_padded_vocab_size

    model = GPTModelProvider(num_layers=4, hidden_size=256, ffn_hidden_size=704, num_attention_heads=8,
                             num_query_groups=groups, kv_channels=32, gated_linear_unit=gated, vocab_size=1000,
                             make_vocab_size_divisible_by=128, seq_length=512, tensor_model_parallel_size=tp)
    cfg = SimpleNamespace(model=model)
    padded = calculate_padded_vocab_size(1000, 128, tp, logging_enabled=False)
    shape, why = shape_of(model, vocab=padded, causal=True)
    assert why is None
    lengths = [100, 37, 250]
    bridge = flop_utils.num_floating_point_operations(cfg, batch_size=3, seqlen_sum=sum(lengths),
                                                      seqlen_squared_sum=sum(n * n for n in lengths))
    assert step_flops(shape, sum(lengths), sum(n * n for n in lengths)) == pytest.approx(bridge, rel=1e-12)
    padded_batch = flop_utils.num_floating_point_operations(cfg, batch_size=3)  # Bridge: every sample seq_length
    assert step_flops(shape, 3 * 512, 3 * 512**2) == pytest.approx(padded_batch, rel=1e-12)


def test_a_qwen_vision_encoder_counts_as_megatron_bridges_vit_count():
    """Bridge's ``vit_flops`` (layers and the patch merger) for images of equal size (it squares the
    mean patches per image; here each image's own), from Bridge's Qwen3-VL vision config."""
    flop_utils = _bridge()
    from mimo_accel_dev.rehearse import qwen3vl

    config = qwen3vl.vision_config(hidden=64, layers=2, heads=4, out_hidden=96, merge=2)
    shape, why = shape_of(config, causal=False)
    assert why is None and (shape.merge, shape.out_hidden, shape.causal) == (2, 96, False)
    hf = SimpleNamespace(depth=2, hidden_size=64, intermediate_size=config.ffn_hidden_size, spatial_merge_size=2,
                         out_hidden_size=96)
    bridge = flop_utils.vit_flops(SimpleNamespace(model=SimpleNamespace(vision_config=hf, hidden_size=96)),
                                  batch_size=3, num_patches=64)
    assert step_flops(shape, 3 * 64, 3 * 64**2) == pytest.approx(bridge, rel=1e-12)


def test_the_provider_gives_each_modules_shape_ranks_and_training():
    _bridge()
    from megatron.core.transformer.transformer_config import TransformerConfig

    from mimo_accel.runtime.measuring.model_flops import flops_layout

    def config(layers, hidden):
        return TransformerConfig(num_layers=layers, hidden_size=hidden, num_attention_heads=4,
                                 use_cpu_initialization=True)

    vision = SimpleNamespace(params={"transformer_config": config(2, 64)})
    grids = {"vision": SimpleNamespace(tensor_model_parallel_size=1, pipeline_model_parallel_size=1,
                                       context_parallel_size=1, data_parallel_size=1),
             "language": SimpleNamespace(tensor_model_parallel_size=2, pipeline_model_parallel_size=2,
                                         context_parallel_size=1, data_parallel_size=2)}
    provider = SimpleNamespace(
        language_model_spec=SimpleNamespace(params={"config": config(4, 128), "vocab_size": 2048}),
        modality_submodules_spec={"vision": SimpleNamespace(submodules={"encoders": {"vit": vision}})},
        megatron_mimo_parallelism_config=SimpleNamespace(module_parallelisms=grids),
        freeze_language_model=False, freeze_modality_encoders={"vision": True})
    got = flops_layout(provider)
    assert got["device_name"] is None  # this CPU
    language, encoder = got["modules"]["language"], got["modules"]["vision"]
    assert (language["ranks"], language["trained"], encoder["ranks"], encoder["trained"]) == (8, True, 1, False)
    assert FlopsShape.from_dict(language["shape"]) == shape_of(config(4, 128), vocab=2048, causal=True)[0]
    assert FlopsShape.from_dict(encoder["shape"]).causal is False and encoder["shape"]["vocab"] == 0
    assert flops_layout(SimpleNamespace()) is None  # not a MIMO provider
