"""Everything a layout is priced against (:class:`Problem`), built one way (:func:`build`) from what
a user asks (:class:`Request`), whichever command asks it: the model, what a sample costs each
module in seconds, the machine, the drawn steps, the job's settings and the memory model, from a
preset, a model file or a profiled run, a workload or a cost index, and the machine's figures."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Optional

from mimo_accel.costs import CostIndex
from mimo_accel.costs.flops import peak_tflops_of
from mimo_accel.modules import LANGUAGE, Modules, module
from mimo_accel.tools.layout.draws import Draws, draw
from mimo_accel.tools.layout.machine import CPU, CUSTOM, GPUS, Machine, machine_for
from mimo_accel.tools.layout.memory import LAUNCHER, JobSettings, Memory
from mimo_accel.tools.layout.models import DEFAULT_MODEL, ModelSpec, model_named
from mimo_accel.tools.layout.seconds import FlopsSeconds, LearntSeconds, Seconds
from mimo_accel.tools.layout.spec import LayoutSpec

__all__ = ["DEFAULT_GPU", "DEFAULT_STEPS", "DataRequest", "MachineRequest", "Problem", "Request", "build"]

DEFAULT_GPU = "h100"
DEFAULT_WORKLOAD = "receipts"
DEFAULT_STEPS = 8  # draws every layout is priced on, whichever command prices it
MAX_STEPS = 1024
SCALE_RANGE = (0.5, 2.0)  # a scale outside it says the data priced is not the run's
UNMEASURED = ("the encoder's GPU cost is its FLOPs at a stated efficiency, not measured: an encoder's GPU time is "
              "not its FLOPs' share (upstream's Qwen3.5-VL tutorial measured 23.5-35 % less step time from moving "
              "the encoder off the language ranks, where its FLOPs are 2-7 % of the language model's); measure it: "
              "run a few steps with MIMO_ACCEL=profile MIMO_ACCEL_PROFILE=DIR on your GPUs, then layout --from DIR")


@dataclass(frozen=True)
class MachineRequest:
    """The machine asked for: a GPU of the table (``--gpu``) and figures replacing the table's."""

    gpu: Optional[str] = None
    peak_tflops: Optional[float] = None
    memory_gib: Optional[float] = None
    gpus_per_node: int = 8
    intra_node_gbps: Optional[float] = None
    inter_node_gbps: Optional[float] = None
    reserve: Optional[float] = None


@dataclass(frozen=True)
class DataRequest:
    """The samples asked for: a workload profile (name or path) or a cost index, ``rehearsal``: the
    profile's CPU-sized samples; the global batch, the sequence length, the draws and their seed."""

    workload: Optional[str] = None
    index: Optional[str] = None
    rehearsal: bool = False
    gbs: Optional[int] = None
    seq_length: Optional[int] = None
    steps: int = DEFAULT_STEPS
    seed: int = 0


@dataclass(frozen=True)
class Request:
    """What a user asks a layout to be priced against: ``model`` (a preset or a model file; with
    ``profile``, it replaces the configs the profile holds), ``profile`` (a profiled run's
    directory), the machine, the data, the frozen encoders and the job's settings."""

    model: Optional[str] = None
    profile: Optional[str] = None
    machine: MachineRequest = MachineRequest()
    data: DataRequest = DataRequest()
    frozen: tuple[str, ...] = ()
    settings: JobSettings = JobSettings()
    # the fields of ``settings`` the user gave (over a profile's, which replaces the rest); none given
    # with settings other than the launcher's: all of them
    settings_given: tuple[str, ...] = ()


@dataclass(frozen=True)
class Problem:
    """What every layout of one search is priced against."""

    model: ModelSpec
    seconds: Seconds
    machine: Machine
    draws: Draws
    memory: Memory
    settings: JobSettings
    gpus: Optional[int] = None  # the profiled run's GPUs: the default budget
    profiled: Optional[LayoutSpec] = None  # the profiled run's own layout
    upstream_packing: bool = True  # whether the Bridge priced packs in its batches (main), or not (0.6)
    tp_held: Mapping[str, int] = field(default_factory=dict)  # modules whose TP is not searched (CPU profiles)
    notes: list[str] = field(default_factory=list)

    @property
    def gbs(self) -> int:
        return self.draws.gbs

    @property
    def frozen(self) -> tuple[str, ...]:
        return self.model.frozen

    def note(self, key: str, message: str) -> None:
        text = message.removeprefix("mimo_accel reorder: ")
        if text not in self.notes:
            self.notes.append(text)


