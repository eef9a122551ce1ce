"""What a sample costs each module of a layout, in seconds, at that layout's TP and PP: one
:class:`~mimo_accel.costs.CostModel` per layout (its coefficients), priced by the cost index as
the job's planner prices it; each language PP stage's share of a micro-batch; and what the step
adds after its pipeline.

Two sources (docs/design.md, *The layout advisor*):

- :class:`FlopsSeconds`, from each module's config: ``passes · FLOPs / (tp · peak · e · r(tp))``,
  passes 3 (forward and backward) or 1 (frozen), e the module's efficiency on one GPU (a stated
  :data:`DEFAULT_EFFICIENCY` unless given), r the share of it kept at TP tp. An encoder's GPU cost
  is not its FLOPs' share (upstream measured more); only a profile measures it;
- :class:`LearntSeconds`, a profiled run's learnt model, for its own TP t0 and PP: the compute
  part scaled by ``(t0/t) · r(t0)/r(t)``, its TP communication replaced by the new TP's.

A language stage's share: its layers' work, plus the output layer and the loss on the last
stage (from FLOPs: the output layer's 2·h·V a token, and the loss, priced apart: from a
profile: what its last stage measured beyond its layers) and the embedding on the first (from a
profile).

The loss (FLOPs mode): megatron-core's fused cross-entropy over the vocabulary
(``fusions/fused_cross_entropy.py``; Bridge's GPT providers set ``cross_entropy_loss_fusion``) is
memory-bound, fp32 over each TP rank's V/tp logits a token: the cast to fp32 and its max (2 bytes
in, 4 out), the shift, exp and sum (4 in, 4 out), the normalisation (4 in, 4 out), and in the
backward the gradient back to bf16 (4 in, 2 out): :data:`LOSS_BYTES_PER_LOGIT`, at the GPU's HBM
bandwidth (a peak). Its FLOPs are a few per logit, nothing beside the output layer's 2·h.

Communication (:class:`Communication`), each a term of the per-sample coefficients or of the
step's end, at the machine's bandwidths, none overlapped with compute:

- TP: per layer and pass, an all-gather and a reduce-scatter around attention and around the MLP,
  ``4 · (tp−1)/tp · 2h`` bytes a token, two passes when trained;
- PP: each stage boundary sends a micro-batch's activations forward and their gradient back,
  each TP rank its ``1/tp`` share, ``2 · (pp−1) · 2h / tp`` bytes a token;
- the encoder -> language transfer: one ``out_hidden``-wide bf16 row per ``merge²`` encoder rows,
  forward and (trained) its gradient back;
- DP at the step's end: the distributed optimizer's reduce-scatter of the gradients (in fp32, as
  the Qwen3.5-VL example's ``grad_reduce_in_fp32=True``, not overlapped: ``overlap_grad_reduce=False``)
  and all-gather of the bf16 weights, ``(dp−1)/dp · (4 + 2) · P_shard`` bytes per GPU (P_shard its
  most loaded stage's parameters over TP); the step waits for the slowest module's.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Optional

import numpy as np

from mimo_accel.costs import CostModel, ModuleCost
from mimo_accel.costs.flops import passes
from mimo_accel.modules import LANGUAGE
from mimo_accel.tools.layout.machine import Machine
from mimo_accel.tools.layout.memory import stage_parameters
from mimo_accel.tools.layout.models import ModelSpec, ModuleModel
from mimo_accel.tools.layout.spec import LayoutSpec, stage_layers

__all__ = ["DEFAULT_EFFICIENCY", "Communication", "FlopsSeconds", "LearntSeconds", "Seconds", "tp_efficiency"]

DEFAULT_EFFICIENCY = 0.40  # a module's achieved share of the GPU's dense BF16 peak on one GPU
LOSS_BYTES_PER_LOGIT = 28.0  # the fused cross-entropy's memory traffic a logit, forward and backward
HALF_WIDTH = 256  # per-GPU GEMM width at which a GEMM keeps half its wide-matrix efficiency
BF16, FP32 = 2, 4  # bytes


def tp_efficiency(hidden: int, tp: int) -> float:
    """r(tp): the share of its one-GPU efficiency a module keeps when TP splits its GEMMs, each
    GEMM's efficiency taken as ``w / (w + 256)`` of its width per GPU ``w = hidden / tp``."""
    w = hidden / tp
    return (w / (w + HALF_WIDTH)) / (hidden / (hidden + HALF_WIDTH))


