"""Each module's memory per GPU in a layout, as the job is configured (:class:`JobSettings`), and
whether it fits: weights, gradients and optimizer states of each PP stage's shard, and the
activations each stage holds under 1F1B. Pure: no torch, no megatron.

The states are Megatron-Bridge's own estimate (``src/megatron/bridge/training/utils/theoretical_memory_utils.py``:
``estimate_training_memory``, ``_count_parameters``, ``_dense_parameters_on_most_loaded_shard``,
``_bytes_per_parameter``), which works on one ``TransformerConfig`` and which
``report_theoretical_memory`` skips for MegatronMIMO; here it is applied to each module's own
config and sizes, stage by stage, with the job's settings. The activations are what megatron-core's
own layers keep for their backward (:func:`stored_per_token`, counted on its layers by
tests/test_layout_terms.py), where Bridge's ``_compute_activation_memory_bytes`` takes Korthikanti
et al.'s 18h + 4F a layer (a GeLU MLP, dropout masks, attention as 8h)::

    states (stage p)   = P_p / tp · B
    P_p      = layers_p / L · P_layers + P_other / pp  [+ P_embedding on the first stage]
               [+ P_output (or the tied embedding's copy) on the last]
    B        = bf16: 6 + 12 / dp with the distributed optimizer (bf16 weights, fp32 gradients, fp32
               master weights and two Adam moments sharded over DP), 18 without it; fp32: 8 + 8 / dp,
               16; 2 (4 in fp32) for a frozen module (its weights only)
    activations (stage p) = k_p · T · [layers_p · layer + (first stage) (8 + h)] [+ (last stage) 4h + 4V / tp]
    layer    = (U + mixer + mlp) / tp with sequence parallelism, U + (mixer + mlp) / tp without it:
               U = 8h + 16 the two norms' inputs and outputs (the column-parallel projections'
               inputs, whole on every TP rank without sequence parallelism) and their statistics;
               mixer the attention's (or a linear-attention layer's) own bytes, mlp 6F for SwiGLU
               (fc1's 2F output, which the fused activation keeps, and the fc2 input's F), 4F for
               a GeLU MLP (no dropout: the models priced have none); full recompute keeps each
               layer's input alone (2h, over tp with sequence parallelism) and one layer's whole
               activations; selective and none are the same here, attention being flash attention
               (no score matrix is stored)

T the tokens of one local micro-batch, k_p = min(W, pp − p) the micro-batches stage p holds at
once (the first holds the most; the last, one, with its logits), h hidden, F the FFN width, V the
vocabulary; an encoder is one stage before the language model's first, holding
``min(W, pp + 1)`` micro-batches (a warm-up forward for each stage after it), whose rows are at
most the heaviest the data can form (:meth:`~mimo_accel.tools.layout.draws.DataSource.heaviest_rows`).
Activations in fp32 take twice the bytes. Left out, as Bridge's estimate leaves them out: the
allocator's fragmentation, the CUDA context, communication buffers and workspaces (a stated share
of each GPU is kept free for them), CPU offload.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import lru_cache
from typing import Any, Optional

__all__ = ["GIB", "RECOMPUTE", "Footprint", "JobSettings", "Memory", "ParameterCount", "attention_bytes",
           "bytes_per_parameter", "linear_attention_bytes", "parameter_count", "stage_parameters", "stored_per_token"]

GIB = float(1 << 30)
RECOMPUTE = ("none", "selective", "full")
PRECISIONS = ("bf16", "fp32")
LAUNCHER = ("upstream's Qwen3.5-VL MIMO launcher (examples/megatron_mimo/qwen35_vl/finetune_qwen35_vl.py): "
            "no sequence parallelism, no recompute (megatron-core's defaults), the distributed optimizer, bf16")


@dataclass(frozen=True)
class JobSettings:
    """How the job is configured, as far as its memory is concerned (``assumptions`` in the JSON);
    the defaults are upstream's Qwen3.5-VL MIMO launcher's (:data:`LAUNCHER`)."""

    sequence_parallel: bool = False
    recompute: str = "none"
    distributed_optimizer: bool = True
    precision: str = "bf16"
    source: str = LAUNCHER

    def __post_init__(self) -> None:
        if self.recompute not in RECOMPUTE or self.precision not in PRECISIONS:
            raise ValueError(f"recompute {self.recompute!r} / precision {self.precision!r}: give one of "
                             f"{', '.join(RECOMPUTE)} / {', '.join(PRECISIONS)}")

    def to_doc(self) -> dict[str, Any]:
        return asdict(self)


def bytes_per_parameter(dp: int, *, trained: bool = True, distributed_optimizer: bool = True,
                        precision: str = "bf16") -> float:
    """Bytes each parameter of a shard takes: Bridge's ``_bytes_per_parameter`` in bf16 (6 + 12/dp
    with the distributed optimizer over the module's DP, 18 without); in fp32 8 + 8/dp, 16; a frozen
    module's weights alone (2, or 4 in fp32)."""
    wide = precision == "fp32"
    if not trained:
        return 4.0 if wide else 2.0
    if not distributed_optimizer:
        return 16.0 if wide else 18.0
    return (8.0 + 8.0 / max(1, dp)) if wide else (6.0 + 12.0 / max(1, dp))


