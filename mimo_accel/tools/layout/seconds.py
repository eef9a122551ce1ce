"""What a sample costs each module of a layout, in seconds, at that layout's TP and PP: one
:class:`~mimo_accel.costs.CostModel` per layout (its coefficients), priced by the cost index as
the job's planner prices it, and what the step adds after its pipeline.

Three sources (docs/design.md, *The layout advisor*):

- :class:`FlopsSeconds`, from each module's config: ``steps · FLOPs / (tp · peak · e · r(tp))``,
  steps 3 (forward and backward) or 1 (frozen), e the module's efficiency on one GPU
  (``calibrate-gpu``'s points, else :data:`DEFAULT_EFFICIENCY`), r the share of it kept at TP tp;
- :class:`LearntSeconds`, a profiled run's learnt model, for its own TP t0 and PP: the compute
  part scaled by ``(t0/t) · r(t0)/r(t)``, its TP communication replaced by the new TP's;
- :class:`GivenCosts`, a cost model as it is (``simulate --cost-model``, or the built-in units):
  no scaling, no communication.

Communication (:class:`Communication`), each a term of the per-sample coefficients or of the
step's end, at the machine's bandwidths, none overlapped with compute:

- TP (sequence parallel): per layer and pass, an all-gather and a reduce-scatter around
  attention and around the MLP, ``4 · (tp−1)/tp · 2h`` bytes a token, two passes when trained;
- PP: each stage boundary sends a micro-batch's activations forward and their gradient back,
  each TP rank its ``1/tp`` share, ``2 · (pp−1) · 2h / tp`` bytes a token;
- the encoder -> language transfer: one ``out_hidden``-wide bf16 row per ``merge²`` encoder rows,
  forward and (trained) its gradient back;
- DP at the step's end: the distributed optimizer's reduce-scatter of the gradients (in fp32, as
  the Qwen3.5-VL example's ``grad_reduce_in_fp32=True``, not overlapped: ``overlap_grad_reduce=False``)
  and all-gather of the bf16 weights, ``(dp−1)/dp · (4 + 2) · P_shard`` bytes per GPU; the step
  waits for the slowest module's.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Optional

import numpy as np

from mimo_accel.costs import CostModel, ModuleCost
from mimo_accel.modules import LANGUAGE
from mimo_accel.tools.layout.machine import Machine
from mimo_accel.tools.layout.models import ModelSpec, ModuleModel
from mimo_accel.tools.layout.spec import LayoutSpec

__all__ = ["DEFAULT_EFFICIENCY", "Communication", "FlopsSeconds", "GivenCosts", "LearntSeconds",
           "efficiency_from_points", "tp_efficiency"]

DEFAULT_EFFICIENCY = 0.40  # a module's achieved share of the GPU's dense BF16 peak on one GPU
HALF_WIDTH = 256  # per-GPU GEMM width at which a GEMM keeps half its wide-matrix efficiency
BF16, FP32 = 2, 4  # bytes


def tp_efficiency(hidden: int, tp: int) -> float:
    """r(tp): the share of its one-GPU efficiency a module keeps when TP splits its GEMMs, each
    GEMM's efficiency taken as ``w / (w + 256)`` of its width per GPU ``w = hidden / tp``."""
    w = hidden / tp
    return (w / (w + HALF_WIDTH)) / (hidden / (hidden + HALF_WIDTH))


def shard_parameters(m: ModuleModel, tp: int, pp: int) -> float:
    """The parameters on the module's most loaded GPU (its first or last stage: the embedding or
    the output layer, both V·h)."""
    p = m.params
    if not m.is_language:
        return p.total / tp
    return (p.layers / pp + p.embedding + (p.output if pp == 1 else 0.0) + p.other / pp) / tp


