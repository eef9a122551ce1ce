"""Bridge's own Qwen3-VL vision model as the tiny stack's MIMO vision encoder (CPU and GPU).

``StackConfig(encoder="qwen3vl")`` (``examples/train_mimo.py --encoder qwen3vl``) registers
megatron-bridge's ``Qwen3VLVisionModel``
(megatron/bridge/models/qwen_vl/modelling_qwen3_vl/vision_model.py) where the stack otherwise
registers its ``NativeViT``. What it takes to run without Transformer Engine (measured in
notes/qwen3vl-vision-on-cpu.md):

- megatron-core's local ViT layer spec with Bridge's ``Qwen3VLSelfAttention`` and a core attention
  that runs once per ``cu_seqlens`` segment (one image), bidirectional: megatron-core's local
  ``DotProductAttention`` asserts on packed params (core/transformer/dot_product_attention.py),
  and dropping them would attend across images.
- the merger built from ``WrappedTorchNorm`` / ``ColumnParallelLinear`` / ``RowParallelLinear``
  (Bridge's own Qwen3.5-VL provider uses the Transformer Engine classes,
  bridge/models/qwen_vl/qwen35_vl_provider.py).
- ``apply_rope_fusion=False`` (asserted in bridge/models/qwen_vl/modelling_qwen3_vl/rope.py) and ``deepstack_visual_indexes=[]`` (the default builds deepstack mergers whose outputs MIMO
  drops, so they would never get a gradient).

The model takes Qwen's patch-packed input — ``hidden_states`` ``[Σ t·h·w, 3·2·16²]`` and
``grid_thw`` ``[images, 3]`` — and returns ``t·h·w / 4`` rows per image (2×2 spatial merge),
which is how many image placeholders the language sequence must hold for that image
(:func:`mimo_accel_dev.rehearse.stack.images_dataset` with ``placeholders="grid"``).
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch
from torch.nn import functional as F

PATCH_SIZE = 16  # pixels: Qwen3-VL's vision patch
TEMPORAL_PATCH_SIZE = 2
IN_CHANNELS = 3
MERGE = 2
PATCH_DIM = IN_CHANNELS * TEMPORAL_PATCH_SIZE * PATCH_SIZE * PATCH_SIZE  # 1536: one pixel_values row
NUM_POSITION_EMBEDDINGS = 1024  # a 32×32 learned grid, interpolated to each image's grid


def rows_per_image(grid_thw: torch.Tensor, merge: int = MERGE) -> list[int]:
    """Encoder output rows (= language placeholders) of each image: ``t·h·w / merge²``."""
    return [int(n) // (merge * merge) for n in grid_thw.reshape(-1, 3).prod(dim=-1).tolist()]


def segmented_core_attention():
    """A local ``DotProductAttention`` that attends within each ``cu_seqlens`` segment only.

    Vision attention is bidirectional inside an image and never across images; Transformer
    Engine does this with THD packed params, megatron-core's local attention cannot take them.
    Each segment runs through the parent's own (unmasked, no-mask-type) path.
    """
    from megatron.core.transformer.dot_product_attention import DotProductAttention

    class SegmentedCoreAttention(DotProductAttention):
        def forward(self, query, key, value, attention_mask, attn_mask_type=None, attention_bias=None,
                    packed_seq_params=None):
            if packed_seq_params is None:
                return super().forward(query, key, value, attention_mask, attn_mask_type, attention_bias)
            bounds = packed_seq_params.cu_seqlens_q.tolist()
            outs = []
            for start, stop in zip(bounds[:-1], bounds[1:]):  # packed (THD) q/k/v: [T, heads, dim]
                o = super().forward(query[start:stop, None], key[start:stop, None], value[start:stop, None],
                                    None, attn_mask_type)
                outs.append(o[:, 0])  # [n, heads * dim]
            if not outs:
                return query.new_zeros(0, self.hidden_size_per_partition)
            return torch.cat(outs)  # [T, heads * dim], as the packed path returns

    return SegmentedCoreAttention


def vision_config(*, hidden: int, layers: int, heads: int, out_hidden: int, merge: int = MERGE):
    """Bridge's ``Qwen3VLTransformerConfig`` with ``get_vision_model_config``'s vision fields
    (bridge/models/qwen_vl/modelling_qwen3_vl/transformer_config.py), small, fusions off."""
    from megatron.bridge.models.qwen_vl.modelling_qwen3_vl.transformer_config import Qwen3VLTransformerConfig

    if hidden % heads:
        raise ValueError(f"qwen3vl encoder: vision hidden size {hidden} is not divisible by {heads} heads")
    return Qwen3VLTransformerConfig(
        num_layers=layers, hidden_size=hidden, num_attention_heads=heads, num_query_groups=heads,
        kv_channels=hidden // heads, ffn_hidden_size=4 * hidden,
        add_bias_linear=True, add_qkv_bias=True, gated_linear_unit=False,
        activation_func=partial(F.gelu, approximate="tanh"), normalization="LayerNorm", layernorm_epsilon=1e-6,
        apply_rotary_pos_emb_in_fp32=True, apply_query_key_layer_scaling=False, attention_softmax_in_fp32=True,
        hidden_dropout=0.0, attention_dropout=0.0,
        use_cpu_initialization=True, pipeline_dtype=torch.float32, bf16=False,
        apply_rope_fusion=False, bias_activation_fusion=False, bias_dropout_fusion=False,
        masked_softmax_fusion=False, gradient_accumulation_fusion=False,
        variable_seq_lengths=True, moe_token_dispatcher_type="alltoall",  # as the stack's other configs
        patch_size=PATCH_SIZE, temporal_patch_size=TEMPORAL_PATCH_SIZE, in_channels=IN_CHANNELS,
        spatial_merge_size=merge, num_position_embeddings=NUM_POSITION_EMBEDDINGS,
        out_hidden_size=out_hidden, deepstack_visual_indexes=[],
    )


def _model_class():
    from megatron.bridge.models.qwen_vl.modelling_qwen3_vl.vision_model import Qwen3VLVisionModel

    class Qwen3VLEncoder(Qwen3VLVisionModel):
        """Bridge's ``Qwen3VLVisionModel``, unchanged for any input with an image. A replica whose
        share of a micro-batch holds no image (text-only samples) gets ``[0, patch_dim]``; the
        parent's ``rot_pos_emb`` takes a max over no grid and fails, so this returns ``[0,
        out_hidden]`` rows computed from the patch embedding and the merger (so the pipeline's
        backward still has a graph to run through)."""

        def forward(self, hidden_states, grid_thw, inference_params=None, extra_block_kwargs=None):
            if grid_thw.numel() == 0:
                if hidden_states.size(0):
                    raise ValueError(f"qwen3vl encoder: {hidden_states.size(0)} patch rows but an empty grid_thw")
                x = self.patch_embed(hidden_states)  # [0, hidden]
                return self.merger(x[:, None]).reshape(0, self.config.out_hidden_size), []
            if grid_thw.dim() != 2 or grid_thw.size(-1) != 3:
                raise ValueError(f"qwen3vl encoder: grid_thw must be [images, 3], got {tuple(grid_thw.shape)}")
            patches = int(grid_thw.prod(dim=-1).sum())
            if hidden_states.size(0) != patches:
                raise ValueError(f"qwen3vl encoder: hidden_states has {hidden_states.size(0)} patch rows but "
                                 f"grid_thw {grid_thw.tolist()} describes {patches}")
            odd = [g for g in grid_thw.tolist() if g[1] % self.spatial_merge_size or g[2] % self.spatial_merge_size]
            if odd:
                raise ValueError(f"qwen3vl encoder: image grids {odd} are not divisible by the spatial merge "
                                 f"{self.spatial_merge_size} (resize with the Qwen3-VL image processor)")
            return super().forward(hidden_states, grid_thw, inference_params, extra_block_kwargs)

    Qwen3VLEncoder.__module__ = __name__
    Qwen3VLEncoder.__qualname__ = "Qwen3VLEncoder"
    return Qwen3VLEncoder


_lazy: dict = {}


def __getattr__(name: str):
    # Qwen3VLEncoder subclasses a Bridge class; Bridge is imported on first use only.
    if name == "Qwen3VLEncoder":
        if name not in _lazy:
            _lazy[name] = _model_class()
        return _lazy[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def encoder_params(config) -> dict[str, Any]:
    """``params`` of ``ModuleSpec(module=Qwen3VLEncoder, ...)``; MIMO's provider adds
    ``pg_collection`` (bridge/models/megatron_mimo/megatron_mimo_provider.py)."""
    from megatron.core.models.vision.vit_layer_specs import get_vit_layer_with_local_spec
    from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear
    from megatron.core.transformer.torch_norm import WrappedTorchNorm

    from megatron.bridge.models.qwen_vl.modelling_qwen3_vl.attention import Qwen3VLSelfAttention
    from megatron.bridge.models.qwen_vl.modelling_qwen3_vl.utils import PatchMergerSubmodules

    layer = get_vit_layer_with_local_spec()
    layer.submodules.self_attention.module = Qwen3VLSelfAttention
    layer.submodules.self_attention.submodules.core_attention = segmented_core_attention()
    merger = PatchMergerSubmodules(patch_norm=WrappedTorchNorm, linear_fc1=ColumnParallelLinear,
                                   linear_fc2=RowParallelLinear)
    return dict(transformer_config=config, transformer_layer_spec=layer, patch_merger_spec=merger,
                pre_process=True, post_process=True)


def encoder_spec(*, hidden: int, layers: int, heads: int, out_hidden: int, merge: int = MERGE):
    """The ``ModuleSpec`` MIMO's vision submodule builds the encoder from."""
    from megatron.core.transformer.spec_utils import ModuleSpec

    config = vision_config(hidden=hidden, layers=layers, heads=heads, out_hidden=out_hidden, merge=merge)
    return ModuleSpec(module=__getattr__("Qwen3VLEncoder"), params=encoder_params(config))


def image_processor(*, max_rows: int, min_rows: int = 1, **kwargs: Any):
    """Qwen3-VL's image processing (transformers' Qwen2-VL processor with Qwen3-VL's settings:
    16 px patches, 2×2 merge, mean/std 0.5), pixel bounds in encoder rows: every image becomes
    ``min_rows``..``max_rows`` rows of 32×32 px (4 patches each)."""
    from mimo_accel_dev.rehearse.qwen_processor import qwen_image_processor

    if not 1 <= min_rows <= max_rows:
        raise ValueError(f"qwen3vl image processor: need 1 <= min_rows <= max_rows, got {min_rows}, {max_rows}")
    unit = (PATCH_SIZE * MERGE) ** 2
    return qwen_image_processor(min_pixels=unit * min_rows, max_pixels=unit * max_rows, patch_size=PATCH_SIZE,
                                temporal_patch_size=TEMPORAL_PATCH_SIZE, merge_size=MERGE,
                                image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5], **kwargs)