@dataclass(frozen=True)
class ParameterCount:
    """A module's parameters: ``layers`` all its transformer layers (norms included), ``embedding``
    the input embedding (V·h; 0 for an encoder), ``output`` an untied output layer (V·h; 0 when
    tied or for an encoder), ``other`` what sits beside the layers (an encoder's patch embedding
    and merger; the final norm)."""

    layers: float
    embedding: float = 0.0
    output: float = 0.0
    other: float = 0.0

    @property
    def total(self) -> float:
        return self.layers + self.embedding + self.output + self.other


def parameter_count(shape: Any, *, tied: bool = False, encoder: bool = False) -> ParameterCount:
    """The parameters of a module of :class:`~mimo_accel.costs.flops.FlopsShape` ``shape`` (standard
    attention layers), counted as Bridge's ``_count_parameters``: per layer 2h·q + 2h·kv (Q, K, V,
    O; one more h·q for an attention output gate, which Bridge's count leaves out), 4h of norms and
    (3 gated | 2)·h·F of MLP; a final norm of 2h; the embedding V·h, twice when untied. An
    encoder's patch merger: (h·m²)² + h·m²·out."""
    h, q = shape.hidden, shape.heads * shape.kv_channels
    kv = shape.query_groups * shape.kv_channels
    attention = 2 * h * q + 2 * h * kv + (h * q if shape.output_gate else 0)
    mlp = (3 if shape.gated else 2) * h * shape.ffn_hidden
    layers = float(shape.layers * (attention + 4 * h + mlp))
    merger = float((h * shape.merge ** 2) ** 2 + h * shape.merge ** 2 * shape.out_hidden) if shape.merge else 0.0
    if encoder:
        return ParameterCount(layers=layers, other=2.0 * h + merger)
    embedding = float(shape.vocab * h)
    return ParameterCount(layers=layers, embedding=embedding, output=0.0 if tied else embedding, other=2.0 * h)


NORM_STATS = 8.0  # a LayerNorm's mean and rstd a row, fp32 (an RMSNorm keeps 4)


def attention_bytes(shape: Any, qk_norm: bool = False) -> float:
    """What a standard attention mixer of :class:`~mimo_accel.costs.flops.FlopsShape` ``shape``
    keeps for its backward a token, bf16, the part TP splits (megatron-core's ``SelfAttention``
    with flash attention, counted by tests/test_layout_terms.py): flash attention's q, k, v (the
    rotated q and k, a contiguous v), its output and log-sum-exp (fp32 a head), and the rotary
    tables (cos and sin for q and k); with an output gate (``attention_output_gate``) the gate's
    copy and the projection's input (without one the projection reads flash attention's output);
    with q/k norms (``qk_layernorm``) the whole qkv projection's output (the k norm keeps a view of
    it), q's own copy where the gate interleaves it, and the norms' statistics."""
    q, kv, d = shape.heads * shape.kv_channels, shape.query_groups * shape.kv_channels, shape.kv_channels
    out = 2.0 * (q + 2 * kv) + 2.0 * q + 4.0 * shape.heads + 8.0 * d
    if shape.output_gate:
        out += 4.0 * q
    if qk_norm:
        out += 2.0 * ((2 if shape.output_gate else 1) * q + 2 * kv) + NORM_STATS * (shape.heads + shape.query_groups)
        out += 2.0 * q if shape.output_gate else 0.0
    return out


CHUNK = 64  # FLA's chunked delta rule: its WY factors a token, one per chunk position


