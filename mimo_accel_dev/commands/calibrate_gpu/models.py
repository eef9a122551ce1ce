"""The modules built on the device and timed: Bridge's Qwen3-VL vision model and a GPT language model."""

from __future__ import annotations

import numpy as np

from mimo_accel_dev.commands.calibrate_gpu.devices import choose_attention, core_attention, torch_dtype
from mimo_accel_dev.commands.calibrate_gpu.points import LanguagePoint, LanguageShape, VisionPoint, VisionShape


def _language_base_config(shape: LanguageShape, device: str, dtype: str, layers: int):
    from megatron.core.transformer.transformer_config import TransformerConfig
    from torch.nn import functional as F

    return TransformerConfig(
        num_layers=layers, hidden_size=shape.hidden_size, num_attention_heads=shape.num_heads,
        num_query_groups=shape.num_query_groups, kv_channels=shape.head_dim, ffn_hidden_size=shape.ffn_hidden_size,
        normalization="RMSNorm", qk_layernorm=True, layernorm_epsilon=1e-6, gated_linear_unit=True,
        activation_func=F.silu, add_bias_linear=False, hidden_dropout=0.0, attention_dropout=0.0,
        bf16=dtype == "bf16", params_dtype=torch_dtype(dtype), pipeline_dtype=torch_dtype(dtype),
        use_cpu_initialization=device == "cpu", bias_activation_fusion=False, bias_dropout_fusion=False,
        apply_rope_fusion=False, masked_softmax_fusion=False, gradient_accumulation_fusion=False,
        persist_layer_norm=False,
    )


def _vision_config(shape: VisionShape, language_config, dtype: str):
    """Bridge's ``get_vision_model_config`` over transformers' ``Qwen3VLVisionConfig`` (as
    Bridge's Qwen3-VL provider builds it), with the device's dtype and MIMO's deepstack."""
    from megatron.bridge.models.qwen_vl.modelling_qwen3_vl.transformer_config import get_vision_model_config
    from transformers.models.qwen3_vl.configuration_qwen3_vl import Qwen3VLVisionConfig

    hf = Qwen3VLVisionConfig(depth=shape.depth, hidden_size=shape.hidden_size, num_heads=shape.num_heads,
                             intermediate_size=shape.intermediate_size, out_hidden_size=shape.out_hidden_size,
                             num_position_embeddings=shape.num_position_embeddings, patch_size=shape.patch_size,
                             temporal_patch_size=shape.temporal_patch_size, in_channels=shape.in_channels,
                             spatial_merge_size=shape.spatial_merge_size, deepstack_visual_indexes=[])
    config = get_vision_model_config(hf, megatron_config=language_config)
    config.params_dtype = torch_dtype(dtype)
    config.pipeline_dtype = torch_dtype(dtype)
    config.bf16 = dtype == "bf16"
    config.gradient_accumulation_fusion = False
    config.masked_softmax_fusion = False
    config.persist_layer_norm = False
    config.deepstack_visual_indexes = []
    return config


def _fresh(model) -> None:
    for p in model.parameters():
        p.grad = None


