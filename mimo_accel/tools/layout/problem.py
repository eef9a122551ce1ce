"""Everything a layout is priced against (:class:`Problem`): the model, what a sample costs each
module in seconds, the machine, the drawn steps and the memory model, from a preset, a model file
or a profiled run, a workload or a cost index, and the machine's flags (:func:`build_problem`)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Optional, Sequence

from mimo_accel.costs import CostIndex
from mimo_accel.costs.flops import peak_tflops_of
from mimo_accel.modules import LANGUAGE, Modules, module
from mimo_accel.tools.layout.draws import Draws, draw
from mimo_accel.tools.layout.footprint import MemoryModel
from mimo_accel.tools.layout.machine import CPU, CUSTOM, GPUS, Machine, machine_for
from mimo_accel.tools.layout.models import ModelSpec, model_named
from mimo_accel.tools.layout.seconds import FlopsSeconds, LearntSeconds, efficiency_from_points
from mimo_accel.tools.layout.spec import LayoutSpec, spec_text

__all__ = ["Problem", "build_problem", "DEFAULT_GPU", "DEFAULT_WORKLOAD"]

DEFAULT_GPU = "h100"
DEFAULT_WORKLOAD = "receipts"


@dataclass
class Problem:
    """What every layout of one search is priced against."""

    model: ModelSpec
    seconds: object
    machine: Machine
    draws: Draws
    memory: MemoryModel
    frozen: tuple[str, ...]
    gpus: Optional[int] = None  # the profiled run's GPUs: the default budget
    profiled: Optional[LayoutSpec] = None  # the profiled run's own layout
    notes: list[str] = field(default_factory=list)
    # modules whose TP is not searched: a profile of CPU ranks, whose TP scaling the advisor does not model
    tp_held: dict[str, int] = field(default_factory=dict)

    @property
    def gbs(self) -> int:
        return self.draws.gbs

    def note(self, key: str, message: str) -> None:
        text = message.removeprefix("mimo_accel reorder: ")
        if text not in self.notes:
            self.notes.append(text)


def _is_profile(source) -> bool:
    p = Path(str(source))
    return p.is_dir()


def _device_machine(device: Optional[str]) -> Optional[str]:
    """The machine table's name of a profile's device (cpu, a GPU of the table), None where unknown."""
    if device is None:
        return None
    if str(device).lower() in (CPU, "gloo"):
        return CPU
    found = peak_tflops_of(device)
    return next((k for k, v in GPUS.items() if found and v[0] == found[0]), None)


def _machine(gpu, device: Optional[str], notes: list[str], **flags) -> Machine:
    if gpu is not None:
        measured = _device_machine(device)
        if measured is not None and str(gpu).lower() != measured:
            # a profile's learnt seconds are its device's: another device's would need its own
            raise ValueError(f"--gpu {gpu}: the profile was measured on {device}, and what it learnt is that device's "
                             "seconds; drop --gpu to price its layouts there, or price another machine from the "
                             "model's FLOPs (--model, without --from)")
        return machine_for(gpu, **flags)
    if flags.get("peak_tflops") is not None and flags.get("memory_gib") is not None:
        return machine_for(CUSTOM, **flags)
    if device is not None:
        name = _device_machine(device)
        if name == CPU:
            notes.append("the profile ran on CPU ranks: memory unbounded, every communication term 0")
        elif name is None:
            raise ValueError(f"the profile ran on {device}, which is not in the GPU table; give --gpu (one of "
                             f"{', '.join([*GPUS, CPU])}) or --peak-tflops and --memory-gib")
        return machine_for(name, **flags)
    notes.append(f"priced on {GPUS[DEFAULT_GPU][0]} (the default; --gpu to change)")
    return machine_for(DEFAULT_GPU, **flags)


def build_problem(source, *, model: Optional[str] = None, gpu: Optional[str] = None,
                  peak_tflops: Optional[float] = None, memory_gib: Optional[float] = None, gpus_per_node: int = 8,
                  intra_node_gbps: Optional[float] = None, inter_node_gbps: Optional[float] = None,
                  reserve: Optional[float] = None, calibration: Optional[str] = None,
                  workload=None, index: Optional[str | CostIndex] = None, rehearsal: bool = False,
                  gbs: Optional[int] = None, seq_length: Optional[int] = None, steps: int = 4, seed: int = 0,
                  frozen: Sequence[str] = (), distributed_optimizer: bool = True) -> Problem:
    """A :class:`Problem` from ``source``: a model preset name, a :class:`ModelSpec`, a model file,
    or a profiled run's directory (``model`` then replaces the configs its header holds)."""
    from mimo_accel.workloads import Profile, load_profile

    notes: list[str] = []
    flags = dict(peak_tflops=peak_tflops, memory_gib=memory_gib, gpus_per_node=gpus_per_node,
                 intra_node_gbps=intra_node_gbps, inter_node_gbps=inter_node_gbps, reserve=reserve)
    profiled = None
    if isinstance(source, ModelSpec):
        spec = source
    elif _is_profile(source):
        from mimo_accel.tools.layout.profiled import read_profiled

        profiled = read_profiled(str(source), model_named(model) if model else None)
        spec = profiled.model
        notes += profiled.notes
    else:
        spec = model_named(str(source))
    for f in frozen:
        if f not in spec.encoders:
            raise ValueError(f"--frozen {f}: not an encoder of {spec.name} (its encoders: {', '.join(spec.encoders)})")
        if profiled is not None and spec.modules[f].trained:
            raise ValueError(f"--frozen {f}: the run in {source} trained it, and its learnt costs are a trained "
                             "module's; price a frozen encoder from a model (--model) instead")
    if frozen:
        spec = replace(spec, modules={n: replace(m, trained=m.trained and n not in frozen)
                                      for n, m in spec.modules.items()})
    machine = _machine(gpu, profiled.device if profiled else None, notes, **flags)
    if profiled is not None:
        if calibration:
            raise ValueError("--calibration prices a model from its FLOPs; --from DIR prices it with what the run "
                             "learnt: give one or the other")
        sizes = {m: (tp, pp) for m, (tp, pp, _) in profiled.sizes.items()}
        seconds = LearntSeconds(profiled.learnt, sizes, spec, machine, profiled.source, profiled.overheads,
                                profiled.stages)
    else:
        efficiency, where = None, ""
        if calibration:
            measured, where = efficiency_from_points(calibration, peak_tflops)
            efficiency = {m: measured[LANGUAGE if m == LANGUAGE else "encoder"] for m in spec.modules}
        seconds = FlopsSeconds(spec, machine, efficiency, where)
        if not calibration:
            notes.append(f"each module at {seconds.efficiency[LANGUAGE]:.2f} of the peak on one GPU, a stated default: "
                         "give --calibration FILE (`mimo-accel calibrate-gpu --points FILE`) or --from DIR for measured costs")
    if profiled is not None and index is None and not rehearsal and not machine.communication:
        rehearsal = True  # a profile of CPU ranks is a rehearsal's: its samples are rehearsal-sized
        notes.append("a profile of CPU ranks: the workload's rehearsal-sized samples drawn (--index FILE: the run's "
                     "own cost index)")
    data = index if index is not None else (workload or DEFAULT_WORKLOAD)
    if isinstance(data, (str, Path)) and index is not None:
        data = CostIndex.load(data)
    elif isinstance(data, str):
        if workload is None:
            notes.append(f"samples drawn from the workload {DEFAULT_WORKLOAD} (--workload or --index to change)")
        data = load_profile(data)
    seq = seq_length or spec.seq_length or (data.seq_length if isinstance(data, Profile) and not rehearsal else None)
    if rehearsal and isinstance(data, Profile):
        seq = seq_length or data.rehearsal.seq_length
    if seq is None:
        raise ValueError("give --seq-length: neither the model nor the cost index says the sequence length")
    batch = gbs or (profiled.gbs if profiled else None) or spec.gbs
    if batch is None:
        raise ValueError("give --gbs (the global batch): neither the model nor the profile says it")
    draws = draw(data, steps=steps, gbs=batch, seq_length=seq, seed=seed, rehearsal=rehearsal,
                 pixels=spec.image_pixels)
    if spec.image_pixels and isinstance(data, Profile) and not rehearsal:
        notes.append(f"images resized into {spec.image_pixels[0]:,} … {spec.image_pixels[1]:,} pixels, as "
                     f"{spec.name}'s processor resizes them")
    if draws.clipped:
        notes.append(f"{draws.clipped} of {steps * batch} drawn samples hold more than {seq} tokens: cut at the "
                     "sequence length")
    frozen_all = spec.frozen
    memory = MemoryModel(spec, draws, machine, distributed_optimizer=distributed_optimizer, frozen=frozen_all)
    own = _profiled_layout(profiled, batch, spec)
    if profiled is not None:
        _scale_to_replay(profiled, spec, seconds, data, steps, seq, seed, rehearsal, notes)
    held = {}
    if profiled is not None and not machine.communication:
        # gloo's TP collectives run on the timed thread, and a CPU's GEMMs do not lose efficiency with
        # width as a GPU's do: how TP scales there is not modelled, so it stays as the run measured it
        held = {m: tp for m, (tp, _, _) in profiled.sizes.items()}
        notes.append("on CPU ranks each module's TP is held at the profiled run's "
                     f"({', '.join(f'{m} {tp}' for m, tp in held.items())}): how TP scales there is not modelled")
    return Problem(spec, seconds, machine, draws, memory, frozen_all, profiled.world if profiled else None,
                   own, notes, held)