@dataclass(frozen=True)
class Communication:
    """The communication terms of a layout on ``machine`` (all 0 where it has none: CPU ranks)."""

    machine: Machine

    def _bw(self, within_node: bool) -> float:
        return self.machine.bandwidth(within_node)

    def tp_per_token(self, m: ModuleModel, tp: int, trained: bool = True) -> float:
        if tp == 1 or not self.machine.communication:
            return 0.0
        return (2 if trained else 1) * 4 * (tp - 1) / tp * BF16 * m.hidden * m.layers / self._bw(True)

    def pp_per_token(self, m: ModuleModel, tp: int, pp: int, module_gpus: int) -> float:
        if pp == 1 or not self.machine.communication:
            return 0.0
        return 2 * (pp - 1) * BF16 * m.hidden / tp / self._bw(module_gpus <= self.machine.gpus_per_node)

    def transfer_per_row(self, m: ModuleModel, world: int, trained: bool = True) -> float:
        if not self.machine.communication or m.is_language:
            return 0.0
        return (2 if trained else 1) * BF16 * m.out_hidden / m.merge ** 2 / self._bw(world <= self.machine.gpus_per_node)

    def dp_sync(self, m: ModuleModel, tp: int, dp: int, layers: tuple[int, ...], trained: bool = True) -> float:
        if dp == 1 or not trained or not self.machine.communication:
            return 0.0
        within = tp * dp <= self.machine.gpus_per_node  # Bridge's grids: tp fastest, then dp
        return (dp - 1) / dp * (FP32 + BF16) * max(stage_parameters(m, layers)) / tp / self._bw(within)


class Seconds:
    """A source of per-sample seconds (module docstring): ``cost_model(layout)``, ``step_end(layout)``,
    ``stage_shares(layout, tokens, sq_tokens)``, ``micro_batch_overheads(layout)``."""

    model: Optional[ModelSpec] = None
    comm: Optional[Communication] = None
    measured = False  # whether every module's seconds were measured (a profile), not assumed

    def cost_model(self, layout: LayoutSpec) -> CostModel:
        world = layout.gpus
        return CostModel(modules={m.name: self._module(m.name, m.tp, m.pp, m.size, world, self._trained(m.name, layout))
                                  for m in layout.modules}, fit={"units": "seconds"})

    def _trained(self, name: str, layout: LayoutSpec) -> bool:
        return name not in layout.frozen and self.module_of(name).trained

    def layers(self, layout: LayoutSpec) -> tuple[int, ...]:
        """The language model's layers on each of the layout's PP stages."""
        return stage_layers(self.module_of(LANGUAGE).layers, layout.language.pp, layout.first, layout.last)

    def step_end(self, layout: LayoutSpec) -> float:
        if self.model is None or self.comm is None:
            return 0.0
        return max(self.comm.dp_sync(self.model.modules[m.name], m.tp, m.dp,
                                     self.layers(layout) if m.is_language else (1,), self._trained(m.name, layout))
                   for m in layout.modules)

    def _module(self, name: str, tp: int, pp: int, gpus: int, world: int,
                trained: bool) -> ModuleCost:  # pragma: no cover
        raise NotImplementedError

    def micro_batch_overheads(self, layout: LayoutSpec) -> dict[str, float]:
        """Per module, what one micro-batch costs a replica whatever its size (its stages summed):
        nothing unless a profile measured it."""
        return {}

    def _stage_work(self, layers: tuple[int, ...], tp: int = 1) -> Optional[np.ndarray]:
        """(stages, 3): each stage's (per micro-batch, per token, per token²) work at TP ``tp``;
        None: not known."""
        return None

    def stage_token_work(self, layers: tuple[int, ...]) -> float:
        """The busiest of the stages' work per token (inf where nothing tells the stages apart)."""
        work = self._stage_work(layers)
        return math.inf if work is None else float(work[:, 1].max())

    def stage_shares(self, layout: LayoutSpec, tokens: float, sq_tokens: float) -> Optional[list[float]]:
        """Each language PP stage's share of a micro-batch of ``tokens`` real tokens (Σ L² ``sq_tokens``)
        a replica; None where it has one stage, or nothing tells the stages apart (then even)."""
        if layout.language.pp == 1 or self.model is None:
            return None
        work = self._stage_work(self.layers(layout), layout.language.tp)
        if work is None:
            return None
        times = work @ np.array([1.0, tokens, sq_tokens])
        return (times / times.sum()).tolist() if times.sum() > 0 else None

    def _comm_a(self, m: ModuleModel, tp: int, pp: int, gpus: int, world: int, trained: bool) -> float:
        return sum(self._comm_terms(m, tp, pp, gpus, world, trained).values())

    def _comm_terms(self, m: ModuleModel, tp: int, pp: int, gpus: int, world: int, trained: bool) -> dict[str, float]:
        c = self.comm
        return {"tp_comm": c.tp_per_token(m, tp, trained),
                "p2p": c.pp_per_token(m, tp, pp, gpus) + c.transfer_per_row(m, world, trained)}

    def comm_parts(self, layout: LayoutSpec) -> dict[str, dict[str, float]]:
        """Per module, the seconds a token (an encoder's row) spends in TP collectives
        (``tp_comm``) and P2P sends (``p2p``: PP stages, encoder -> language): the communication
        part of its cost model's per-token coefficient."""
        if self.comm is None:
            return {}
        return {m.name: self._comm_terms(self.module_of(m.name), m.tp, m.pp, m.size, layout.gpus,
                                         self._trained(m.name, layout)) for m in layout.modules}

    def module_of(self, name: str) -> ModuleModel:
        if self.model is None or name not in self.model.modules:
            have = ", ".join(self.model.modules) if self.model is not None else "none"
            raise ValueError(f"the layout names module {name!r}, which the model does not have (its modules: {have}); "
                             "name the modules as the model does")
        return self.model.modules[name]