@dataclass(frozen=True)
class Communication:
    """The communication terms of a layout on ``machine`` (all 0 where it has none: CPU ranks)."""

    machine: Machine

    def _bw(self, within_node: bool) -> float:
        return self.machine.bandwidth(within_node)

    def tp_per_token(self, m: ModuleModel, tp: int, trained: bool = True) -> float:
        if tp == 1 or not self.machine.communication:
            return 0.0
        passes = 2 if trained else 1
        return passes * 4 * (tp - 1) / tp * BF16 * m.hidden * m.layers / self._bw(True)

    def pp_per_token(self, m: ModuleModel, tp: int, pp: int, module_gpus: int) -> float:
        if pp == 1 or not self.machine.communication:
            return 0.0
        return 2 * (pp - 1) * BF16 * m.hidden / tp / self._bw(module_gpus <= self.machine.gpus_per_node)

    def transfer_per_row(self, m: ModuleModel, world: int, trained: bool = True) -> float:
        if not self.machine.communication or m.is_language:
            return 0.0
        passes = 2 if trained else 1
        return passes * BF16 * m.out_hidden / m.merge ** 2 / self._bw(world <= self.machine.gpus_per_node)

    def dp_sync(self, m: ModuleModel, tp: int, pp: int, dp: int, trained: bool = True) -> float:
        if dp == 1 or not trained or not self.machine.communication:
            return 0.0
        within = tp * dp <= self.machine.gpus_per_node  # Bridge's grids: tp fastest, then dp
        return (dp - 1) / dp * (FP32 + BF16) * shard_parameters(m, tp, pp) / self._bw(within)


class _Seconds:
    """A source of per-sample seconds: ``cost_model(layout)``, ``step_end(layout)``, ``units``."""

    units = "s"
    model: Optional[ModelSpec] = None
    comm: Optional[Communication] = None

    def cost_model(self, layout: LayoutSpec) -> CostModel:
        world = layout.gpus
        return CostModel(modules={m.name: self._module(m.name, m.tp, m.pp, m.size, world, self._trained(m.name, layout))
                                  for m in layout.modules}, fit={"units": "seconds"})

    def _trained(self, name: str, layout: LayoutSpec) -> bool:
        return name not in layout.frozen and self.module_of(name).trained

    def step_end(self, layout: LayoutSpec) -> float:
        if self.model is None or self.comm is None:
            return 0.0
        return max((self.comm.dp_sync(self.model.modules[m.name], m.tp, m.pp, m.dp, self._trained(m.name, layout))
                    for m in layout.modules), default=0.0)

    def _module(self, name: str, tp: int, pp: int, gpus: int, world: int,
                trained: bool) -> ModuleCost:  # pragma: no cover
        raise NotImplementedError

    def micro_batch_overheads(self, layout: LayoutSpec) -> dict[str, float]:
        """Per module, what one micro-batch costs a replica whatever its size (its stages summed):
        nothing unless a profile measured it."""
        return {}

    def stage_shares(self, pp: int, tokens: float, sq_tokens: float) -> Optional[list[float]]:
        """Each of the language model's ``pp`` stages' share of a micro-batch of ``tokens`` real
        tokens (Σ L² ``sq_tokens``) a replica; None: even (nothing measured tells otherwise)."""
        return None

    def _comm_a(self, m: ModuleModel, tp: int, pp: int, gpus: int, world: int, trained: bool) -> float:
        c = self.comm
        return (c.tp_per_token(m, tp, trained) + c.pp_per_token(m, tp, pp, gpus)
                + c.transfer_per_row(m, world, trained))

    def module_of(self, name: str) -> ModuleModel:
        if self.model is None or name not in self.model.modules:
            have = ", ".join(self.model.modules) if self.model is not None else "none"
            raise ValueError(f"the layout names module {name!r}, which the model does not have (its modules: {have}); "
                             "name the modules as the model does")
        return self.model.modules[name]