SCALE_RANGE = (0.5, 2.0)  # a scale outside it says the data priced is not the run's


def _scale_to_replay(profiled, spec: ModelSpec, seconds, data, steps: int, seq: int, seed: int, rehearsal: bool,
                     notes: list[str]) -> None:
    """Scale every compute cost so that the run's own layout, priced as it ran (at its own global
    batch, on the data given), takes the step its measured times replay; said either way. Not
    where the run has no replay or no layout of this search, or where the scale falls outside
    :data:`SCALE_RANGE` (the data given is not the run's: it would scale the data's difference)."""
    from mimo_accel.tools.layout.pricing import price_steps

    own = _profiled_layout(profiled, profiled.gbs, spec) if profiled.gbs else None
    why = ("its profile has no per-micro-batch times to replay" if not profiled.replayed_step_s else
           f"its layout (global batch {profiled.gbs}, micro-batch {profiled.mbs}) is not one of this search"
           if own is None else None)
    if why is None:
        plan = "mimo_accel" if profiled.planned else "padded"
        own_draws = draw(data, steps=steps, gbs=own.gbs, seq_length=seq, seed=seed, rehearsal=rehearsal,
                         pixels=spec.image_pixels)
        modelled = price_steps(own, own_draws, seconds, (plan,)).step_time[plan] - seconds.step_end(own)
        scale = profiled.replayed_step_s / modelled if modelled > 0 else float("inf")
        said = f"the run's own layout modelled {modelled:.3f} s a step, replayed {profiled.replayed_step_s:.3f} s"
        if SCALE_RANGE[0] <= scale <= SCALE_RANGE[1]:
            seconds.fit_scale(modelled, profiled.replayed_step_s)
            notes.append(f"each module's compute costs x{scale:.3f}: {said} (what the model leaves out of a measured "
                         "step, the same share of every layout's)")
            return
        why = (f"{said}: the data priced is not the run's (give its cost index with --index, or --workload NAME "
               "--rehearsal for a rehearsal's profile)")
    notes.append(f"costs not scaled to the run's replayed step: {why}")


def _profiled_layout(profiled, gbs: int, spec: ModelSpec) -> Optional[LayoutSpec]:
    """The run's own layout at ``gbs`` (None where its micro-batch is unknown or does not divide it)."""
    if profiled is None or profiled.mbs is None or gbs % profiled.mbs:
        return None
    mods = Modules(tuple(module(m, dp, tp=tp, pp=pp) for m, (tp, pp, dp) in profiled.sizes.items()
                         if m != LANGUAGE) + (module(LANGUAGE, profiled.sizes[LANGUAGE][2],
                                                     tp=profiled.sizes[LANGUAGE][0], pp=profiled.sizes[LANGUAGE][1]),))
    if profiled.mbs % mods.grid:
        return None
    return LayoutSpec(spec_text(mods, profiled.mbs, gbs, spec.frozen), mods, profiled.mbs, gbs, spec.frozen)
