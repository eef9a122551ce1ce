"""Run the real MegatronMIMO stack on CPU ranks (gloo): rehearse a layout before spending GPU hours.

``activate()`` redirects the CUDA/NCCL hard-codes that megatron-core 0.19 and megatron-bridge 0.6
carry on the MegatronMIMO path, so the *unmodified* upstream code (grids, BridgeCommunicator,
loaders, MimoModel, pipeline schedule, optimizer) runs on CPU processes:

- ``typing.override`` back-ported on Python 3.11 (megatron/training imports it);
- stand-in ``transformer_engine`` and ``nvidia_resiliency_ext`` modules, only where the real ones are
  not importable, registered *after* ``import megatron.core`` so core still records them as absent;
- process groups asked for with ``backend="nccl"`` (HyperCommGrid from Bridge's
  ``build_hypercomm_grids``, BridgeCommunicator's own groups) are created with gloo;
- every gloo group of the process shares one TCP device (torch makes one per group, each with an
  event-loop thread that wakes every 10 ms; ~50 groups per rank cost 8 ranks on one CPU half of it);
- tensors asked for on ``"cuda"`` (``device="cuda"`` literals, ``torch.cuda.current_device()``,
  ``Tensor.cuda()``) are created on / left on the CPU, through a TorchFunctionMode;
- ``torch.cuda`` stream/synchronize calls become no-ops;
- the model-parallel RNG tracker is seeded with CPU generators (Bridge seeds it only when a GPU
  exists, and the encoder's dropout/attention forks it), and activation recompute saves and restores
  the CPU generator where it would the device's;
- for Bridge's own loop (``pretrain_megatron_mimo``): the CUDA RNG state that checkpoints always
  save is the CPU generator's, and restoring it / emptying the cache are no-ops; the MIMO
  optimizer's checkpoint routing also covers ``FP32Optimizer``'s layout (the only optimizer that
  runs on gloo); and the MIMO train step drops ``param.grad`` after zeroing the grad buffers, as
  Bridge's standard step does through ``optimizer.zero_grad()`` (otherwise ``FP32Optimizer``'s
  ``param.grad = main_grad`` alias doubles every gradient from the second iteration on).

Never active unless asked for; refuses to activate when CUDA is available (pass ``force=True`` to
rehearse on CPU anyway); ``deactivate()`` restores every redirected attribute.
The TorchFunctionMode is thread-local: activate from the thread that runs training.
"""

from __future__ import annotations

import contextlib
import importlib.machinery
import importlib.util
import os
import sys
import tempfile
import threading
import types
import typing
from typing import Optional, Sequence

from mimo_accel.patching.swaps import SwapSet
from mimo_accel.tools.devkit import STAND_IN_MARKER

__all__ = ["activate", "deactivate", "is_active", "prepare_imports", "prepare_imports_if_cpu",
           "check_megatron_importable"]

_lock = threading.RLock()
_swaps = SwapSet()
_stub_modules: list[str] = []
_mode = None  # the entered TorchFunctionMode
_active = False


# ----------------------------------------------------------------------------------------------
# Import-time compatibility (needed before any megatron.bridge import)
# ----------------------------------------------------------------------------------------------