def vision_measure(shape: VisionShape, language: LanguageShape, pg, device: str, dtype: str, timer, warmup: int,
                    repeats: int):
    """(the model, measure(point) -> timed repeats, the attention kernel's name) for Bridge's
    Qwen3-VL vision model."""
    import torch
    from megatron.bridge.models.qwen_vl.modelling_qwen3_vl.attention import Qwen3VLSelfAttention
    from megatron.bridge.models.qwen_vl.modelling_qwen3_vl.utils import PatchMergerSubmodules
    from megatron.bridge.models.qwen_vl.modelling_qwen3_vl.vision_model import Qwen3VLVisionModel
    from megatron.core.models.vision.vit_layer_specs import get_vit_layer_with_local_spec
    from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear
    from megatron.core.transformer.torch_norm import WrappedTorchNorm

    # the language config stands for Bridge's provider (recompute, TP size, CPU initialisation)
    config = _vision_config(shape, _language_base_config(language, device, dtype, language.layers), dtype)
    layer = get_vit_layer_with_local_spec()
    layer.submodules.self_attention.module = Qwen3VLSelfAttention
    kernel, attention = choose_attention(device, dtype, shape.num_heads, shape.num_heads,
                                          shape.hidden_size // shape.num_heads, causal=False)
    layer.submodules.self_attention.submodules.core_attention = core_attention(kernel)
    merger = PatchMergerSubmodules(patch_norm=WrappedTorchNorm, linear_fc1=ColumnParallelLinear,
                                   linear_fc2=RowParallelLinear)
    model = Qwen3VLVisionModel(transformer_config=config, transformer_layer_spec=layer, patch_merger_spec=merger,
                               pre_process=True, post_process=True, pg_collection=pg)
    model = model.to(device=device, dtype=torch_dtype(dtype)).train()
    unit = shape.spatial_merge_size ** 2
    gen = torch.Generator(device="cpu").manual_seed(0)

    def measure(point: VisionPoint) -> list[float]:
        grid = torch.tensor([[1, h, w] for h, w in point.images], dtype=torch.long, device=device)
        x = torch.randn(point.rows, shape.patch_dim, generator=gen).to(device=device, dtype=torch_dtype(dtype))
        grad = torch.randn(point.rows // unit, shape.out_hidden_size, generator=gen).to(device=device,
                                                                                      dtype=torch_dtype(dtype))

        def step():
            out, _ = model(x, grid)
            out.backward(grad)

        times = []
        for i in range(warmup + repeats):
            t = timer(step)
            _fresh(model)
            if i >= warmup:
                times.append(t)
        return times

    return model, measure, attention


def language_measure(shape: LanguageShape, pg, device: str, dtype: str, timer, warmup: int, repeats: int):
    """(the block, measure(point) -> timed repeats, the attention kernel's name) for a THD-packed
    decoder block."""
    import torch
    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.packed_seq_params import PackedSeqParams
    from megatron.core.transformer.transformer_block import TransformerBlock

    config = _language_base_config(shape, device, dtype, shape.layers)
    spec = get_gpt_layer_local_spec(qk_layernorm=True, normalization="RMSNorm")
    kernel, attention = choose_attention(device, dtype, shape.num_heads, shape.num_query_groups, shape.head_dim,
                                          causal=True)
    spec.submodules.self_attention.submodules.core_attention = core_attention(kernel)
    block = TransformerBlock(config, spec, pg_collection=pg).to(device=device, dtype=torch_dtype(dtype)).train()
    rope = RotaryEmbedding(kv_channels=shape.head_dim, rotary_percent=1.0, rotary_base=shape.rotary_base)
    gen = torch.Generator(device="cpu").manual_seed(0)

    def measure(point: LanguagePoint) -> list[float]:
        t = point.tokens
        cu = torch.tensor([0, *np.cumsum(point.segments).tolist()], dtype=torch.int32, device=device)
        longest = max(point.segments)
        params = PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=longest,
                                 max_seqlen_kv=longest)
        freqs = rope(longest).to(device)
        x = torch.randn(t, 1, shape.hidden_size, generator=gen).to(device=device, dtype=torch_dtype(dtype))
        x.requires_grad_(True)
        grad = torch.randn(t, 1, shape.hidden_size, generator=gen).to(device=device, dtype=torch_dtype(dtype))

        def step():
            out = block(hidden_states=x, attention_mask=None, rotary_pos_emb=freqs, packed_seq_params=params)
            out.backward(grad)

        times = []
        for i in range(warmup + repeats):
            s = timer(step)
            _fresh(block)
            x.grad = None
            if i >= warmup:
                times.append(s)
        return times

    return block, measure, attention


def release(device: str, model) -> None:
    import gc

    import torch

    del model
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
