"""Per-GPU training memory of one module of a MegatronMIMO layout: weights, gradients and optimizer
states of its most loaded shard, and the activations of the micro-batches its first stage holds
under 1F1B. Pure: no numpy, no torch, no megatron.

It is Megatron-Bridge's own estimate (``src/megatron/bridge/training/utils/theoretical_memory_utils.py``:
``estimate_training_memory``, ``_count_parameters``, ``_dense_parameters_on_most_loaded_shard``,
``_bytes_per_parameter``, ``_compute_activation_memory_bytes``), which works on one
``TransformerConfig`` and which ``report_theoretical_memory`` skips for MegatronMIMO; here it is
applied to each module's own config and parallel sizes::

    weights, gradients, optimizer  = P_shard · B
    P_shard  = (P_layers / pp + P_embedding [+ P_output where pp = 1]) / tp   (the most loaded stage)
    B        = 6 + 12 / dp with the distributed optimizer (bf16 weights and gradients, fp32 master
               weights and two Adam moments sharded over DP), 18 without it; 2 for a frozen module
               (its bf16 weights only)
    activations (the first stage; sequence parallelism and selective recompute)
             = [T · h · (18 + 4 F / h) · L / pp + 8 T + T · h] · k  [+ 4 T · h · (1 + V / h) where pp = 1]
               / tp

T the tokens of one local micro-batch, h hidden, F the FFN width, V the vocabulary, L layers, k
the micro-batches the stage holds at once: ``min(W, pp)`` for the language model's first stage
(Megatron's ``min(1, W / pp)`` over all L layers), ``min(W, stages after it + 1)`` for an encoder
(the stage before the language model's first: it runs as many warm-up forwards as there are
stages after it). An encoder has no token embedding and no output layer: its activations are its
layers' alone. A frozen module keeps no activations for a backward.

Left out, as Bridge's estimate leaves them out: the allocator's fragmentation, the CUDA context,
communication buffers and kernel workspaces (the advisor keeps a stated share of each GPU free
for them), full recompute or CPU offload, a layer kind's own activations (linear-attention
layers are counted as attention layers).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

__all__ = ["GIB", "Footprint", "ParameterCount", "activation_bytes_per_token", "bytes_per_parameter",
           "encoder_memory", "language_memory", "parameter_count"]

GIB = float(1 << 30)


def bytes_per_parameter(dp: int, *, trained: bool = True, distributed_optimizer: bool = True) -> float:
    """Bytes each parameter of a shard takes: Bridge's ``_bytes_per_parameter`` (6 + 12/dp with the
    distributed optimizer over the module's DP, 18 without); 2 (bf16 weights) for a frozen module."""
    if not trained:
        return 2.0
    return 6.0 + 12.0 / max(1, int(dp)) if distributed_optimizer else 18.0


@dataclass(frozen=True)
class ParameterCount:
    """A module's parameters: ``layers`` all its transformer layers (norms included), ``embedding``
    the input embedding (V·h; 0 for an encoder), ``output`` an untied output layer (V·h; 0 when
    tied or for an encoder), ``other`` what sits beside the layers on its one stage (an encoder's
    patch embedding and merger; the final norm)."""

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


def activation_bytes_per_token(hidden: int, ffn_hidden: int) -> float:
    """One layer's stored activations per token (bytes), with sequence parallelism and selective
    recompute before TP divides them: Megatron's h·(18 + 4F/h) (Korthikanti et al., Table 2)."""
    return float(hidden) * (18.0 + 4.0 * float(ffn_hidden) / float(hidden))


@dataclass(frozen=True)
class Footprint:
    """Bytes on a module's most loaded GPU: ``states`` (weights, gradients, optimizer states) and
    ``activations`` (its first stage's, as many micro-batches as it holds at once)."""

    states: float
    activations: float

    @property
    def total(self) -> float:
        return self.states + self.activations

    @property
    def gib(self) -> float:
        return self.total / GIB


def _positive(**sizes: int) -> None:
    for name, v in sizes.items():
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive integer, got {v!r}")


def language_memory(params: ParameterCount, *, layers: int, hidden: int, ffn_hidden: int, vocab: int, tp: int,
                    pp: int, dp: int, tokens: float, micro_batches: int, trained: bool = True,
                    distributed_optimizer: bool = True) -> Footprint:
    """The language model's most loaded GPU (Bridge's estimate, applied to this module alone):
    ``tokens`` the tokens of one local micro-batch (sequence length × local micro-batch size),
    ``micro_batches`` W, the step's micro-batches."""
    _positive(tp=tp, pp=pp, dp=dp, micro_batches=micro_batches)
    shard = params.layers / pp + params.embedding + (params.output if pp == 1 else 0.0) + params.other / pp
    states = shard / tp * bytes_per_parameter(dp, trained=trained, distributed_optimizer=distributed_optimizer)
    if not trained:
        return Footprint(states, 0.0)
    t = float(tokens)
    per_micro_batch = t * activation_bytes_per_token(hidden, ffn_hidden) * layers / pp + 8.0 * t + t * hidden
    acts = per_micro_batch * min(micro_batches, pp)
    if pp == 1:  # the output layer's input and the loss
        acts += 4.0 * t * hidden * (1.0 + vocab / hidden)
    return Footprint(states, acts / tp)


def encoder_memory(params: ParameterCount, *, layers: int, hidden: int, ffn_hidden: int, tp: int, dp: int,
                   rows: float, micro_batches: int, stages_after: int, trained: bool = True,
                   distributed_optimizer: bool = True) -> Footprint:
    """An encoder's GPU (one stage, before the language model's first): ``rows`` its rows in one
    local micro-batch, held for ``min(W, stages_after + 1)`` micro-batches at once."""
    _positive(tp=tp, dp=dp, micro_batches=micro_batches)
    states = params.total / tp * bytes_per_parameter(dp, trained=trained, distributed_optimizer=distributed_optimizer)
    if not trained:
        return Footprint(states, 0.0)
    in_flight = min(micro_batches, int(stages_after) + 1)
    acts = float(rows) * activation_bytes_per_token(hidden, ffn_hidden) * layers * in_flight
    return Footprint(states, acts / tp)


def fits(footprint: Footprint, memory_gib: float, reserve: float) -> bool:
    """Whether ``footprint`` fits in ``memory_gib`` with a ``reserve`` share kept free."""
    return math.isinf(memory_gib) or footprint.total <= memory_gib * GIB * (1.0 - reserve)