def linear_attention_bytes(key_heads: int, value_heads: int, key_dim: int, value_dim: int) -> float:
    """What megatron-core's Gated DeltaNet mixer (``ssm/gated_delta_net/gdn.py``) keeps a token,
    bf16, the part TP splits, with FLA's conv, l2norm and chunked kernel (GPUs): the conv's input
    (made contiguous), the l2norm's output and rstd, q and k repeated up to the value heads
    (``_prepare_input_for_gated_delta_rule``), the kernel's v, g (fp32), β and WY factors A, g's
    input α, the gated norm's input, gate z and rstd, and the output projection's input."""
    qk, v = key_heads * key_dim, value_heads * value_dim
    return (2.0 * (2 * qk + v) + 2.0 * 2 * qk + 4.0 * 2 * key_heads + 2.0 * 2 * value_heads * key_dim
            + 2.0 * v + 4.0 * value_heads + 2.0 * value_heads + 2.0 * value_heads * CHUNK + 2.0 * value_heads
            + 2.0 * v + 2.0 * v + 4.0 * value_heads + 2.0 * v)


def stored_per_token(m, kind: str) -> float:
    """What one layer kind of module ``m`` keeps for its backward a token at TP 1, without sequence
    parallelism or recompute, bf16: ``attention`` (its norm and attention), ``linear_attention``
    (its norm and a linear-attention mixer), ``mlp`` (its norm and MLP), ``logits`` (the final
    norm, the output layer and the fp32 cross-entropy over the vocabulary)."""
    h = float(m.hidden)
    block = 4.0 * h + NORM_STATS
    return {"attention": block + m.attention_bytes, "linear_attention": block + m.linear_bytes,
            "mlp": block + m.mlp_bytes, "logits": block + 4.0 * m.vocab}[kind]


def stage_parameters(m, layers: tuple[int, ...]) -> list[float]:
    """Each PP stage's parameters of module ``m`` (before TP splits them), ``layers`` a stage: its
    layers' share, the final norm spread as Bridge spreads it, the embedding on the first stage,
    the output layer (or the tied embedding's copy) on the last."""
    p, pp = m.params, len(layers)
    if not m.is_language:
        return [p.total]
    out = [n / m.layers * p.layers + p.other / pp for n in layers]
    out[0] += p.embedding
    out[-1] += p.output if pp == 1 else (p.output or p.embedding)
    return out


@dataclass(frozen=True)
class Footprint:
    """Bytes on a module's most loaded GPU (its ``stage``): ``states`` (weights, gradients,
    optimizer states) and ``activations``, of which ``unsplit`` are what TP does not divide
    without sequence parallelism and ``logits`` the last stage's output layer and loss."""

    states: float
    activations: float
    stage: int = 0
    unsplit: float = 0.0
    logits: float = 0.0

    @property
    def total(self) -> float:
        return self.states + self.activations

    @property
    def gib(self) -> float:
        return self.total / GIB

    def why(self, name: str, usable_gib: float) -> str:
        """Which terms make it too large."""
        terms = [f"{self.states / GIB:.1f} states", f"{self.activations / GIB:.1f} activations"]
        terms += [f"{v / GIB:.1f} of them {what}" for v, what in (
            (self.unsplit, "what TP splits only with sequence parallelism"), (self.logits, "the logits"))
                  if v >= 0.05 * GIB]
        where = f" on stage {self.stage}" if self.stage else ""
        return (f"{name} needs {self.gib:.1f} GiB per GPU{where} ({', '.join(terms)}), over the {usable_gib:.1f} GiB "
                "usable")


