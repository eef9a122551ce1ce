"""One table: each user-facing feature -> the patches it needs; each patch -> its targets and replacement.

The way Liger-Kernel maps a model to its apply function: to see what a feature touches, read its
row in :data:`FEATURES` (and what it keeps in the runtime, in :data:`KEEPS`); to see what one
upstream name becomes, read its :class:`Patch` in :data:`PATCHES`. The engine reads this table
and nothing else; the replacements themselves live in
the runtime's patch modules, :mod:`mimo_accel.runtime.patches` (this file only wires). A replacement is made by ``replace(original,
runtime)``: the original upstream function and the :class:`~mimo_accel.runtime.state.Runtime`
it works with, passed explicitly.

A patch can be limited to the upstream shapes that have its target (``when``): upstream main's
step packing (``sequence_pack.py``), #5525's scalable reads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

from mimo_accel.config import AccelConfig
from mimo_accel.patching import targets as T
from mimo_accel.runtime.measuring import activity, profiling
from mimo_accel.runtime.patches import fanin, loader_scope, loaders, native_packing, profiler, setup, step
from mimo_accel.runtime.state import Runtime


@dataclass(frozen=True)
class Patch:
    """One upstream name, at every site it is bound, and what it becomes."""

    targets: tuple[T.Target, ...]
    replace: Callable  # (original, runtime) -> replacement
    when: Optional[Callable[[T.Shape], bool]] = None  # the shapes that have it (None: every shape)

    def applies_to(self, shape: T.Shape) -> bool:
        return self.when is None or self.when(shape)


def _native_packing(shape: T.Shape) -> bool:
    return shape.native_packing


def _scalable_reads(shape: T.Shape) -> bool:
    return shape.scalable_reads


PATCHES = {
    # the loader scope: which MIMO loaders are built now, for which split, on which layout
    "loader builder": Patch(T.LOADER_BUILDER, loader_scope.wrap_loader_builder),
    "setup": Patch(T.SETUP_ENTRY, setup.wrap_setup),
    "sampling info": Patch(T.SAMPLING_INFO, loader_scope.wrap_sampling_info),
    # this rank's share of every global micro-batch (planned with reorder)
    "pretraining loader": Patch(T.PRETRAINING_LOADER, loaders.wrap_pretraining_loader),
    "canonical loader": Patch(T.CANONICAL_LOADER, loaders.wrap_canonical_loader, when=_scalable_reads),
    # the forward step: the rank's role, the local batch (tag check, profiling, packing)
    "module dp info": Patch(T.MODULE_DP_INFO, step.wrap_module_dp_info),
    "slice": Patch(T.SLICE, step.wrap_slice),
    "get batch": Patch(T.GET_BATCH, step.wrap_get_batch, when=_scalable_reads),
    # fan-in with uneven encoder rows, forward and backward
    "attach split sizes": Patch(T.FAN_IN[:1], fanin.wrap_attach_split_sizes),
    "communicate shapes": Patch(T.FAN_IN[1:2], fanin.wrap_communicate_shapes),
    "split at batch dim": Patch(T.FAN_IN[2:], fanin.wrap_split_at_batch_dim),
    # upstream main's step packing, with mimo_accel's packer
    "pack language shard": Patch(T.NATIVE_PACK[:1], native_packing.wrap_pack_language_shard,
                                 when=_native_packing),
    "resolve step packing": Patch(T.NATIVE_PACK[1:], native_packing.wrap_resolve_step_packing,
                                  when=_native_packing),
    # the profiler's hooks; the step's end and the run's (every feature: rank 0's step line)
    "encode": Patch(T.ENCODE, profiler.wrap_encode),
    "optimizer step": Patch(T.OPTIMIZER_STEP, profiler.wrap_optimizer_step),
    "train entry": Patch(T.TRAIN_ENTRY, profiler.wrap_train_entry),
}

# Every feature needs the loader scope and the rank's layout, the step's role and local batch
# (under #5525's scalable reads the tag on upstream's own shard), and the step's and the run's end.
_SCOPE = ("loader builder", "setup", "sampling info", "canonical loader")
_STEP = ("module dp info", "slice", "get batch", "optimizer step", "train entry")
_FAN_IN = ("attach split sizes", "communicate shapes", "split at batch dim")

# User-facing feature -> the patches it needs.
FEATURES = {
    "sharded_reads": (*_SCOPE, "pretraining loader", *_STEP, *_FAN_IN),
    # a mode of the sharded loader (implies sharded_reads): nothing of its own to patch
    "reorder": (),
    "packing": (*_SCOPE, *_STEP, *_FAN_IN, "pack language shard", "resolve step packing"),
    "profile": (*_SCOPE, *_STEP, "encode"),
    # the cost model learnt while training: the profiler's module timers, without its file
    "calibrate_online": (*_SCOPE, *_STEP, "encode"),
}



def _profiling(runtime: Runtime) -> None:
    runtime.profiling = profiling.Profiling(runtime)


def _activity(runtime: Runtime) -> None:
    runtime.activity = activity.Activity(runtime)


# Feature -> what it keeps in the Runtime while it is on, built at enable() (Runtime.close() releases it).
KEEPS = {
    "sharded_reads": (_activity,),
    "packing": (_activity,),
    "profile": (_profiling, _activity),
    # online calibration learns from the profiler's module timers
    "calibrate_online": (_profiling,),
}


def features_of(cfg: AccelConfig) -> tuple[str, ...]:
    """The rows of :data:`FEATURES` a config turns on."""
    return tuple(cfg.features()) + (("calibrate_online",) if cfg.calibrates_online else ())


def patches_for(cfg: AccelConfig, shape: T.Shape) -> list[Patch]:
    """Every patch the config needs on this shape, each once, in table order."""
    wanted = {name for feature in features_of(cfg) for name in FEATURES[feature]}
    return [p for name, p in PATCHES.items() if name in wanted and p.applies_to(shape)]


def runtime_for(cfg: AccelConfig, shape: T.Shape) -> Runtime:
    """The Runtime of an enable() of ``cfg`` on ``shape``, holding what its features keep (each once)."""
    runtime = Runtime(cfg, native_packing=shape.native_packing)
    for keep in dict.fromkeys(k for f in features_of(cfg) if f in KEEPS for k in KEEPS[f]):
        keep(runtime)
    return runtime


def internals_for(cfg: AccelConfig) -> list[T.Internal]:
    """The private upstream names the config's features read."""
    on = set(cfg.features())
    return [i for i in T.INTERNALS if on.intersection(i.features)]
