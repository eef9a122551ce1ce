"""The upstream shapes mimo_accel supports, declared in one place.

A *target* is one name bound in one module. Upstream binds several functions by value in more
than one module (``from ... import name``), so each function is listed at every binding site: the
defining module, the modules that imported it by name, and the package re-export. Before anything
is patched, every target of a site is checked: present, the same object as the defining one, and
with the expected leading parameters.

References (NVIDIA-NeMo/Megatron-Bridge):
- src/megatron/bridge/data/megatron_mimo/dp_utils.py: get_megatron_mimo_sampling_info,
  slice_batch_for_megatron_mimo
- src/megatron/bridge/data/megatron_mimo/loaders.py: binds both of the above helpers' sampling
  function and build_pretraining_data_loader by name
- src/megatron/bridge/training/megatron_mimo_step.py: binds slice_batch_for_megatron_mimo by
  name; _get_module_dp_info; (main only) pack_language_shard from sequence_pack.py
- src/megatron/bridge/training/pretrain_megatron_mimo.py: looks up train_megatron_mimo in its
  globals at call time
(NVIDIA/Megatron-LM) megatron/core/models/mimo/model/base.py: MimoModel._attach_modality_split_sizes;
megatron/core/pipeline_parallel/bridge_communicator.py: BridgeCommunicator._communicate_shapes and
_split_tensor_at_batch_dim
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

DP_UTILS = "megatron.bridge.data.megatron_mimo.dp_utils"
LOADERS = "megatron.bridge.data.megatron_mimo.loaders"
DATA_PKG = "megatron.bridge.data.megatron_mimo"
SAMPLERS = "megatron.bridge.data.samplers"
STEP = "megatron.bridge.training.megatron_mimo_step"
PRETRAIN = "megatron.bridge.training.pretrain_megatron_mimo"
TRAIN = "megatron.bridge.training.train_megatron_mimo"
MIMO_SUBMODULES = "megatron.core.models.mimo.submodules.base"
MIMO_OPTIMIZER = "megatron.core.models.mimo.optimizer"


@dataclass(frozen=True)
class Target:
    site: str  # module where the name is bound (and patched)
    name: str  # "func" or "Class.method"
    origin: str  # module that defines it; the site's binding must be that very object
    params: tuple[str, ...]  # expected leading parameter names


def _everywhere(name: str, origin: str, params: tuple[str, ...], *sites: str) -> tuple[Target, ...]:
    return tuple(Target(site, name, origin, params) for site in (origin, *sites))


SAMPLING_INFO = _everywhere("get_megatron_mimo_sampling_info", DP_UTILS,
                            ("megatron_mimo_cfg", "grids"), LOADERS, DATA_PKG)
PRETRAINING_LOADER = _everywhere("build_pretraining_data_loader", SAMPLERS,
                                 ("dataset", "consumed_samples", "dataloader_type", "micro_batch_size"),
                                 LOADERS)
SLICE = _everywhere("slice_batch_for_megatron_mimo", DP_UTILS, ("batch", "dp_rank", "dp_size"),
                    STEP, DATA_PKG)
MODULE_DP_INFO = (Target(STEP, "_get_module_dp_info", STEP, ("megatron_mimo_model",)),)
TRAIN_ENTRY = (Target(PRETRAIN, "train_megatron_mimo", TRAIN, ("forward_step_func", "model")),)
ENCODE = (Target(MIMO_SUBMODULES, "ModalitySubmodules.encode", MIMO_SUBMODULES,
                 ("self", "encoders_data_batch")),)
OPTIMIZER_STEP = (Target(MIMO_OPTIMIZER, "MimoOptimizer.step", MIMO_OPTIMIZER, ("self",)),)
MIMO_MODEL = "megatron.core.models.mimo.model.base"
BRIDGE_COMM = "megatron.core.pipeline_parallel.bridge_communicator"
FAN_IN = (Target(MIMO_MODEL, "MimoModel._attach_modality_split_sizes", MIMO_MODEL,
                 ("self", "output", "input_ids", "encoder_name")),
          Target(BRIDGE_COMM, "BridgeCommunicator._communicate_shapes", BRIDGE_COMM,
                 ("self", "tensor_to_send_next", "recv_next", "recv_prev", "tensor_to_send_prev")),
          Target(BRIDGE_COMM, "BridgeCommunicator._split_tensor_at_batch_dim", BRIDGE_COMM,
                 ("self", "aggregated_tensor", "num_splits")))
NATIVE_PACK = (Target(STEP, "pack_language_shard", "megatron.bridge.data.megatron_mimo.sequence_pack",
                      ("batch",)),)


@dataclass(frozen=True)
class Shape:
    """One supported upstream shape: which megatron-bridge versions, and what it has."""

    name: str
    min_version: str  # inclusive
    below_version: Optional[str]  # exclusive, None = open
    native_packing: bool  # upstream's step already packs (sequence_pack.py)

    def targets(self, feature: str) -> tuple[Target, ...]:
        return FEATURE_TARGETS[feature] + (NATIVE_PACK if feature == "packing" and self.native_packing else ())


# Feature -> the targets it patches. "context" (the rank's shard context) serves every data feature.
FEATURE_TARGETS = {
    "context": SAMPLING_INFO,
    "sharded_reads": PRETRAINING_LOADER,
    "step": SLICE + MODULE_DP_INFO,
    "fan_in": FAN_IN,
    "packing": (),
    "profile": ENCODE + OPTIMIZER_STEP,
    "train_entry": TRAIN_ENTRY,
}

SHAPES = (
    Shape("0.6 (PyPI: step packs nothing)", "0.6.0", "0.7.0.dev0", native_packing=False),
    Shape("main (0.7.0.dev: sequence_pack in the step)", "0.7.0.dev0", None, native_packing=True),
)

SUPPORTED = "megatron-bridge 0.6.x (tested: 0.6.2) and upstream main 0.7.0.dev (declared, not tested here)"


def shape_for(version: str) -> Optional[Shape]:
    from packaging.version import Version

    v = Version(version)
    for shape in SHAPES:
        if v >= Version(shape.min_version) and (shape.below_version is None or v < Version(shape.below_version)):
            return shape
    return None