def _device_machine(device: Optional[str]) -> Optional[str]:
    """The machine table's name of a profile's device (cpu, a GPU of the table), None where unknown."""
    if device is None:
        return None
    if str(device).lower() in (CPU, "gloo"):
        return CPU
    found = peak_tflops_of(device)
    return next((k for k, v in GPUS.items() if found and v[0] == found[0]), None)


def _machine(asked: MachineRequest, device: Optional[str], notes: list[str]) -> Machine:
    flags = {k: v for k, v in asked.__dict__.items() if k != "gpu"}
    measured = _device_machine(device)
    if asked.gpu is not None:
        if measured is not None and str(asked.gpu).lower() != measured:
            # a profile's learnt seconds are its device's: another device's would need its own
            raise ValueError(f"--gpu {asked.gpu}: the profile was measured on {device}, and what it learnt is that "
                             "device's seconds; drop --gpu to price its layouts there, or price another machine from "
                             "the model's FLOPs (--model, without --from)")
        return machine_for(asked.gpu, **flags)
    if asked.peak_tflops is not None and asked.memory_gib is not None:
        return machine_for(CUSTOM, **flags)
    if device is not None:
        if measured == CPU:
            notes.append("the profile ran on CPU ranks: memory unbounded, every communication term 0")
        elif measured is None:
            raise ValueError(f"the profile ran on {device}, which is not in the GPU table; give --gpu (one of "
                             f"{', '.join([*GPUS, CPU])}) or --peak-tflops and --memory-gib")
        return machine_for(measured, **flags)
    notes.append(f"priced on {GPUS[DEFAULT_GPU][0]} (the default; --gpu to change)")
    return machine_for(DEFAULT_GPU, **flags)


def build(request: Request) -> Problem:
    """The :class:`Problem` of ``request``; ValueError naming the fix for what does not go together."""
    from mimo_accel.workloads import Profile, load_profile

    notes: list[str] = []
    data = request.data
    if not 1 <= data.steps <= MAX_STEPS:
        raise ValueError(f"--steps {data.steps}: give 1 to {MAX_STEPS} drawn global batches")
    profiled = None
    if request.profile is not None:
        from mimo_accel.tools.layout.profiled import read_profiled

        profiled = read_profiled(str(request.profile), model_named(request.model) if request.model else None)
        spec = profiled.model
        notes += profiled.notes
    else:
        spec = model_named(request.model or DEFAULT_MODEL)
    for f in request.frozen:
        if f not in spec.encoders:
            raise ValueError(f"--frozen {f}: not an encoder of {spec.name} (its encoders: {', '.join(spec.encoders)})")
        if profiled is not None and spec.modules[f].trained:
            raise ValueError(f"--frozen {f}: the run in {request.profile} trained it, and its learnt costs are a "
                             "trained module's; price a frozen encoder from a model (--model) instead")
    spec = spec.with_frozen(request.frozen)
    machine = _machine(request.machine, profiled.device if profiled else None, notes)
    if profiled is not None:
        sizes = {m: (tp, pp) for m, (tp, pp, _) in profiled.sizes.items()}
        seconds = LearntSeconds(profiled.learnt, sizes, spec, machine, profiled.source, profiled.overheads,
                                profiled.stages, profiled.stage_layers)
    else:
        seconds = FlopsSeconds(spec, machine)
        notes.append(f"each module at {seconds.efficiency[LANGUAGE]:.2f} of the peak on one GPU, a stated default; "
                     + UNMEASURED)
    rehearsal = data.rehearsal
    if profiled is not None and data.index is None and not rehearsal and not machine.communication:
        rehearsal = True  # a profile of CPU ranks is a rehearsal's: its samples are rehearsal-sized
        notes.append("a profile of CPU ranks: the workload's rehearsal-sized samples drawn (--index FILE: the run's "
                     "own cost index)")
    if data.index is not None:
        source = CostIndex.load(data.index)
    else:
        if data.workload is None:
            notes.append(f"samples drawn from the workload {DEFAULT_WORKLOAD} (--workload or --index to change)")
        source = load_profile(data.workload or DEFAULT_WORKLOAD)
    seq = data.seq_length or spec.seq_length or (source.seq_length if isinstance(source, Profile) else None)
    if rehearsal and isinstance(source, Profile):
        seq = data.seq_length or source.rehearsal.seq_length
    if seq is None:
        raise ValueError("give --seq-length: neither the model nor the cost index says the sequence length")
    batch = data.gbs or (profiled.gbs if profiled else None) or spec.gbs
    if batch is None:
        raise ValueError("give --gbs (the global batch): neither the model nor the profile says it")

    def drawn(gbs: int) -> Draws:
        return draw(source, steps=data.steps, gbs=gbs, seq_length=seq, seed=data.seed, rehearsal=rehearsal,
                    pixels=spec.image_pixels)

    draws = drawn(batch)
    if spec.image_pixels and isinstance(source, Profile) and not rehearsal:
        notes.append(f"images resized into {spec.image_pixels[0]:,} … {spec.image_pixels[1]:,} pixels, as "
                     f"{spec.name}'s processor resizes them")
    if draws.clipped:
        notes.append(f"{draws.clipped} of {data.steps * batch} drawn samples hold more than {seq} tokens: cut at the "
                     "sequence length")
    settings = _settings(request, profiled, notes)
    memory = Memory(spec, settings, machine, seq, lambda m, k: draws.heaviest_rows(m, spec.encoders, k))
    own = _profiled_layout(profiled, batch, spec)
    held = {}
    if profiled is not None:
        _scale_to_replay(profiled, spec, seconds, drawn, notes)
        if not machine.communication:
            # gloo's TP collectives run on the timed thread, and a CPU's GEMMs do not lose efficiency with
            # width as a GPU's do: how TP scales there is not modelled, so it stays as the run measured it
            held = {m: tp for m, (tp, _, _) in profiled.sizes.items()}
            notes.append("on CPU ranks each module's TP is held at the profiled run's "
                         f"({', '.join(f'{m} {tp}' for m, tp in held.items())}): how TP scales there is not modelled")
    packing = profiled.upstream_packing if profiled is not None else True
    return Problem(spec, seconds, machine, draws, memory, settings, profiled.world if profiled else None, own,
                   packing, held, notes)


