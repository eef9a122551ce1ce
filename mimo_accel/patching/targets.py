"""What mimo_accel patches and reads of upstream, and the upstream shapes it supports, declared in one place.

A *target* is one name bound in one module. Upstream binds several functions by value in more
than one module (``from ... import name``), so each function is listed at every binding site: the
defining module, the modules that imported it by name, and the package re-export. Before anything
is patched, every target of a site is checked: present, the same object as the defining one, and
with every parameter its replacement reads, by name (the replacements bind each call through
upstream's own signature and pass it on whole, so a parameter upstream adds is carried through;
one mimo_accel reads that upstream renamed or dropped is refused before anything is patched).

References (NVIDIA-NeMo/Megatron-Bridge):
- src/megatron/bridge/data/megatron_mimo/dp_utils.py: get_megatron_mimo_sampling_info,
  slice_batch_for_megatron_mimo
- src/megatron/bridge/data/megatron_mimo/loaders.py: binds both of the above helpers' sampling
  function and build_pretraining_data_loader by name
- src/megatron/bridge/training/megatron_mimo_step.py: binds slice_batch_for_megatron_mimo by
  name; _get_module_dp_info; (main only) pack_language_shard, bound from sequence_pack.py,
  and resolve_step_packing
- src/megatron/bridge/data/megatron_mimo/loaders.py: build_megatron_mimo_data_loaders (re-exported
  by the package)
- src/megatron/bridge/training/pretrain_megatron_mimo.py: looks up setup_megatron_mimo and
  train_megatron_mimo in its globals at call time
(NVIDIA/Megatron-LM) megatron/core/models/mimo/model/base.py: MimoModel._attach_modality_split_sizes;
megatron/core/pipeline_parallel/bridge_communicator.py: BridgeCommunicator._communicate_shapes and
_split_tensor_at_batch_dim
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from mimo_accel.config import ENV_ALLOW_UNTESTED

DP_UTILS = "megatron.bridge.data.megatron_mimo.dp_utils"
LOADERS = "megatron.bridge.data.megatron_mimo.loaders"
DATA_PKG = "megatron.bridge.data.megatron_mimo"
SAMPLERS = "megatron.bridge.data.samplers"
STEP = "megatron.bridge.training.megatron_mimo_step"
PRETRAIN = "megatron.bridge.training.pretrain_megatron_mimo"
SETUP = "megatron.bridge.training.setup_megatron_mimo"
TRAIN = "megatron.bridge.training.train_megatron_mimo"
MIMO_SUBMODULES = "megatron.core.models.mimo.submodules.base"
MIMO_OPTIMIZER = "megatron.core.models.mimo.optimizer"


@dataclass(frozen=True)
class Target:
    site: str  # module where the name is bound (and patched)
    name: str  # "func" or "Class.method"
    origin: str  # module that defines it; the site's binding must be that very object
    params: tuple[str, ...]  # every parameter its replacement reads, by name (order and extras free)
    # parameters it reads where upstream has them (None where it does not); checked when present
    optional: tuple[str, ...] = ()


def _everywhere(name: str, origin: str, params: tuple[str, ...], *sites: str,
                optional: tuple[str, ...] = ()) -> tuple[Target, ...]:
    return tuple(Target(site, name, origin, params, optional) for site in (origin, *sites))


SAMPLING_INFO = _everywhere("get_megatron_mimo_sampling_info", DP_UTILS,
                            ("megatron_mimo_cfg", "grids"), LOADERS, DATA_PKG)
# the sharded loader's inputs, and the settings the data ranks compare before the first batch; the
# sampler's seed is a parameter since 0.6 (PR #4608's older base has none: no seed to compare there)
PRETRAINING_LOADER = _everywhere("build_pretraining_data_loader", SAMPLERS,
                                 ("dataset", "consumed_samples", "dataloader_type", "micro_batch_size",
                                  "data_parallel_size", "drop_last", "data_sharding"),
                                 LOADERS, optional=("seed",))
SLICE = _everywhere("slice_batch_for_megatron_mimo", DP_UTILS, ("batch", "dp_rank", "dp_size"),
                    STEP, DATA_PKG)
MODULE_DP_INFO = (Target(STEP, "_get_module_dp_info", STEP, ("megatron_mimo_model",)),)
LOADER_BUILDER = _everywhere("build_megatron_mimo_data_loaders", LOADERS, ("cfg", "megatron_mimo_provider"),
                             DATA_PKG)
SETUP_ENTRY = (Target(PRETRAIN, "setup_megatron_mimo", SETUP, ("state", "build_data_iterators_fn")),)
# the profiler's metrics take Bridge's GlobalState (its logger config and writers) from global_state,
# its header how the job was built from the model trained
TRAIN_ENTRY = (Target(PRETRAIN, "train_megatron_mimo", TRAIN, ("global_state", "model")),)
ENCODE = (Target(MIMO_SUBMODULES, "ModalitySubmodules.encode", MIMO_SUBMODULES,
                 ("self", "encoders_data_batch")),)
OPTIMIZER_STEP = (Target(MIMO_OPTIMIZER, "MimoOptimizer.step", MIMO_OPTIMIZER, ("self",)),)
MIMO_MODEL = "megatron.core.models.mimo.model.base"
BRIDGE_COMM = "megatron.core.pipeline_parallel.bridge_communicator"
FAN_IN = (Target(MIMO_MODEL, "MimoModel._attach_modality_split_sizes", MIMO_MODEL, ("self", "encoder_name")),
          Target(BRIDGE_COMM, "BridgeCommunicator._communicate_shapes", BRIDGE_COMM, ("self", "recv_prev")),
          Target(BRIDGE_COMM, "BridgeCommunicator._split_tensor_at_batch_dim", BRIDGE_COMM,
                 ("self", "aggregated_tensor", "num_splits")))
SEQUENCE_PACK = "megatron.bridge.data.megatron_mimo.sequence_pack"
# Upstream main's step (training/megatron_mimo_step.py at 067f987) packs the language shard itself:
#     pack_sequences_enabled = resolve_step_packing(state.cfg.dataset)
#     ... data_batch, packing_kwargs = pack_language_shard(data_batch, lengths=pack_lengths)
# Both names are looked up in the step's module globals at call time. mimo_accel replaces the
# packer with its own (pad_multiple / tp alignment, validated lengths) and turns step packing on
# when mimo_accel packing is on, so the feature acts without a dataset-config change.
# mimo_accel's packer takes the batch and re-derives (and checks) the lengths upstream passes
NATIVE_PACK = (Target(STEP, "pack_language_shard", SEQUENCE_PACK, ("data_batch", "lengths")),
               Target(STEP, "resolve_step_packing", STEP, ("dataset_cfg",)))
CANONICAL = "megatron.bridge.data.megatron_mimo.canonical_sampler"
# Upstream's scalable reads (Megatron-Bridge #5525, data/megatron_mimo/canonical_sampler.py): with
# ``dataset.megatron_mimo_scalable_dp`` the loaders call build_canonical_mimo_data_loader (bound by
# name in loaders.py) instead of build_pretraining_data_loader, and the step skips
# slice_batch_for_megatron_mimo, so the step's per-batch work moves to get_batch (looked up in the
# step's globals at call time).
CANONICAL_LOADER = _everywhere("build_canonical_mimo_data_loader", CANONICAL,
                               ("dataset", "consumed_samples", "dataloader_type", "micro_batch_size",
                                "module_dp_sizes", "dp_rank", "dp_size", "drop_last", "data_sharding"), LOADERS)
GET_BATCH = (Target(STEP, "get_batch", STEP, ("data_iterator",)),)


@dataclass(frozen=True)
class Shape:
    """One supported upstream shape: the megatron-bridge and megatron-core versions it covers.

    The version lists are closed: a version that is not listed is *untested*, and ``enable()``
    refuses it unless ``MIMO_ACCEL_ALLOW_UNTESTED=1`` — except two kinds it accepts with one notice,
    because every target it patches and every private name it reads is still checked against the
    shape before anything is patched, and refused there, naming the target, if it differs (the shape
    check is the guard; the versions only choose the shape):

    - a newer *patch release* of a listed release's minor (megatron-bridge 0.6.3 beside 0.6.0-0.6.2,
      megatron-core 0.19.3 beside 0.19.x): status "patch";
    - a *source build* of a listed version: Bridge and megatron-core append ``+<git rev-parse
      --short HEAD>`` to ``__version__`` when built from a git checkout, so a build at another commit
      (``0.7.0+1a2b3c4``, ``0.6.2+1a2b3c4``) has a listed version's public part. Its shape is the one
      whose upstream features the installed source files have (:data:`SOURCE_MARKERS`: the step's
      own packing, upstream's scalable reads); none fits: untested. Status "build".

    A listed version without a local segment is a release (as on PyPI); one with a local segment
    (``0.7.0+067f987``) is the source build at that commit this project tested (7 or more hex
    digits: ``0.7.0+067f987df``, ``0.20.0+2a75ac12c5`` match by prefix). A source tree built without
    git (an archive extract) installs as the bare ``X.Y.Z`` and is untested where that is no release.
    """

    name: str
    bridge: tuple[str, ...]  # megatron-bridge versions covered
    core: tuple[str, ...]  # megatron-core versions covered (fan-in replaces private core methods)
    native_packing: bool  # upstream's step already packs (sequence_pack.py)
    tested_here: bool  # False: declared from reading upstream's source, not run by this project's tests
    evidence: str  # what the declaration rests on
    scalable_reads: bool = False  # upstream's own canonical-grid reads (megatron_mimo_scalable_dp)
    sparse_modalities: bool = False  # upstream's slice keeps a sparse modality's samples (_mimo_sample_indices)

    @property
    def support(self) -> str:
        return "tested" if self.tested_here else "declared, not tested here"

    def describe(self) -> str:
        return (f"shape '{self.name}': megatron-bridge {', '.join(self.bridge)} with megatron-core "
                f"{', '.join(self.core)} ({self.support})")


SHAPES = (
    # 0.6.2 is what this project installs and tests. 0.6.0 and 0.6.1 count: their MegatronMIMO path
    # (data/megatron_mimo/{dp_utils,loaders,__init__}.py, data/samplers.py,
    # training/{megatron_mimo_step,pretrain_megatron_mimo,train_megatron_mimo}.py) is byte-identical
    # to 0.6.2 (compared with tag v0.6.0). Any later 0.6.x is untested until listed here.
    # megatron-core 0.19.x: the three private fan-in methods are identical in core_v0.19.0 and
    # 0.19.2 (installed); 0.19.1 lies between them.
    Shape("0.6", bridge=("0.6.0", "0.6.1", "0.6.2"), core=("0.19.0", "0.19.1", "0.19.2"),
          native_packing=False, tested_here=True,
          evidence="the test suite runs on megatron-bridge 0.6.2 / megatron-core 0.19.2"),
    # Upstream main at 067f987 (2026-08-22) reports 0.7.0 (no pre-release tag since #5134; main was
    # never "0.7.0.dev"; between 2026-06-02 and 2026-08-04 it reported 0.6.0+<commit>, which the 0.6
    # shape does not cover: not a release). It pins Megatron-LM 2a75ac12c54b = megatron-core
    # 0.20.0. Checked by reading that source: every target below exists with the expected
    # parameters and bindings, and the fan-in methods' bodies equal 0.19.2's (logging aside). Tested
    # with `make test-upstream` (a venv built from those two trees; see upstream/upstream_venv.py).
    Shape("main", bridge=("0.7.0+067f987",), core=("0.20.0+2a75ac1",), native_packing=True,
          tested_here=True,
          evidence="the whole test suite runs on source builds of Bridge 067f987 / Megatron-LM 2a75ac12c54b "
                   "(make test-upstream; docs/compatibility.md has the run)"),
    # Bridge main 067f987 with Megatron-LM main d98e8a6 (newer than the pin): #6606 sends the bridge's
    # payloads through batch_isend_irecv and gives each module's first PP stage the last backward's
    # grad sync; #6570 (GTP), #6604 and #6745 leave every target above as at 2a75ac1.
    Shape("main-lm", bridge=("0.7.0+067f987",), core=("0.20.0+d98e8a6",), native_packing=True,
          tested_here=True,
          evidence="the whole test suite runs on source builds of Bridge 067f987 / Megatron-LM d98e8a64dd "
                   "(make test-upstream; docs/compatibility.md has the run)"),
    # Upstream's scalable reads, open PR #5525 (branch pull-request/5525, head 958575fc3 of
    # 2026-08-12, branched from main at 600d069b8, before main's eval_micro_batch_size) with the
    # Megatron-LM it pins, 24bad8e677 (0.20.0). It reports 0.7.0 like main, at its own commit.
    # The main-shape targets are all there (same bindings and parameters); on top,
    # megatron_mimo_scalable_dp routes the loaders through build_canonical_mimo_data_loader and the
    # step skips the slice, which the scalable targets cover.
    Shape("scalable-5525", bridge=("0.7.0+958575f",), core=("0.20.0+24bad8e",), native_packing=True,
          tested_here=True, scalable_reads=True,
          evidence="the whole test suite runs on source builds of Bridge 958575fc3 (PR #5525) / Megatron-LM "
                   "24bad8e677 (make test-upstream), scalable reads included"),
    # Sparse modality DP ownership, open PR #4986 (head fdf31e415, on main of 2026-07-21, which
    # reported 0.6.0+<commit>) with the Megatron-LM it pins, adfb8ec79 (0.19.0). Its collate records
    # where a modality's samples are (_mimo_sample_indices) when some sample lacks it, and its slice
    # hands each DP shard those samples' rows, at DP 1 too. Every target is as in 0.6.2.
    Shape("sparse-4986", bridge=("0.6.0+fdf31e4",), core=("0.19.0+adfb8ec",), native_packing=False,
          tested_here=True, sparse_modalities=True,
          evidence="the whole test suite runs on source builds of Bridge fdf31e415 (PR #4986) / Megatron-LM "
                   "adfb8ec79 (make test-upstream), sparse modalities included"),
)

@dataclass(frozen=True)
class Internal:
    """A private upstream name mimo_accel reads (not patches). Checked before anything is patched
    where its module is imported, and listed by ``mimo-accel doctor``.

    ``name`` is an attribute path from ``module`` (``"_world.pg_names"``); with ``instance`` the
    last part is an attribute that instances of the class before it set in their ``__init__``.
    """

    module: str
    name: str
    used_for: str
    features: tuple[str, ...]  # the user-facing features that read it
    instance: bool = False

    @property
    def where(self) -> str:
        return f"{self.module}.{self.name}"


# Every private upstream name read anywhere in mimo_accel.
INTERNALS = (
    Internal("megatron.core.num_microbatches_calculator", "_GLOBAL_NUM_MICROBATCHES_CALCULATOR",
             "reorder windows: the micro-batches of a training step (runtime/loaders.py)", ("reorder",)),
    Internal("torch.distributed.distributed_c10d", "_get_default_store",
             "plan-input checks and derived cost indexes gather through the job's store (runtime/store.py)",
             ("sharded_reads",)),
    Internal("torch.distributed.distributed_c10d", "_world.pg_names",
             "exchange mode: members agree on their group count before making a gloo group (runtime/exchange/reorder.py)",
             ("reorder",)),
    Internal("megatron.bridge.data.datasets.direct_sft", "DirectSFTDataset._base_examples",
             "deriving costs of a direct HF SFT dataset: its raw examples (datasets/direct_sft.py)",
             ("reorder",), instance=True),
    Internal("megatron.bridge.data.datasets.direct_sft", "DirectSFTDataset._processor",
             "deriving costs of a direct HF SFT dataset: its HF processor (datasets/direct_sft.py)",
             ("reorder",), instance=True),
    Internal("megatron.bridge.data.datasets.direct_sft", "DirectSFTDataset.collate_impl",
             "deriving costs of a direct HF SFT dataset: the collate its collate_fn closes over, for the "
             "collate's min/max pixels (datasets/direct_sft.py)", ("reorder",), instance=True),
)

# The upstream features a shape has, each told by a source file of the installed megatron-bridge
# (read without importing it): how a source build's shape is chosen.
SOURCE_MARKERS = {
    "native_packing": ("bridge", "data", "megatron_mimo", "sequence_pack.py"),
    "scalable_reads": ("bridge", "data", "megatron_mimo", "canonical_sampler.py"),
    # PR #4608's own packing of a micro-batch: no shape has it, so such a build stays untested
    "intra_microbatch_pack": ("bridge", "data", "megatron_mimo", "intra_microbatch_pack.py"),
}

ALLOW_UNTESTED_ENV = ENV_ALLOW_UNTESTED
SUPPORTED = "; ".join(shape.describe() for shape in SHAPES)


def _covers(installed, declared) -> bool:
    """Whether an installed version is a declared one (see :class:`Shape` for local segments)."""
    if installed.public != declared.public:
        return False
    if declared.local is None or installed.local is None:
        return declared.local is None and installed.local is None
    a, b = str(installed.local), str(declared.local)
    return len(a) >= 7 and (a.startswith(b) or b.startswith(a))


@dataclass(frozen=True)
class Match:
    """How an installed (megatron-bridge, megatron-core) pair relates to the declared shapes.

    ``status``: "tested" / "declared" (inside a shape's lists; declared = not tested here),
    "patch" (a newer patch release of a shape's listed releases, accepted when every target has the
    shape: ``problems`` says which versions are new), "build" (a source build of a shape's listed
    versions at another commit, accepted the same way: ``problems`` says which), "untested" (outside
    every shape; ``shape`` is then the nearest one), "missing" (a package is not installed, or its
    version does not parse; ``shape`` is None).
    """

    bridge: Optional[str]
    core: Optional[str]
    shape: Optional[Shape]
    status: str
    problems: tuple[str, ...] = ()

    @property
    def installed(self) -> str:
        return f"megatron-bridge {self.bridge or 'not installed'} with megatron-core {self.core or 'not installed'}"


def match(bridge: Optional[str], core: Optional[str], sources=None) -> Match:
    """The shape an installed (megatron-bridge, megatron-core) pair has. No imports of either.
    ``sources``: the :data:`SOURCE_MARKERS` the installed megatron-bridge has (default: read from
    its files, only for a source build)."""
    from packaging.version import InvalidVersion, Version

    missing = [f"{name} is not installed" for name, v in (("megatron-bridge", bridge), ("megatron-core", core))
               if v is None]
    if missing:
        return Match(bridge, core, None, "missing", tuple(missing))
    try:
        b, c = Version(bridge), Version(core)
    except InvalidVersion as exc:
        return Match(bridge, core, None, "missing", (f"unreadable version: {exc}",))
    for shape in SHAPES:
        if any(_covers(b, Version(v)) for v in shape.bridge) and any(_covers(c, Version(v)) for v in shape.core):
            return Match(bridge, core, shape, "tested" if shape.tested_here else "declared")
    for shape in SHAPES:
        newer = [f"{name} {v} is a newer patch release than {', '.join(listed)}"
                 for name, v, listed in (("megatron-bridge", b, shape.bridge), ("megatron-core", c, shape.core))
                 if _newer_patch(v, listed)]
        covered = [any(_covers(v, Version(x)) for x in listed) or _newer_patch(v, listed)
                   for v, listed in ((b, shape.bridge), (c, shape.core))]
        if newer and all(covered):
            return Match(bridge, core, shape, "patch", tuple(newer))
    built = _source_build(b, c, sources)
    if built is not None:
        shape, problems = built
        return Match(bridge, core, shape, "build", problems)
    shape = nearest_shape(b)
    problems = []
    if not any(_covers(b, Version(v)) for v in shape.bridge):
        problems.append(f"megatron-bridge {bridge} is not one of {', '.join(shape.bridge)}")
    if not any(_covers(c, Version(v)) for v in shape.core):
        problems.append(f"megatron-core {core} is not one of {', '.join(shape.core)}")
    return Match(bridge, core, shape, "untested", tuple(problems))


def _source_build(b, c, sources) -> Optional[tuple[Shape, tuple[str, ...]]]:
    """(shape, what is new) for a source build of a shape's listed versions whose installed source
    has that shape's upstream features; None for anything else."""
    from packaging.version import Version

    if b.local is None and c.local is None:
        return None
    candidates = [shape for shape in SHAPES
                  if any(Version(v).public == b.public for v in shape.bridge)
                  and any(Version(v).public == c.public for v in shape.core)]
    if not candidates:
        return None
    have = installed_sources() if sources is None else set(sources)
    for shape in candidates:
        if all((name in have) == getattr(shape, name, False) for name in SOURCE_MARKERS):
            new = [f"{name} {v} is a source build (+{v.local}) of {v.public}, not a build this project tested"
                   for name, v, listed in (("megatron-bridge", b, shape.bridge), ("megatron-core", c, shape.core))
                   if not any(_covers(v, Version(x)) for x in listed)]
            return shape, tuple(new)
    return None


def installed_sources() -> set:
    """The :data:`SOURCE_MARKERS` whose file the installed megatron-bridge has (found through the
    ``megatron`` namespace package's directories: nothing is imported)."""
    import importlib.util
    import os

    spec = importlib.util.find_spec("megatron")
    roots = list(spec.submodule_search_locations or ()) if spec is not None else []
    return {name for name, parts in SOURCE_MARKERS.items() if any(os.path.isfile(os.path.join(r, *parts)) for r in roots)}


def _newer_patch(installed, listed) -> bool:
    """Whether ``installed`` is a release (no pre-, dev- or local part) of a listed release's
    major.minor, newer than every listed release of that minor."""
    from packaging.version import Version

    if installed.local is not None or installed.is_prerelease or installed.is_devrelease:
        return False
    same_minor = [Version(v) for v in listed if Version(v).local is None
                  and Version(v).release[:2] == installed.release[:2]]
    return bool(same_minor) and installed > max(same_minor)


def nearest_shape(bridge) -> Shape:
    """The shape whose megatron-bridge is closest: the newest one not newer than ``bridge``
    (release part only), or the oldest shape for a version older than all."""
    from packaging.version import Version

    v = Version(str(bridge)).release
    older = [s for s in SHAPES if min(Version(x).release for x in s.bridge) <= v]
    return max(older, key=lambda s: min(Version(x).release for x in s.bridge)) if older else SHAPES[0]