class Memory:
    """Each module's :class:`Footprint` of ``model`` (a :class:`~mimo_accel.tools.layout.models.ModelSpec`)
    under ``settings`` on ``machine``: its language micro-batch holds ``mbs / dp`` sequences of
    ``seq_length``; an encoder's, the rows of the heaviest samples the data can form
    (``heaviest_rows(module, samples)``)."""

    def __init__(self, model, settings: JobSettings, machine, seq_length: int,
                 heaviest_rows: Callable[[str, int], float]):
        self.model, self.settings, self.machine, self.seq_length = model, settings, machine, seq_length
        self.heaviest_rows = lru_cache(maxsize=None)(heaviest_rows)
        self.language = lru_cache(maxsize=None)(self.language)
        self.encoder = lru_cache(maxsize=None)(self.encoder)

    def _bytes(self, dp: int, trained: bool) -> float:
        s = self.settings
        return bytes_per_parameter(dp, trained=trained, distributed_optimizer=s.distributed_optimizer,
                                   precision=s.precision)

    def _layer(self, m, tp: int, linear: bool = False, whole: bool = False) -> tuple[float, float]:
        """One layer's stored bytes per token (``whole``: as if nothing were recomputed): (all of
        it, the part TP leaves whole)."""
        s, h = self.settings, float(m.hidden)
        whole_tp = 2.0 * (4.0 * h + NORM_STATS)  # both blocks' norms: what TP splits only with sequence parallelism
        split = (m.linear_bytes if linear else m.attention_bytes) + m.mlp_bytes
        if s.recompute == "full" and not whole:
            return (2.0 * h / tp, 0.0) if s.sequence_parallel else (2.0 * h, 2.0 * h)
        return ((whole_tp + split) / tp, 0.0) if s.sequence_parallel else (whole_tp + split / tp, whole_tp)

    def _layers(self, m, tp: int, layers: float) -> tuple[float, float]:
        """``layers`` of ``m``'s layers' stored bytes per token and micro-batch (linear ones in
        proportion), and their part TP leaves whole."""
        lin = layers * m.linear_layers / m.layers
        (a, ua), (b, ub) = self._layer(m, tp), self._layer(m, tp, linear=True)
        return (layers - lin) * a + lin * b, (layers - lin) * ua + lin * ub

    def language(self, module, mbs: int, micro_batches: int, layers: tuple[int, ...]) -> Footprint:
        """The language model's most loaded stage at ``module``'s sizes (a
        :class:`~mimo_accel.modules.Module`), ``layers`` a stage."""
        tp, pp, dp = module.tp, module.pp, module.dp
        m, s = self.model.modules[module.name], self.settings
        wide = 2.0 if s.precision == "fp32" else 1.0
        t = float(mbs // dp * self.seq_length)
        full = self._layer(m, tp, whole=True)[0] if s.recompute == "full" else 0.0  # the layer recomputed
        worst = None
        for i, (n, shard) in enumerate(zip(layers, stage_parameters(m, layers))):
            first, last = i == 0, i == pp - 1
            per, unsplit = self._layers(m, tp, n)
            if first:
                embed = 8.0 + m.hidden
                per, unsplit = (per + embed / tp, unsplit) if s.sequence_parallel else (per + embed, unsplit + embed)
            k = min(micro_batches, pp - i)
            logits = 4.0 * t * m.hidden / (tp if s.sequence_parallel else 1) + 4.0 * t * m.vocab / tp if last else 0.0
            acts = (k * t * per + t * full + logits) * wide if m.trained else 0.0
            f = Footprint(shard / tp * self._bytes(dp, m.trained), acts, i, k * t * unsplit * wide, logits * wide)
            worst = f if worst is None or f.total > worst.total else worst
        return worst

    def encoder(self, module, mbs: int, micro_batches: int, stages_after: int) -> Footprint:
        """An encoder's GPU (``module``: its :class:`~mimo_accel.modules.Module`; one stage, before the
        language model's first), holding ``min(W, stages_after + 1)`` micro-batches of the heaviest
        ``mbs / dp`` samples each."""
        name, tp, dp = module.name, module.tp, module.dp
        m, s = self.model.modules[name], self.settings
        states = m.params.total / tp * self._bytes(dp, m.trained)
        if not m.trained:
            return Footprint(states, 0.0)
        in_flight = min(micro_batches, int(stages_after) + 1)
        rows = self.heaviest_rows(name, mbs // dp * in_flight)
        per, unsplit = self._layers(m, tp, m.layers)
        wide = 2.0 if s.precision == "fp32" else 1.0
        return Footprint(states, rows * per * wide, 0, rows * unsplit * wide)

    def of_layout(self, layout) -> dict[str, Footprint]:
        from mimo_accel.tools.layout.spec import stage_layers

        lang = layout.language
        out = {m.name: self.encoder(m, layout.mbs, layout.micro_batches, lang.pp) for m in layout.modules.encoders}
        out[lang.name] = self.language(lang, layout.mbs, layout.micro_batches,
                                       stage_layers(self.model.modules[lang.name].layers, lang.pp, layout.first,
                                                    layout.last))
        return out

    def usable_gib(self) -> float:
        return self.machine.memory_gib * (1 - self.machine.reserve)

    def why_not(self, footprints: dict[str, Footprint]) -> Optional[str]:
        """None where every module fits; else which does not, and which terms make it too large."""
        if math.isinf(self.machine.memory_gib):
            return None
        over = [f.why(n, self.usable_gib()) for n, f in footprints.items() if f.gib > self.usable_gib()]
        return "; ".join(over) or None