class FlopsSeconds(_Seconds):
    """Seconds from each module's FLOPs at ``efficiency[name]`` (default :data:`DEFAULT_EFFICIENCY`)."""

    def __init__(self, model: ModelSpec, machine: Machine, efficiency: Optional[Mapping[str, float]] = None,
                 efficiency_source: str = ""):
        if not machine.peak_tflops:
            raise ValueError(f"pricing {model.name} from its FLOPs needs the GPU's peak ({machine.name} has none: CPU "
                             "ranks are priced from a profile of them, --from DIR); give --gpu, one of the table, or "
                             "--peak-tflops")
        self.model, self.machine, self.comm = model, machine, Communication(machine)
        self.efficiency = {m: float((efficiency or {}).get(m, DEFAULT_EFFICIENCY)) for m in model.modules}
        self.efficiency_source = efficiency_source or f"the default {DEFAULT_EFFICIENCY:.2f} of the peak"
        self._module = lru_cache(maxsize=None)(self._module)

    def _module(self, name: str, tp: int, pp: int, gpus: int, world: int, trained: bool) -> ModuleCost:
        m = self.module_of(name)
        steps = 3.0 if trained else 1.0
        per_flop = steps / (tp * self.machine.peak_tflops * 1e12 * self.efficiency[name] * tp_efficiency(m.hidden, tp))
        return ModuleCost(m.per_token * per_flop + self._comm_a(m, tp, pp, gpus, world, trained),
                          m.per_sq_token * per_flop)

    def describe(self) -> str:
        eff = ", ".join(f"{m} {e:.2f}" for m, e in self.efficiency.items())
        return f"FLOPs of {self.model.name} at {eff} of the peak ({self.efficiency_source})"


class LearntSeconds(_Seconds):
    """Seconds from a profiled run's ``learnt`` model, each module's measured at ``profiled[name]``
    = (tp0, pp0): its coefficients are a replica's time (stages summed); ``overheads``: per module,
    what a micro-batch costs a replica whatever its size, as the run measured it (each layer's
    launches and Python, once per micro-batch: a layout with fewer, larger micro-batches pays it
    fewer times), the same at any TP and PP (every rank of a stage runs every op of its layers)."""

    def __init__(self, learnt: CostModel, profiled: Mapping[str, tuple[int, int]], model: ModelSpec,
                 machine: Machine, source: str, overheads: Optional[Mapping[str, float]] = None,
                 stages: Sequence[tuple[float, float, float]] = ()):
        self.learnt, self.profiled, self.model = learnt, dict(profiled), model
        self.machine, self.comm, self.source = machine, Communication(machine), source
        self.overheads = dict(overheads or {})
        self.stages = _stage_parts(stages, model.modules[LANGUAGE].layers) if len(stages) > 1 else None
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

    def stage_shares(self, pp: int, tokens: float, sq_tokens: float) -> Optional[list[float]]:
        """From the profiled stages: a stage of ``pp`` holds ``layers / pp`` layers, the first the
        embedding, the last the output layer and the loss (what the profiled first and last stages
        cost over a middle one's layers: the output layer alone is a layer's worth at a small
        model's width)."""
        if self.stages is None:
            return None
        layer, first, last = self.stages
        per = self.model.modules[LANGUAGE].layers / pp
        work = np.array([per * layer] * pp)
        work[0] += first
        work[-1] += last
        x = np.array([1.0, tokens, sq_tokens])
        times = work @ x
        return (times / times.sum()).tolist() if times.sum() > 0 else None


    def _module(self, name: str, tp: int, pp: int, gpus: int, world: int, trained: bool) -> ModuleCost:
        m = self.module_of(name)
        c = self.learnt.of(name)
        t0, _ = self.profiled[name]
        ratio = (t0 / tp) * tp_efficiency(m.hidden, t0) / tp_efficiency(m.hidden, tp)
        compute_a = max(c.a - self.comm.tp_per_token(m, t0, trained), 0.0)
        ratio *= self.scale
        return ModuleCost(compute_a * ratio + self._comm_a(m, tp, pp, gpus, world, trained), c.b * ratio, c.k * ratio)

    def describe(self) -> str:
        at = ", ".join(f"{m} tp{t}" for m, (t, _) in self.profiled.items())
        over = "".join(f"; {m} {c * 1e3:.1f} ms a micro-batch" for m, c in self.overheads.items())
        return f"learnt in {self.source} (at {at}), scaled to each layout's TP{over}"