class FlopsSeconds(Seconds):
    """Seconds from each module's FLOPs at ``efficiency[name]`` (default :data:`DEFAULT_EFFICIENCY`)."""

    def __init__(self, model: ModelSpec, machine: Machine, efficiency: Optional[Mapping[str, float]] = None):
        if not machine.peak_tflops:
            raise ValueError(f"pricing {model.name} from its FLOPs needs the GPU's peak ({machine.name} has none: CPU "
                             "ranks are priced from a profile of them, --from DIR); give --gpu, one of the table, or "
                             "--peak-tflops")
        self.model, self.machine, self.comm = model, machine, Communication(machine)
        self.efficiency = {m: float((efficiency or {}).get(m, DEFAULT_EFFICIENCY)) for m in model.modules}
        self._module = lru_cache(maxsize=None)(self._module)

    def _per_flop(self, name: str, tp: int, trained: bool) -> float:
        m = self.module_of(name)
        return passes(trained) / (tp * self.machine.peak_tflops * 1e12 * self.efficiency[name]
                                  * tp_efficiency(m.hidden, tp))

    def loss_per_token(self, m: ModuleModel, tp: int) -> float:
        """The loss's seconds a token on the language model's last stage (module docstring)."""
        if not m.is_language or not m.vocab or not self.machine.memory_gbps:
            return 0.0
        return LOSS_BYTES_PER_LOGIT * m.vocab / tp / (self.machine.memory_gbps * 1e9)

    def _module(self, name: str, tp: int, pp: int, gpus: int, world: int, trained: bool) -> ModuleCost:
        m, per = self.module_of(name), self._per_flop(name, tp, trained)
        return ModuleCost(m.per_token * per + self.loss_per_token(m, tp) + self._comm_a(m, tp, pp, gpus, world, trained),
                          m.per_sq_token * per)

    def _stage_work(self, layers: tuple[int, ...], tp: int = 1) -> np.ndarray:
        """In seconds at TP ``tp``: the layers' FLOPs, the output layer's and the loss on the last."""
        m = self.module_of(LANGUAGE)
        per = self._per_flop(LANGUAGE, tp, True)
        per_layer = np.array([0.0, m.per_token - m.output_per_token, m.per_sq_token]) * per / m.layers
        work = np.outer(layers, per_layer)
        work[-1, 1] += m.output_per_token * per + self.loss_per_token(m, tp)
        return work

    def describe(self) -> str:
        eff = ", ".join(f"{m} {e:.2f}" for m, e in self.efficiency.items())
        loss = (f", the loss at {self.machine.memory_gbps:g} GB/s HBM" if self.loss_per_token(
            self.module_of(LANGUAGE), 1) else "")
        return f"FLOPs of {self.model.name} at {eff} of the peak (assumed, not measured){loss}"