def _settings(request: Request, profiled, notes: list[str]) -> JobSettings:
    """The job's settings: the profiled run's as it was built, each one the user gave over it; else
    the user's, else the launcher's. Said where the profile's are used."""
    if profiled is None or profiled.settings is None:
        return request.settings
    given = request.settings_given or (() if request.settings.source == LAUNCHER else
                                       tuple(k for k in request.settings.to_doc() if k != "source"))
    ran = profiled.settings
    over = {k: getattr(request.settings, k) for k in given if getattr(request.settings, k) != getattr(ran, k)}
    source = ran.source + (f"; the command line's {', '.join(over)} over it" if over else "")
    settings = JobSettings(**{**ran.to_doc(), **over, "source": source})
    notes.append(f"memory settings from the profile: {_said(ran, _SETTINGS)} (as the run was built)"
                 + (f"; given on the command line over them: {_said(settings, tuple(over))}" if over else ""))
    return settings


_SETTINGS = ("sequence_parallel", "recompute", "distributed_optimizer", "precision")


def _said(settings: JobSettings, fields) -> str:
    words = {"sequence_parallel": "sequence parallelism", "recompute": "recompute",
             "distributed_optimizer": "the distributed optimizer", "precision": "precision"}

    def value(v) -> str:
        return ("on" if v else "off") if isinstance(v, bool) else str(v)

    return ", ".join(f"{words[k]} {value(getattr(settings, k))}" for k in fields)


def _scale_to_replay(profiled, spec: ModelSpec, seconds: LearntSeconds, drawn, notes: list[str]) -> None:
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
        modelled = price_steps(own, drawn(own.gbs), seconds, (plan,)).step_time[plan] - seconds.step_end(own)
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
    sizes = profiled.sizes
    mods = Modules(tuple(module(m, dp, tp=tp, pp=pp) for m, (tp, pp, dp) in sizes.items() if m != LANGUAGE)
                   + (module(LANGUAGE, sizes[LANGUAGE][2], tp=sizes[LANGUAGE][0], pp=sizes[LANGUAGE][1]),))
    if profiled.mbs % mods.grid:
        return None
    first, last = profiled.split  # the language model's split as it ran
    return LayoutSpec(mods, profiled.mbs, gbs, spec.frozen, first=first, last=last)