def _stage_parts(stages: Sequence[tuple[float, float, float]], layers: int):
    """``(per layer, the first stage's own, the last stage's own)`` as ``(c, a, b)`` arrays, from the
    profiled stages' fits: a layer's from the middle stages (the first's where there are none: its
    embedding taken as nothing), what the first and last hold beyond their layers clipped at 0."""
    per_stage = np.array(stages, dtype=np.float64)
    held = layers / len(stages)
    middle = per_stage[1:-1] if len(stages) > 2 else per_stage[:1]
    layer = np.median(middle, axis=0) / held
    first = np.clip(per_stage[0] - held * layer, 0.0, None)
    last = np.clip(per_stage[-1] - held * layer, 0.0, None)
    return layer, first, last


class GivenCosts(_Seconds):
    """A cost model as it is: its coefficients for every layout, nothing added."""

    def __init__(self, model: Optional[CostModel] = None, source: str = "default"):
        self.given = CostModel() if model is None else model
        self.source = source
        self.units = "s" if self.given.fit.get("units") == "seconds" else "cost units"

    def cost_model(self, layout: LayoutSpec) -> CostModel:
        return self.given

    def describe(self) -> str:
        return f"the cost model {self.source} ({self.units})"


def efficiency_from_points(path: str, peak_tflops: Optional[float] = None) -> tuple[dict[str, float], str]:
    """``({"language": e, "encoder": e}, where)``: each module's measured FLOPs over its measured
    time over the peak, summed over its points, from a ``calibrate-gpu --points`` file (one GPU,
    TP 1). The peak: ``peak_tflops``, else the device the file names."""
    from mimo_accel.costs.flops import FlopsShape, peak_tflops_of
    from mimo_accel.tools.calibrate_gpu.results import read_points

    doc, vision, language = read_points(path)
    device = (doc.get("device") or {}).get("name")
    peak = peak_tflops or (peak_tflops_of(device) or (None, None))[1]
    if not peak:
        raise ValueError(f"--calibration {path}: its points were measured on {device or 'an unnamed device'}, whose "
                         "peak is not in the table; give --peak-tflops")
    sv, sl = doc["shapes"]["vision"], doc["shapes"][LANGUAGE]
    shapes = {
        "encoder": FlopsShape(layers=sv["depth"], hidden=sv["hidden_size"], ffn_hidden=sv["intermediate_size"],
                              heads=sv["num_heads"], query_groups=sv["num_heads"],
                              kv_channels=sv["hidden_size"] // sv["num_heads"], causal=False,
                              merge=sv["spatial_merge_size"], out_hidden=sv["out_hidden_size"]),
        LANGUAGE: FlopsShape(layers=sl["layers"], hidden=sl["hidden_size"], ffn_hidden=sl["ffn_hidden_size"],
                             heads=sl["num_heads"], query_groups=sl["num_query_groups"],
                             kv_channels=sl["hidden_size"] // sl["num_heads"], gated=True),
    }
    out = {}
    for key, measured in (("encoder", vision), (LANGUAGE, language)):
        flops = sum(3.0 * shapes[key].forward(*m.point.features()[:2]) for m in measured)
        seconds = math.fsum(m.median for m in measured)
        if not measured or seconds <= 0:
            raise ValueError(f"--calibration {path}: no {key} points with times; measure again with calibrate-gpu")
        out[key] = flops / seconds / (peak * 1e12)
        if not 0 < out[key] <= 1:
            raise ValueError(f"--calibration {path}: its {key} points give {out[key]:.2f} of the {peak:g} TFLOP/s peak, "
                             "which no GPU reaches; give the device's own peak with --peak-tflops, or measure again")
    return out, f"measured on {device} ({path})"