class _StandInMeta(type):
    """A class whose every attribute is another stand-in class (``te.ops.Sequential`` resolves)."""

    def __getattr__(cls, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return _stand_in_class(f"{cls.__qualname__}.{name}")


def _stand_in_class(qualname: str) -> type:
    def _refuse(self, *args, **kwargs):
        raise RuntimeError(
            f"{qualname} was called, but its package is not installed: mimo_accel_dev.rehearse.cpu registered a "
            "stand-in module only so that megatron.bridge imports on a machine without CUDA. Use "
            "megatron-core's local layer specs (not Transformer Engine) when rehearsing on CPU."
        )

    return _StandInMeta(qualname.rsplit(".", 1)[-1], (), {"__init__": _refuse, "__qualname__": qualname})


class _StandInModule(types.ModuleType):
    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return _stand_in_class(f"{self.__name__}.{name}")


def _installed(package: str) -> bool:
    existing = sys.modules.get(package)
    if existing is not None:
        return not getattr(existing, STAND_IN_MARKER, False)
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return False
    # An empty leftover directory is a namespace package with no loader: not an install.
    return spec is not None and spec.loader is not None


# Packages megatron.bridge imports unconditionally that cannot be installed on a CPU machine
# (Transformer Engine needs CUDA; nvidia-resiliency-ext >= 0.6 has no Python 3.11 wheel).
_STAND_INS = {
    "transformer_engine": ("transformer_engine.pytorch", "transformer_engine.common",
                           "transformer_engine.common.recipe", "transformer_engine.pytorch.distributed"),
    "nvidia_resiliency_ext": ("nvidia_resiliency_ext.inprocess",),
}


def _register_stand_ins() -> None:
    missing = [pkg for pkg in _STAND_INS if pkg not in sys.modules and not _installed(pkg)]
    if not missing:
        return
    # megatron.core must see the real absence (it records HAVE_TE / HAVE_NVRX at import).
    import megatron.core  # noqa: F401

    for name in [n for pkg in missing for n in (pkg, *_STAND_INS[pkg])]:
        mod = _StandInModule(name)
        mod.__spec__ = importlib.machinery.ModuleSpec(name, loader=None, is_package=True)
        mod.__path__ = []
        mod.__version__ = "0.0.0+mimo-accel-stand-in"
        setattr(mod, STAND_IN_MARKER, True)
        sys.modules[name] = mod
        _stub_modules.append(name)
        parent, _, child = name.rpartition(".")
        if parent:
            setattr(sys.modules[parent], child, mod)


def _te_classes_as_types() -> None:
    """Without Transformer Engine, megatron.core.extensions.transformer_engine derives its TE*
    classes from a MagicMock (``te = MagicMock()``; ``class TEDotProductAttention(te.pytorch.
    DotProductAttention)``), so each is a MagicMock *instance*, and ``isinstance(x, TEDotProductAttention)``
    raises TypeError. Bridge main's Qwen3-VL attention (models/qwen_vl/modelling_qwen3_vl/attention.py,
    not in 0.6.2) makes exactly that check. Make each such name a plain class nothing is an instance of."""
    from unittest.mock import NonCallableMock

    te_ext = importlib.import_module("megatron.core.extensions.transformer_engine")
    if getattr(te_ext, "HAVE_TE", True):
        return
    for name, value in list(vars(te_ext).items()):
        if name.startswith("TE") and isinstance(value, NonCallableMock):
            _swaps.swap(te_ext, name, type(name, (), {"__module__": te_ext.__name__,
                                                      "__doc__": "Transformer Engine is not installed"}))


def prepare_imports() -> None:
    """Make ``import megatron.bridge...`` work here: the 3.11 back-port and the stand-ins.

    Idempotent; undone by :func:`deactivate`.
    """
    with _lock:
        if not hasattr(typing, "override"):
            import typing_extensions

            _swaps.swap(typing, "override", typing_extensions.override)
        _register_stand_ins()
        _te_classes_as_types()


def prepare_imports_if_cpu(argv: Sequence[str]) -> None:
    """The training script's ``--cpu`` prelude: :func:`prepare_imports` when ``"--cpu"`` is in
    ``argv``, else nothing. Call it before any megatron.bridge import: the Python 3.11 back-port
    and the stand-ins for packages that cannot be installed without CUDA (Transformer Engine).
    Nothing else changes here."""
    if "--cpu" in argv:
        prepare_imports()


def check_megatron_importable(log_path: Optional[str] = None) -> dict[str, str]:
    """Import the MegatronMIMO modules this project targets; fail loudly naming what is missing.

    What the imports print (TE/Apex fallback warnings, modelopt plugin failures, megatron.bridge's
    INFO tracebacks) goes to ``log_path`` (default: a new ``mimo-accel-imports-*.log`` in the temp
    dir), not the console; a failure's message names that file.
    """
    from importlib import metadata

    from mimo_accel.tools import quiet

    if log_path is None:
        fd, log_path = tempfile.mkstemp(prefix="mimo-accel-imports-", suffix=".log")
        os.close(fd)
    try:
        with quiet.output_to(log_path):
            prepare_imports()
            import megatron.bridge.data.megatron_mimo.loaders  # noqa: F401
            import megatron.bridge.training.megatron_mimo_step  # noqa: F401
            import megatron.core.pipeline_parallel.bridge_communicator  # noqa: F401
    except Exception as exc:  # re-raised with the fix named
        raise RuntimeError(
            f"the Megatron packages cannot be imported ({type(exc).__name__}: {exc}). "
            "Run `make setup` (or `make test`) to install megatron-core 0.19.2 and "
            f"megatron-bridge 0.6.2 with their runtime dependencies into .venv. (Import output: {log_path})"
        ) from exc
    return {pkg: metadata.version(pkg) for pkg in ("torch", "megatron-core", "megatron-bridge")}


# ----------------------------------------------------------------------------------------------
# Runtime redirects
# ----------------------------------------------------------------------------------------------


def _is_cuda_device(device) -> bool:
    import torch

    if device is None:
        return False
    if isinstance(device, int) and not isinstance(device, bool):
        return True  # a bare ordinal means a CUDA device in torch
    if isinstance(device, str):
        return device.startswith("cuda")
    if isinstance(device, torch.device):
        return device.type == "cuda"
    return False


def _make_mode():
    import torch
    from torch.overrides import TorchFunctionMode

    tensor_cuda = torch.Tensor.cuda
    tensor_to = torch.Tensor.to

    class CudaToCpuMode(TorchFunctionMode):
        """Tensors asked for on CUDA are made on (or left on) the CPU."""

        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func is tensor_cuda:
                return args[0]
            if func is tensor_to:
                args = tuple("cpu" if _is_cuda_device(a) else a for a in args)
            if _is_cuda_device(kwargs.get("device")):
                kwargs = {**kwargs, "device": "cpu"}
            return func(*args, **kwargs)

    return CudaToCpuMode()


class _NullStream:
    """Stands for a CUDA stream: every operation is already complete on CPU."""

    def __init__(self, *args, **kwargs):
        pass

    def wait_stream(self, *args, **kwargs):
        pass

    def wait_event(self, *args, **kwargs):
        pass

    def record_event(self, event=None):
        return event if event is not None else _NullEvent()

    def synchronize(self):
        pass

    def query(self):
        return True


class _NullEvent:
    def __init__(self, *args, **kwargs):
        pass

    def record(self, *args, **kwargs):
        pass

    def wait(self, *args, **kwargs):
        pass

    def synchronize(self):
        pass

    def query(self):
        return True


def _gloo_instead_of_nccl(new_group):
    def new_group_on_gloo(*args, **kwargs):
        backend = kwargs.get("backend")
        if isinstance(backend, str) and "nccl" in backend.lower():
            kwargs["backend"] = "gloo"
        return new_group(*args, **kwargs)

    new_group_on_gloo.__wrapped__ = new_group
    return new_group_on_gloo


def _gloo_on_one_device(gloo):
    """``ProcessGroupGloo`` whose groups all share this process's first TCP device.

    torch builds a new gloo device for every process group, and each device runs an event-loop
    thread that wakes every 10 ms (gloo's ``epoll_wait`` timeout) even when idle. A MegatronMIMO
    rank creates ~50 groups (grids, BridgeCommunicator, DDP), so 8 ranks on one CPU spent about
    half of it in those wake-ups (measured: 45 % system time during `mimo-accel rehearse`). Gloo
    serves any number of contexts from one device; only the threads go away. The class answers
    ``isinstance`` for every ``ProcessGroupGloo``, as the code that checks the name expects."""
    device = []

    class _Meta(type(gloo)):
        def __instancecheck__(cls, obj):
            return isinstance(obj, gloo)

        def __subclasscheck__(cls, sub):
            return issubclass(sub, gloo)

    class ProcessGroupGlooOneDevice(gloo, metaclass=_Meta):
        def __init__(self, store, rank, size, timeout=None):
            if isinstance(timeout, gloo._Options):  # the (store, rank, size, options) overload
                super().__init__(store, rank, size, timeout)
                return
            if not device:
                device.append(gloo.create_default_device())
            options = gloo._Options()
            options._devices = [device[0]]
            if timeout is not None:
                options._timeout = timeout
            super().__init__(store, rank, size, options)

    ProcessGroupGlooOneDevice.__wrapped__ = gloo
    return ProcessGroupGlooOneDevice


class _CpuRNGStatesTracker:
    """megatron-core's CudaRNGStatesTracker, kept on CPU generators.

    Same contract (``add``/``fork``/``get_states``/``set_states``/``reset``); ``fork`` runs the
    block under the named CPU RNG state and restores the caller's state afterwards.
    """

    def __init__(self):
        self.reset()

    def reset(self):
        self.states_ = {}
        self.seeds_ = set()
        self._is_initialized = False

    def is_initialized(self):
        return self._is_initialized

    def get_states(self):
        return dict(self.states_)

    def set_states(self, states):
        self._is_initialized = True
        self.states_ = dict(states)

    def add(self, name, seed):
        import torch

        if seed in self.seeds_:
            raise Exception(f"seed {seed} already exists")
        if name in self.states_:
            raise Exception(f"rng state {name} already exists")
        self._is_initialized = True
        self.seeds_.add(seed)
        self.states_[name] = torch.Generator().manual_seed(seed).get_state()

    @contextlib.contextmanager
    def fork(self, name="model-parallel-rng"):
        import torch

        if name not in self.states_:
            raise Exception(f"rng state {name} is not added")
        caller = torch.get_rng_state()
        torch.set_rng_state(self.states_[name])
        try:
            yield
        finally:
            self.states_[name] = torch.get_rng_state()
            torch.set_rng_state(caller)


def seed_cpu_rng_tracker(seed: int, tp_rank: int = 0, ep_rank: int = 0, etp_rank: int = 0) -> None:
    """What ``model_parallel_cuda_manual_seed`` sets up, on CPU generators (same seed offsets)."""
    from megatron.core.tensor_parallel import random as mp_random

    tracker = _CpuRNGStatesTracker()
    tracker.add("data-parallel-rng", seed)
    tracker.add("model-parallel-rng", seed + 2718 + tp_rank)
    tracker.add("expert-parallel-rng", seed + 1024 + 100 * ep_rank + etp_rank)
    _swaps.swap(mp_random, "_CUDA_RNG_STATE_TRACKER", tracker)
    _swaps.swap(mp_random, "_CUDA_RNG_STATE_TRACKER_INITIALIZED", True)
    # activation recompute (tensor_parallel.checkpoint) saves and restores the device generator's
    # state around its forward: on CPU that generator is the CPU one
    _swaps.swap(mp_random, "_get_cuda_rng_state", _cpu_generator_state)
    _swaps.swap(mp_random, "_set_cuda_rng_state", _set_cpu_generator_state)


def _wrap_bridge_seeding(set_seeds):
    """After Bridge seeds python/numpy/torch (it skips the tracker without a GPU), seed the
    model-parallel tracker on CPU with the same per-module ranks."""

    def set_seeds_and_cpu_tracker(infra, *, seed):
        import torch.distributed as dist

        set_seeds(infra, seed=seed)
        tp = pp = ep = etp = 0
        for name, grid in infra.module_to_grid_map.items():
            pgs = infra.pg_collections.get(name)
            if grid.is_current_rank_in_grid() and pgs is not None:
                me = dist.get_rank()
                tp, pp = dist.get_group_rank(pgs.tp, me), dist.get_group_rank(pgs.pp, me)
                ep, etp = dist.get_group_rank(pgs.ep, me), dist.get_group_rank(pgs.expt_tp, me)
                break
        seed_cpu_rng_tracker(seed + 100 * pp, tp, ep, etp)

    set_seeds_and_cpu_tracker.__wrapped__ = set_seeds
    return set_seeds_and_cpu_tracker


def _cpu_generator_state(*args, **kwargs):
    """``torch.cuda.get_rng_state`` on CPU: the device generator *is* the CPU generator."""
    import torch

    return torch.get_rng_state()


def _set_cpu_generator_state(state, *args, **kwargs) -> None:
    """megatron-core's ``_set_cuda_rng_state`` on CPU: the device generator *is* the CPU generator."""
    import torch

    torch.set_rng_state(state)


def _no_op(*args, **kwargs) -> None:
    return None


def _fp32_layout(sub_sd) -> bool:
    """``FP32Optimizer.sharded_state_dict`` is torch's own layout: ``state`` and ``param_groups``
    at the top level. The mixed-precision and distributed optimizers nest them under
    ``optimizer`` (which upstream's MIMO routing expects)."""
    return isinstance(sub_sd, dict) and "optimizer" not in sub_sd and "state" in sub_sd


_COMMON_STEP_KEY = "_mimo_accel_common_step"


def _extract_param_groups_fp32_too(extract):
    """megatron/core/models/mimo/optimizer.py ``_extract_param_groups`` routes only
    ``sub_sd['optimizer']['param_groups']`` through the sharded save. With ``FP32Optimizer``
    the param groups (and ``state['common_step']``) sit at the top level, land in the common
    state that only global rank 0 writes, and every other module's ranks cannot resume."""

    def extract_param_groups(sub_sd, module_name, suffix, replica_id):
        if _fp32_layout(sub_sd) and "param_groups" in sub_sd:
            from megatron.core.dist_checkpointing.mapping import ShardedObject

            sub_sd["optimizer"] = {"param_groups": sub_sd.pop("param_groups")}
            # FP32Optimizer writes common_step only when it is non-zero, so the load template
            # (built before any step) would not ask for it: always declare it, 0 = never stepped.
            state = sub_sd["state"]
            step = state.pop("common_step", 0) if isinstance(state, dict) else 0
            sub_sd[f"{_COMMON_STEP_KEY}{suffix}"] = ShardedObject(
                f"optimizer.mimo.{module_name}{suffix}.common_step", step, (1,), (0,), replica_id=replica_id)
        return extract(sub_sd, module_name, suffix, replica_id)

    extract_param_groups.__wrapped__ = extract
    return extract_param_groups


def _restore_param_groups_fp32_too(restore):
    """The load side of :func:`_extract_param_groups_fp32_too`: put the param groups and the
    common step back where ``FP32Optimizer.load_state_dict`` reads them."""

    def restore_param_groups(sub_sd, inner_optimizer, module_name):
        fp32 = _fp32_layout(sub_sd)
        restore(sub_sd, inner_optimizer, module_name)
        if not fp32:
            return
        if "optimizer" in sub_sd:
            sub_sd["param_groups"] = sub_sd.pop("optimizer")["param_groups"]
        for key in [k for k in sub_sd if isinstance(k, str) and k.startswith(_COMMON_STEP_KEY)]:
            step = sub_sd.pop(key)
            if step:
                sub_sd["state"]["common_step"] = step

    restore_param_groups.__wrapped__ = restore
    return restore_param_groups


def _also_drop_param_grads(zero_grad_buffers):
    """``train_step_megatron_mimo`` (bridge/training/train_megatron_mimo.py) only zeroes the DDP
    grad buffers; Bridge's standard step also calls ``optimizer.zero_grad()``. ``FP32Optimizer``
    leaves ``param.grad`` aliased to ``param.main_grad`` (core/optimizer/optimizer.py
    ``prepare_grads``), so the next backward accumulates into ``main_grad`` through the alias and
    the DDP hook adds ``param.grad`` once more: 2x gradients. Drop the alias here."""

    def zero_grad_buffer_for_multimodule(module_to_grid_tuple, *args, **kwargs):
        result = zero_grad_buffers(module_to_grid_tuple, *args, **kwargs)
        for module, _grid in module_to_grid_tuple:
            if module is not None:
                for param in module.parameters():
                    param.grad = None
        return result

    zero_grad_buffer_for_multimodule.__wrapped__ = zero_grad_buffers
    return zero_grad_buffer_for_multimodule


def _install_training_loop_redirects() -> None:
    """What Bridge's ``pretrain_megatron_mimo`` loop needs beyond the model path."""
    import torch

    # bridge/training/checkpointing.py get_rng_state() saves torch.cuda.get_rng_state() whatever
    # save_rng says; loading sets it back and empties the cache.
    _swaps.swap(torch.cuda, "get_rng_state", _cpu_generator_state)
    _swaps.swap(torch.cuda, "set_rng_state", _no_op)
    _swaps.swap(torch.cuda, "empty_cache", _no_op)

    from megatron.core.models.mimo import optimizer as mimo_optimizer

    _swaps.swap(mimo_optimizer, "_extract_param_groups",
                _extract_param_groups_fp32_too(mimo_optimizer._extract_param_groups))
    _swaps.swap(mimo_optimizer, "_restore_param_groups",
                _restore_param_groups_fp32_too(mimo_optimizer._restore_param_groups))

    from megatron.bridge.training import megatron_mimo_parallel_utils, train_megatron_mimo

    zero = megatron_mimo_parallel_utils.zero_grad_buffer_for_multimodule
    zero_and_drop = _also_drop_param_grads(zero)
    for owner in (megatron_mimo_parallel_utils, train_megatron_mimo):  # bound by name in the loop
        _swaps.swap(owner, "zero_grad_buffer_for_multimodule", zero_and_drop, original=zero)


def _install_runtime_redirects() -> None:
    import torch
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    global _mode
    for owner in (c10d, dist):
        _swaps.swap(owner, "new_group", _gloo_instead_of_nccl(owner.new_group))
    # _new_process_group_helper builds gloo groups by this module-global name
    if getattr(c10d, "ProcessGroupGloo", None) is not None:
        _swaps.swap(c10d, "ProcessGroupGloo", _gloo_on_one_device(c10d.ProcessGroupGloo))

    cuda = torch.cuda
    _swaps.swap(cuda, "current_device", lambda: 0)
    _swaps.swap(cuda, "set_device", lambda *a, **k: None)
    _swaps.swap(cuda, "synchronize", lambda *a, **k: None)
    _swaps.swap(cuda, "current_stream", lambda *a, **k: _NullStream())
    _swaps.swap(cuda, "default_stream", lambda *a, **k: _NullStream())
    _swaps.swap(cuda, "Stream", _NullStream)
    _swaps.swap(cuda, "Event", _NullEvent)
    _swaps.swap(cuda, "stream", lambda *a, **k: contextlib.nullcontext())

    from megatron.bridge.models.megatron_mimo import build_model

    _swaps.swap(build_model, "_set_per_module_random_seeds",
                _wrap_bridge_seeding(build_model._set_per_module_random_seeds))

    _install_training_loop_redirects()

    _mode = _make_mode()
    _mode.__enter__()


def activate(*, force: bool = False) -> None:
    """Redirect CUDA/NCCL to CPU/gloo for the real MegatronMIMO path in this process."""
    global _active
    import torch

    with _lock:
        if _active:
            return
        if torch.cuda.is_available() and not force:
            raise RuntimeError(
                "mimo_accel_dev.rehearse.cpu.activate() refused: CUDA is available on this machine, and the CPU "
                "layer would move the real run off the GPUs. Train on the GPUs as usual, or pass "
                "force=True to rehearse on CPU anyway."
            )
        try:
            prepare_imports()
            _install_runtime_redirects()
        except BaseException:
            _undo()
            raise
        _active = True


def _undo() -> None:
    global _mode
    if _mode is not None:
        _mode.__exit__(None, None, None)
        _mode = None
    _swaps.restore()
    for name in reversed(_stub_modules):
        if getattr(sys.modules.get(name), STAND_IN_MARKER, False):
            del sys.modules[name]
    _stub_modules.clear()


def deactivate() -> None:
    """Restore everything :func:`activate` (and :func:`prepare_imports`) changed."""
    global _active
    with _lock:
        _undo()
        _active = False


def is_active() -> bool:
    return _active
