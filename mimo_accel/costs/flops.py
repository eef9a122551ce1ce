"""Model FLOPs of each module of a MegatronMIMO job, from its Megatron ``TransformerConfig``, the
device's dense BF16 peak, and the per-step throughput figures computed from them (samples/s,
tokens/s per GPU, TFLOP/s per GPU, MFU): one definition for the training job's TensorBoard / W&B
figures (:mod:`mimo_accel.runtime.measuring.metrics`) and the report (:mod:`mimo_accel.tools.report`).

A module's forward over a step's work is linear in two counts the profiler records per step:
``tokens`` = Σ L and ``sq_tokens`` = Σ L² over the sequences it computed (the language model: each
sample's real tokens, L from its attention-mask row or the packed ``cu_seqlens``; an encoder: each
item's rows, an image's patches before the merge), attention running over each sequence alone::

    forward      = per_token · Σ L + per_sq_token · Σ L²
    per_token    = layers · (2h·(q + 2kv + gate) + 2q·h + 2u·h·F) + 2h·V + merger
    per_sq_token = layers · 4q · (1/2 causal | 1 bidirectional)

h hidden, F ffn_hidden, q = heads · kv_channels, kv = query_groups · kv_channels, u = 3 with a gated
linear unit (SwiGLU: two input projections) else 2, gate = q with an attention output gate, V the
output layer's vocabulary (the language model; 0 for an encoder), merger = 2h²m² + 2h·out per row for
an encoder config with a patch merger (Qwen-VL's ``spatial_merge_size`` m, ``out_hidden_size`` out:
fc1 (h·m² -> h·m²) and fc2 (h·m² -> out) per merged row of m² rows). A matmul (a×b)·(b×c) is 2abc
FLOPs; QKᵀ and attention × V are 2q each per (query, key) pair, half the pairs under a causal mask.
A step is 3× forward for a trained module (forward, backward to the activations and to the
weights), 1× for a frozen one.

Against Megatron-Bridge's own count (``megatron.bridge.training.utils.flop_utils.
num_floating_point_operations``, what Bridge logs as TFLOP/s for a GPT model):

- the same terms and the same causal halving for the language model; tests/test_flops.py checks
  that the two agree for the same config and lengths;
- Bridge's logits use the vocabulary padded to ``make_vocab_size_divisible_by`` × TP; here V is the
  output layer's own size (the MIMO language spec's ``vocab_size``: what GPTModel builds);
- Bridge's loop counts an unpacked batch as mbs × seq_length tokens (padding included) and its
  attention as mbs × seq_length²; here only real tokens, each sample over its own length, packed or
  not: the work the data asks for, so a run that stops computing padding shows the same FLOPs in
  less time (model FLOPs, as MFU counts them);
- Bridge's ViT count (``vit_flops``) squares the *mean* patches per image; here each image's own;
- MoE, multi-latent attention, sliding-window, hybrid (Mamba / Gated DeltaNet) layers and MTP heads
  are not counted here (Bridge counts them): :func:`shape_of` gives the reason and the module's
  FLOPs are null, never a wrong number;
- neither counts norms, biases, rotary embeddings, a patch embedding or the loss.

Pure: numpy-free python, no torch, no megatron import (a config is read by attribute name).
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, fields
from typing import Any, Optional

__all__ = ["FlopsShape", "PEAK_BF16_TFLOPS", "passes", "peak_tflops_of", "shape_of", "step_flops", "throughput"]


@dataclass(frozen=True)
class FlopsShape:
    """What a module's FLOPs depend on, read once from its ``TransformerConfig`` (:func:`shape_of`)."""

    layers: int
    hidden: int
    ffn_hidden: int
    heads: int
    query_groups: int
    kv_channels: int
    gated: bool = False  # gated linear unit (SwiGLU): three MLP projections instead of two
    vocab: int = 0  # the output layer's vocabulary (the language model only)
    causal: bool = True  # the language model; an encoder attends both ways
    output_gate: bool = False  # attention_output_gate: one more q-wide projection
    merge: int = 0  # an encoder's patch merger: spatial_merge_size (0: none)
    out_hidden: int = 0  # the merger's output width

    @property
    def per_token(self) -> float:
        """Forward FLOPs per token (row) that do not depend on its sequence's length."""
        h, q = self.hidden, self.heads * self.kv_channels
        kv = self.query_groups * self.kv_channels
        projections = 2 * h * (q + 2 * kv + (q if self.output_gate else 0)) + 2 * q * h
        mlp = 2 * (3 if self.gated else 2) * h * self.ffn_hidden
        merger = 2 * h * h * self.merge ** 2 + 2 * h * self.out_hidden if self.merge else 0
        return float(self.layers * (projections + mlp) + 2 * h * self.vocab + merger)

    @property
    def per_sq_token(self) -> float:
        """Forward FLOPs per unit of Σ L² (the attention core: QKᵀ and attention × V)."""
        return self.layers * 4.0 * self.heads * self.kv_channels * (0.5 if self.causal else 1.0)

    def forward(self, tokens: float, sq_tokens: float) -> float:
        """Forward FLOPs over sequences of Σ L = ``tokens``, Σ L² = ``sq_tokens``."""
        return self.per_token * tokens + self.per_sq_token * sq_tokens

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "FlopsShape":
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


