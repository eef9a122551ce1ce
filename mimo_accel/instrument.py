"""The profiler's hooks into a real MegatronMIMO run (installed by the patch engine only when
``profile`` is on; when it is off, none of this is imported or installed).

- ``ModalitySubmodules.encode``: on first use, a forward/backward timer is attached to each real
  encoder module (vision_fwd_s / vision_bwd_s); images and patches are counted from ``grid_thw``.
- the step's batch hook (:func:`record_batch`): samples, real tokens, samples read by this rank.
- ``MimoOptimizer.step``: closes the step line (one line per training iteration).
- ``train_megatron_mimo`` (via ``pretrain_megatron_mimo``): closes the file when training ends.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import os
import threading
from typing import Any, Callable, Optional

from mimo_accel.config import AccelConfig

ENV_LABEL = "MIMO_ACCEL_PROFILE_LABEL"

_lock = threading.Lock()
_recorder = None
_noted: set = set()  # notice keys already written into a step line
_timers: dict[int, Any] = {}
_config: Optional[AccelConfig] = None
_planned_spreads: collections.deque = collections.deque()
# Device-side counts of the current step, read back once at the step's end (the optimizer step has
# synchronised by then), so profiling adds no host sync per micro-batch.
_pending_counts: list = []


def _label(cfg: AccelConfig) -> str:
    return os.environ.get(ENV_LABEL) or ("accelerated" if (cfg.sharded_reads or cfg.packing) else "baseline")


def recorder():
    """This rank's Recorder, created on first use (needs torch.distributed to be initialised)."""
    global _recorder
    if _recorder is not None or _config is None or _config.profile is None:
        return _recorder
    with _lock:
        if _recorder is None:
            import torch.distributed as dist

            from mimo_accel import sampler
            from mimo_accel.profiler import Recorder

            ctx = sampler.current_context()
            rank = dist.get_rank() if dist.is_initialized() else 0
            world = dist.get_world_size() if dist.is_initialized() else 1
            _recorder = Recorder(
                _config.profile, rank=rank, world_size=world,
                module=ctx.module if ctx else "unknown",
                dp_rank=ctx.dp_rank if ctx else 0, dp_size=ctx.dp_size if ctx else 1,
                layout={"dp": dict(ctx.dp_sizes)} if ctx else {},
                config={"features": _config.features(), "reorder_mode": _config.reorder_mode,
                        "pad_multiple": _config.pad_multiple},
                label=_label(_config))
    return _recorder


def configure(cfg: AccelConfig) -> None:
    global _config
    _config = cfg


def close() -> None:
    global _recorder, _config
    with _lock:
        for timer in _timers.values():
            timer.remove()
        _timers.clear()
        _planned_spreads.clear()
        _pending_counts.clear()
        _noted.clear()
        if _recorder is not None:
            _recorder.close()
        _recorder = None
        _config = None


def record_plan(global_indices, local_indices, spread: Optional[float]) -> None:
    """Called by the sharded sampler, in loader order, for every planned global micro-batch."""
    if _config is not None and _config.profile is not None:
        _planned_spreads.append(spread)


def record_exchange(stats) -> None:
    """Called by the exchange loader on the consuming thread, once per exchanged micro-batch."""
    if _config is not None and _config.profile is not None:
        _planned_spreads.append(stats.predicted_spread)  # popped in order by record_batch
        rec = recorder()
        if rec is not None and not _evaluating():
            rec.add(bytes_exchanged=int(stats.bytes_sent))


def record_batch(batch: dict, *, read_samples: int, read_bytes: int = 0, tagged: bool) -> None:
    """Called by the step's batch hook with the local batch of this step. ``read_bytes``: tensor
    bytes of the batch as it reached the step (the whole micro-batch upstream, the share when
    sharded); on language ranks upstream has already dropped the raw images by then."""
    rec = recorder()
    if rec is None:
        return
    if _evaluating():  # not part of a training step; its plan's spread is dropped in order
        if tagged and _planned_spreads:
            _planned_spreads.popleft()
        return
    ids = batch.get("input_ids")
    mask = batch.get("attention_mask")
    samples = int(ids.size(0)) if ids is not None and ids.dim() == 2 else 0
    rec.add(samples=samples, samples_read=read_samples, bytes_read=read_bytes)
    if mask is not None:
        _pending_counts.append(("tokens", mask.sum()))
    if tagged and _planned_spreads:
        spread = _planned_spreads.popleft()
        if spread is not None:
            rec.set(predicted_spread=spread)


def _evaluating() -> bool:
    """A forward pass outside training: Bridge's ``evaluate`` runs its forward-only passes under
    ``torch.no_grad`` (a training step's batch fetch and encoder forward run with grad enabled;
    a recomputation inside a backward has a graph task and is not an evaluation)."""
    import torch

    return not torch.is_grad_enabled() and torch._C._current_graph_task_id() == -1


def wrap_encode(original: Callable) -> Callable:
    from mimo_accel.profiler import attach_module_timer

    @functools.wraps(original)
    def encode(self, encoders_data_batch, *args, **kwargs):
        rec = recorder()
        if rec is not None and _evaluating():
            with contextlib.ExitStack() as stack:  # an evaluation pass is not part of a training step
                for timer in list(_timers.values()):
                    stack.enter_context(timer.paused())
                return original(self, encoders_data_batch, *args, **kwargs)
        if rec is not None and encoders_data_batch:
            for name, encoder in self.encoders.items():
                if id(encoder) not in _timers:
                    _timers[id(encoder)] = attach_module_timer(encoder, rec, name="vision")
                grid = (encoders_data_batch.get(name) or {}).get("grid_thw")
                if grid is not None and grid.numel():
                    per_image = grid.prod(dim=-1)
                    rec.add(images=int(grid.size(0)))
                    _pending_counts.extend((("patches", per_image.sum()), ("sq_patches", (per_image * per_image).sum())))
        return original(self, encoders_data_batch, *args, **kwargs)

    return encode


def _attach_new_notes(rec) -> None:
    """Notices said since the last step (which length source packing used, nothing to balance, ...)
    go into this step's line, so the report shows them beside the figures they explain."""
    from mimo_accel import notices

    said = notices.said()
    new = [m for k, m in said.items() if k not in _noted]
    if new:
        _noted.update(said)
        rec.set(notes=new)


def wrap_optimizer_step(original: Callable, cfg: AccelConfig) -> Callable:
    configure(cfg)

    @functools.wraps(original)
    def step(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        rec = recorder()
        if rec is not None:
            for name, value in _pending_counts:
                rec.add(**{name: int(value)})
            _pending_counts.clear()
            _attach_new_notes(rec)
            rec.end_step()
        return result

    return step


def wrap_train_entry(original: Callable, cfg: AccelConfig) -> Callable:
    configure(cfg)

    @functools.wraps(original)
    def train_megatron_mimo(*args, **kwargs):
        try:
            return original(*args, **kwargs)
        finally:
            if _recorder is not None:
                _recorder.close()

    return train_megatron_mimo
