"""The device under the measurements: timers, the attention kernel, a one-rank session."""

from __future__ import annotations

import contextlib
import math
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

from mimo_accel_dev.commands.calibrate_gpu.points import MeasureError, PROG


# ------------------------------------------------------------------------------ the devices


class CudaTimer:
    """Seconds of ``fn()`` on the current CUDA stream (CUDA events, then synchronize)."""

    def __init__(self, torch):
        self._torch = torch

    def __call__(self, fn: Callable[[], None]) -> float:
        cuda = self._torch.cuda
        start, end = cuda.Event(enable_timing=True), cuda.Event(enable_timing=True)
        cuda.synchronize()
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3


def cpu_timer(fn: Callable[[], None]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _sdpa_segments(q, k, v, bounds: list[int], causal: bool, scale: float):
    """Attention once per ``bounds`` segment of packed ``[T, heads, dim]`` q/k/v with torch SDPA;
    KV groups expanded to the query heads. Returns ``[T, heads * dim]``."""
    import torch
    from torch.nn import functional as F

    groups = q.size(1) // k.size(1)
    outs = []
    for start, stop in zip(bounds[:-1], bounds[1:]):
        qs, ks, vs = (t[start:stop].transpose(0, 1) for t in (q, k, v))  # [heads, n, dim]
        if groups > 1:
            ks, vs = ks.repeat_interleave(groups, dim=0), vs.repeat_interleave(groups, dim=0)
        o = F.scaled_dot_product_attention(qs, ks, vs, is_causal=causal, scale=scale)
        outs.append(o.transpose(0, 1).reshape(stop - start, -1))
    return torch.cat(outs)


def _varlen_kernel():
    """torch's variable-length flash attention (``torch.nn.attention.varlen.varlen_attn``: one
    call over every ``cu_seqlens`` segment, as Transformer Engine's THD attention) as
    ``call(q, k, v, cu, max_len, causal, scale) -> [T, heads, dim]``, or None where this torch has
    none. Its keyword names changed between torch releases; both spellings are handled."""
    try:
        import inspect

        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    params = inspect.signature(varlen_attn).parameters
    if "window_size" not in params and "is_causal" not in params:
        return None

    def call(q, k, v, cu, max_len, causal, scale):
        kw: dict[str, Any] = {"scale": scale}
        if k.size(1) != q.size(1):
            if "enable_gqa" in params:
                kw["enable_gqa"] = True
            else:
                groups = q.size(1) // k.size(1)
                k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        if "window_size" in params:
            kw["window_size"] = (-1, 0) if causal else (-1, -1)
        else:
            kw["is_causal"] = causal
        return varlen_attn(q, k, v, cu, cu, max_len, max_len, **kw)

    return call


def choose_attention(device: str, dtype: str, heads: int, groups: int, head_dim: int, causal: bool):
    """(kernel or None, its name): torch's varlen flash attention on CUDA where it runs here,
    forward and backward, at these heads and this dtype and agrees with per-segment SDPA on a
    small packed input; else per-segment SDPA (always on CPU)."""
    if device != "cuda":
        return None, "sdpa per segment"
    call = _varlen_kernel()
    if call is None:
        return None, "sdpa per segment (this torch has no varlen attention)"
    import torch

    try:
        g = torch.Generator(device="cpu").manual_seed(0)
        shape_q, shape_kv = (96, heads, head_dim), (96, groups, head_dim)
        q, k, v = (torch.randn(s, generator=g).to(device="cuda", dtype=torch_dtype(dtype)).requires_grad_(True)
                   for s in (shape_q, shape_kv, shape_kv))
        cu = torch.tensor([0, 32, 96], dtype=torch.int32, device="cuda")
        scale = head_dim ** -0.5
        out = call(q, k, v, cu, 64, causal, scale)
        out.float().square().sum().backward()
        ref = _sdpa_segments(q.detach(), k.detach(), v.detach(), [0, 32, 96], causal, scale)
        err = float((out.detach().reshape(96, -1) - ref).abs().max())
        if not math.isfinite(err) or err > 5e-2:
            return None, f"sdpa per segment (varlen attention disagreed with it by {err:.3g})"
        if q.grad is None or not bool(torch.isfinite(q.grad).all()):
            return None, "sdpa per segment (varlen attention gave no finite gradient)"
    except Exception as exc:  # an unsupported dtype, head dim or GPU: the portable path
        return None, f"sdpa per segment (varlen attention unavailable: {type(exc).__name__}: " \
                     f"{' '.join(str(exc).split())[:120]})"
    return call, "varlen flash attention (torch.nn.attention.varlen)"


def core_attention(kernel):
    """Megatron-core's ``DotProductAttention`` interface for packed (THD) q/k/v: ``kernel`` (one
    varlen call) or torch SDPA once per ``cu_seqlens`` segment; bidirectional for a ``no_mask``
    layer (an image), causal for a ``causal`` one (a sequence)."""
    from megatron.core.transformer.dot_product_attention import DotProductAttention
    from megatron.core.transformer.enums import AttnMaskType

    class PackedAttention(DotProductAttention):
        def forward(self, query, key, value, attention_mask, attn_mask_type=None, attention_bias=None,
                    packed_seq_params=None):
            if packed_seq_params is None:
                raise ValueError(f"{PROG}: the measured modules run packed (THD) inputs only")
            causal = self.attn_mask_type == AttnMaskType.causal
            cu = packed_seq_params.cu_seqlens_q
            if kernel is not None:
                longest = packed_seq_params.max_seqlen_q
                longest = int(longest) if longest is not None else int((cu[1:] - cu[:-1]).max())
                out = kernel(query, key, value, cu.int(), longest, causal, self.softmax_scale)
                return out.reshape(query.size(0), -1)
            return _sdpa_segments(query, key, value, cu.tolist(), causal, self.softmax_scale)

    return PackedAttention


@contextlib.contextmanager
def session(device: str, log_path: str) -> Iterator[Any]:
    """One process as one rank of world size 1: the process group, megatron's global memory
    buffer and RNG tracker; on CPU the CPU layer (:func:`mimo_accel_dev.rehearse.cpu.activate`),
    never on CUDA. Yields the ``ProcessGroupCollection``; undoes what it set up."""
    from mimo_accel.tools import quiet
    from mimo_accel_dev.rehearse import cpu as cpu_layer

    cpu = cpu_layer if device == "cpu" else None  # megatron's CUDA paths run on CPU through the CPU layer
    with quiet.output_to(log_path):
        cpu_layer.prepare_imports()  # the 3.11 back-port; stand-ins only for packages not installed
        import torch
        import torch.distributed as dist
        from megatron.core import parallel_state
        from megatron.core.process_groups_config import ProcessGroupCollection
        from megatron.core.tensor_parallel import random as mp_random
        import megatron.bridge.models.qwen_vl.modelling_qwen3_vl.vision_model  # noqa: F401

    activated = False
    threads = torch.get_num_threads()
    if device == "cpu":
        torch.set_num_threads(1)  # a second thread on a shared CPU makes timings swing several-fold
        if not cpu.is_active():
            with quiet.output_to(log_path):  # it imports more of megatron.bridge
                cpu.activate(force=True)
            activated = True
    created = False
    buffer = False
    store = tempfile.mkdtemp(prefix="mimo-accel-calibrate-gpu-")
    try:
        if device == "cuda":
            torch.cuda.set_device(torch.cuda.current_device())
        if not dist.is_initialized():
            dist.init_process_group("nccl" if device == "cuda" else "gloo", init_method=f"file://{store}/pg",
                                    rank=0, world_size=1)
            created = True
        elif dist.get_world_size() != 1:
            raise MeasureError(f"run it as one process (this one is a rank of {dist.get_world_size()}); "
                               "it measures one device")
        if getattr(parallel_state, "_GLOBAL_MEMORY_BUFFER", None) is None:
            parallel_state._set_global_memory_buffer()
            buffer = True
        torch.manual_seed(0)
        if device == "cuda":
            try:
                mp_random.model_parallel_cuda_manual_seed(1, tp_rank=0, ep_rank=0, etp_rank=0)
            except TypeError:  # a megatron-core without the explicit ranks
                mp_random.model_parallel_cuda_manual_seed(1)
        else:
            cpu.seed_cpu_rng_tracker(1)
        g = dist.group.WORLD
        yield ProcessGroupCollection(tp=g, cp=g, pp=g, dp=g, dp_cp=g, embd=None, pos_embd=None)
    finally:
        if buffer:
            parallel_state.destroy_global_memory_buffer()
        if created:
            dist.destroy_process_group()
        if activated:
            cpu.deactivate()
            cpu.prepare_imports()  # megatron.bridge stays imported: keep what its imports need
        torch.set_num_threads(threads)
        with contextlib.suppress(OSError):
            for name in os.listdir(store):
                os.unlink(os.path.join(store, name))
            os.rmdir(store)


def torch_dtype(name: str):
    import torch

    return {"bf16": torch.bfloat16, "fp32": torch.float32}[name]


def device_info(device: str, dtype: str) -> dict[str, Any]:
    from importlib import metadata

    import torch

    info: dict[str, Any] = {"kind": device, "dtype": dtype, "torch": torch.__version__}
    for pkg in ("megatron-core", "megatron-bridge", "transformer-engine"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            info[pkg] = metadata.version(pkg)
    if device == "cuda":
        info["name"] = torch.cuda.get_device_name()
        info["cuda"] = torch.version.cuda
    else:
        import platform

        info["name"] = platform.processor() or platform.machine()
        info["threads"] = torch.get_num_threads()
    return info