def passes(trained: bool) -> float:
    """A step's work over a module's forward FLOPs: 3 when trained (the forward, the backward to the
    activations and to the weights), 1 when frozen."""
    return 3.0 if trained else 1.0


def step_flops(shape: FlopsShape, tokens: float, sq_tokens: float, *, trained: bool = True) -> float:
    """A step's FLOPs of a module: forward + backward when trained, forward when frozen (:func:`passes`)."""
    return passes(trained) * shape.forward(tokens, sq_tokens)


# what this count leaves out: config attribute -> why the module's FLOPs are null
_NOT_COUNTED = (("num_moe_experts", "MoE layers"), ("multi_latent_attention", "multi-latent attention"),
                ("window_size", "sliding-window attention"), ("is_hybrid_model", "hybrid (Mamba) layers"),
                ("hybrid_layer_pattern", "hybrid (Mamba) layers"), ("mtp_num_layers", "MTP heads"),
                ("experimental_attention_variant", "an experimental attention variant"))


def _int(config: Any, name: str) -> Optional[int]:
    value = getattr(config, name, None)
    return None if value is None or isinstance(value, bool) else int(value)


def shape_of(config: Any, *, vocab: int = 0, causal: bool = True) -> tuple[Optional[FlopsShape], Optional[str]]:
    """A module's :class:`FlopsShape` from its Megatron ``TransformerConfig`` (any object with its
    attribute names), and None; or None and why its FLOPs are not counted here."""
    for name, what in _NOT_COUNTED:
        if getattr(config, name, None):
            return None, f"{what} ({name}) are not counted"
    layers, hidden, heads = (_int(config, n) for n in ("num_layers", "hidden_size", "num_attention_heads"))
    if not layers or not hidden or not heads:
        return None, "the config has no num_layers / hidden_size / num_attention_heads"
    merge, out_hidden = _int(config, "spatial_merge_size") or 0, _int(config, "out_hidden_size") or 0
    shape = FlopsShape(
        layers=layers, hidden=hidden, heads=heads,
        ffn_hidden=_int(config, "ffn_hidden_size") or 4 * hidden,
        query_groups=_int(config, "num_query_groups") or heads,
        kv_channels=_int(config, "kv_channels") or hidden // heads,
        gated=bool(getattr(config, "gated_linear_unit", False)), vocab=int(vocab or 0), causal=causal,
        output_gate=bool(getattr(config, "attention_output_gate", False)),
        merge=merge if merge and out_hidden else 0, out_hidden=out_hidden if merge else 0)
    return shape, None