class LearntSeconds(Seconds):
    """Seconds from a profiled run's ``learnt`` model, each module's measured at ``profiled[name]``
    = (tp0, pp0): its coefficients are a replica's time (stages summed); ``overheads``: per module,
    what a micro-batch costs a replica whatever its size, as the run measured it (each layer's
    launches and Python, once per micro-batch: a layout with fewer, larger micro-batches pays it
    fewer times), the same at any TP and PP (every rank of a stage runs every op of its layers);
    ``stages``: the language model's (c, a, b) per profiled stage, ``held`` the layers each held
    (empty: even)."""

    measured = True

    def __init__(self, learnt: CostModel, profiled: Mapping[str, tuple[int, int]], model: ModelSpec,
                 machine: Machine, source: str, overheads: Optional[Mapping[str, float]] = None,
                 stages: Sequence[tuple[float, float, float]] = (), held: Sequence[int] = ()):
        self.learnt, self.profiled, self.model = learnt, dict(profiled), model
        self.machine, self.comm, self.source = machine, Communication(machine), source
        self.overheads = dict(overheads or {})
        layers = model.modules[LANGUAGE].layers
        self.stages = _stage_parts(stages, held or [layers / len(stages)] * len(stages)) if len(stages) > 1 else None
        self.scale = 1.0  # every compute cost's, to the profiled run's replayed step (:func:`fit_scale`)
        self._module = lru_cache(maxsize=None)(self._module)

    def fit_scale(self, modelled: float, replayed: float) -> None:
        """Scale every compute cost (not communication) so that the profiled layout's modelled step
        ``modelled`` (at scale 1) is its replayed one: what the model leaves out of a measured step
        (the times' noise along the pipeline's critical path, a stage's fixed costs) the same share
        of every layout's step."""
        self.scale = replayed / modelled
        self._module.cache_clear()

    def micro_batch_overheads(self, layout: LayoutSpec) -> dict[str, float]:
        return {m.name: self.scale * self.overheads[m.name] for m in layout.modules if m.name in self.overheads}

    def _stage_work(self, layers: tuple[int, ...], tp: int = 1) -> Optional[np.ndarray]:
        """From the profiled stages (their TP's): a stage of ``n`` layers holds ``n`` layers' work, the first the
        embedding, the last the output layer and the loss (what the profiled first and last stages
        cost over a middle one's layers: the output layer alone is a layer's worth at a small
        model's width)."""
        if self.stages is None:
            return None
        layer, first, last = self.stages
        work = np.outer(layers, layer)
        work[0] += first
        work[-1] += last
        return work

    def _module(self, name: str, tp: int, pp: int, gpus: int, world: int, trained: bool) -> ModuleCost:
        m = self.module_of(name)
        c = self.learnt.of(name)
        t0, _ = self.profiled[name]
        ratio = (t0 / tp) * tp_efficiency(m.hidden, t0) / tp_efficiency(m.hidden, tp) * self.scale
        compute_a = max(c.a - self.comm.tp_per_token(m, t0, trained), 0.0)
        return ModuleCost(compute_a * ratio + self._comm_a(m, tp, pp, gpus, world, trained), c.b * ratio, c.k * ratio)

    def describe(self) -> str:
        at = ", ".join(f"{m} tp{t}" for m, (t, _) in self.profiled.items())
        over = "".join(f"; {m} {c * 1e3:.1f} ms a micro-batch" for m, c in self.overheads.items())
        return f"learnt in {self.source} (at {at}), scaled to each layout's TP{over}"


def _stage_parts(stages: Sequence[tuple[float, float, float]], held: Sequence[float]):
    """``(per layer, the first stage's own, the last stage's own)`` as ``(c, a, b)`` arrays, from the
    profiled stages' fits and the layers each held: a layer's from the middle stages (the first's
    where there are none: its embedding taken as nothing), what the first and last hold beyond their
    layers clipped at 0."""
    per_stage = np.array(stages, dtype=np.float64)
    n = np.asarray(held, dtype=np.float64)[:, None]
    middle = (per_stage / n)[1:-1] if len(stages) > 2 else (per_stage / n)[:1]
    layer = np.median(middle, axis=0)
    first = np.clip(per_stage[0] - n[0] * layer, 0.0, None)
    last = np.clip(per_stage[-1] - n[-1] * layer, 0.0, None)
    return layer, first, last