# ------------------------------------------------------------------------------------ the peak

#: Dense (without sparsity) BF16 Tensor Core peak of NVIDIA data-center GPUs, TFLOP/s per GPU.
#: Source: NVIDIA's product datasheets (nvidia.com/en-us/data-center/<product>/, "BF16 Tensor
#: Core": the figure without sparsity, half the one with it). Each row: a pattern matched against
#: ``torch.cuda.get_device_name()`` (upper-cased; the first row that matches), the GPU, its peak.
PEAK_BF16_TFLOPS: tuple[tuple[str, str, float], ...] = (
    (r"\bGB200\b", "GB200", 2500.0),
    (r"\bB200\b", "B200", 2250.0),
    (r"\bGH200\b", "GH200", 989.0),
    (r"\bH200\b.*\bNVL\b", "H200 NVL", 835.0),
    (r"\bH200\b", "H200 SXM", 989.0),
    (r"\bH100\b.*\bPCIE\b", "H100 PCIe", 756.0),
    (r"\bH100\b.*\bNVL\b", "H100 NVL", 835.0),
    (r"\bH100\b", "H100 SXM", 989.0),  # "NVIDIA H100 80GB HBM3"
    (r"\bH800\b.*\bPCIE\b", "H800 PCIe", 756.0),
    (r"\bH800\b", "H800 SXM", 989.0),
    (r"\bA100\b", "A100", 312.0),
    (r"\bA800\b", "A800", 312.0),
    (r"\bL40S\b", "L40S", 362.0),
    (r"\bL40\b", "L40", 181.0),
    (r"\bL4\b", "L4", 121.0),
    (r"\bA40\b", "A40", 149.7),
    (r"\bA30\b", "A30", 165.0),
    (r"\bA10\b", "A10", 125.0),
)


def peak_tflops_of(device_name: Optional[str]) -> Optional[tuple[str, float]]:
    """The GPU of the table a ``torch.cuda.get_device_name()`` names and its dense BF16 peak
    (TFLOP/s); None for any other device (a CPU, a GPU not in the table)."""
    if not device_name:
        return None
    name = str(device_name).upper()
    for pattern, gpu, peak in PEAK_BF16_TFLOPS:
        if re.search(pattern, name):
            return gpu, peak
    return None


# ----------------------------------------------------------------------------- the figures


def throughput(*, samples: Optional[float], tokens: Optional[float], sq_tokens: Optional[float],
               step_time_s: Optional[float], ranks: int, shape: Optional[FlopsShape] = None,
               trained: bool = True, peak_tflops: Optional[float] = None) -> dict[str, Optional[float]]:
    """One module's figures for one step, from its work in the step (``samples``; ``tokens`` = Σ L
    and ``sq_tokens`` = Σ L² summed over its DP replicas) and the step's wall time: ``samples_per_s``,
    ``tokens_per_s_per_gpu`` and ``tflops_per_gpu`` (per GPU: over the module's ``ranks`` =
    tp·pp·dp), ``mfu`` (over ``peak_tflops``). A figure that cannot be computed is None: no step
    time, no counts, no :class:`FlopsShape`, no peak."""
    out: dict[str, Optional[float]] = dict.fromkeys(("samples_per_s", "tokens_per_s_per_gpu", "tflops_per_gpu",
                                                     "mfu"))
    if not step_time_s or step_time_s <= 0 or not math.isfinite(step_time_s) or ranks <= 0:
        return out
    if samples is not None:
        out["samples_per_s"] = samples / step_time_s
    gpu_seconds = step_time_s * ranks
    if tokens is not None:
        out["tokens_per_s_per_gpu"] = tokens / gpu_seconds
        if shape is not None and sq_tokens is not None:
            out["tflops_per_gpu"] = step_flops(shape, tokens, sq_tokens, trained=trained) / gpu_seconds / 1e12
            if peak_tflops:
                out["mfu"] = out["tflops_per_gpu"] / peak_tflops
    return out
