"""The profiler's hooks into a real MegatronMIMO run (installed by the patch engine only when
``profile`` is on; when it is off, none of this is installed).

- ``ModalitySubmodules.encode``: on first use, a forward/backward timer is attached to each real
  encoder module (its regions named by the module's timer, :mod:`mimo_accel.modules`); images and
  patches are counted from ``grid_thw``.
- the step's batch hook (:meth:`Profiling.record_batch`): samples, real tokens, samples and bytes
  read by this rank, and what the plan predicted for the batch (from its tag).
- ``MimoOptimizer.step``: closes the step line (one line per training iteration).
- ``train_megatron_mimo`` (via ``pretrain_megatron_mimo``): closes the file when training ends.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
from typing import Any, Callable, Optional

from mimo_accel.config import AccelConfig
from mimo_accel.modules import ENCODER_TIMER
from mimo_accel.runtime.state import Runtime

ENV_LABEL = "MIMO_ACCEL_PROFILE_LABEL"


def _label(cfg: AccelConfig) -> str:
    return os.environ.get(ENV_LABEL) or ("accelerated" if (cfg.sharded_reads or cfg.packing) else "baseline")


def evaluating() -> bool:
    """A forward pass outside training: Bridge's ``evaluate`` runs its forward-only passes under
    ``torch.no_grad`` (a training step's batch fetch and encoder forward run with grad enabled;
    a recomputation inside a backward has a graph task and is not an evaluation)."""
    import torch

    return not torch.is_grad_enabled() and torch._C._current_graph_task_id() == -1


class Profiling:
    """The profiler's state in one training process: the rank's recorder, its encoder timers and
    the device-side counts of the current step."""

    def __init__(self, runtime: Runtime):
        self.runtime = runtime
        self.config = runtime.config
        self._lock = threading.Lock()
        self._recorder = None
        self._noted: set = set()  # notice keys already written into a step line
        self._timers: dict[int, Any] = {}
        # Device-side counts of the current step, read back once at the step's end (the optimizer
        # step has synchronised by then), so profiling adds no host sync per micro-batch.
        self._pending_counts: list = []

    def recorder(self):
        """This rank's Recorder, created on first use (needs torch.distributed to be initialised)."""
        if self._recorder is not None:
            return self._recorder
        with self._lock:
            if self._recorder is None:
                import torch.distributed as dist

                from mimo_accel.profiler import Recorder

                ctx = self.runtime.shard_context()
                rank = dist.get_rank() if dist.is_initialized() else 0
                world = dist.get_world_size() if dist.is_initialized() else 1
                cfg = self.config
                self._recorder = Recorder(
                    cfg.profile, rank=rank, world_size=world,
                    module=ctx.module if ctx else "unknown",
                    dp_rank=ctx.dp_rank if ctx else 0, dp_size=ctx.dp_size if ctx else 1,
                    layout={"dp": dict(ctx.dp_sizes)} if ctx else {},
                    config={"features": cfg.features(), "reorder_mode": cfg.reorder_mode,
                            "pad_multiple": cfg.pad_multiple},
                    label=_label(cfg))
        return self._recorder

    def saw_model(self, mimo_model) -> None:
        """The MimoModel this rank runs, first seen by the step (its modules' names and parts)."""

    def close(self) -> None:
        with self._lock:
            for timer in self._timers.values():
                timer.remove()
            self._timers.clear()
            self._pending_counts.clear()
            self._noted.clear()
            if self._recorder is not None:
                self._recorder.close()
            self._recorder = None

    def finish(self) -> None:
        """Training ended: close this rank's file (a recorder not yet made stays unmade)."""
        with self._lock:
            if self._recorder is not None:
                self._recorder.close()

    def record_batch(self, batch: dict, *, read_samples: int, read_bytes: int = 0, tag=None) -> None:
        """Called by the step with the local batch of this step. ``read_bytes``: tensor bytes of the
        batch as it reached the step (the whole micro-batch upstream, the share when sharded); on
        language ranks upstream has already dropped the raw images by then. ``tag``: the batch's
        :class:`~mimo_accel.runtime.shard.ShardTag` when sharded reads delivered it."""
        rec = self.recorder()
        if rec is None or evaluating():  # an evaluation pass is not part of a training step
            return
        ids = batch.get("input_ids")
        mask = batch.get("attention_mask")
        samples = int(ids.size(0)) if ids is not None and ids.dim() == 2 else 0
        rec.add(samples=samples, samples_read=read_samples, bytes_read=read_bytes)
        if mask is not None:
            self._pending_counts.append(("tokens", mask.sum()))
        if tag is not None:
            if tag.bytes_exchanged:
                rec.add(bytes_exchanged=int(tag.bytes_exchanged))
            if tag.predicted_spread is not None:
                rec.set(predicted_spread=tag.predicted_spread)
            if tag.predicted_spreads:
                rec.set(predicted_spreads=dict(tag.predicted_spreads))

    def _attach_new_notes(self, rec) -> None:
        """Notices said since the last step (which length source packing used, nothing to balance,
        ...) go into this step's line, so the report shows them beside the figures they explain."""
        said = self.runtime.notices()
        new = [m for k, m in said.items() if k not in self._noted]
        if new:
            self._noted.update(said)
            rec.set(notes=new)

    def end_step(self) -> None:
        rec = self.recorder()
        if rec is None:
            return
        for name, value in self._pending_counts:
            rec.add(**{name: int(value)})
        self._pending_counts.clear()
        self._attach_new_notes(rec)
        rec.end_step()

    def time_encoders(self, submodule, encoders_data_batch) -> None:
        """Attach a timer to each encoder of ``submodule`` on first use; count images and patches."""
        from mimo_accel.profiler import attach_module_timer

        rec = self.recorder()
        for name, encoder in submodule.encoders.items():
            if id(encoder) not in self._timers:
                self._timers[id(encoder)] = attach_module_timer(encoder, rec, name=ENCODER_TIMER)
            grid = (encoders_data_batch.get(name) or {}).get("grid_thw")
            if grid is not None and grid.numel():
                per_image = grid.prod(dim=-1)
                rec.add(images=int(grid.size(0)))
                self._pending_counts.extend((("patches", per_image.sum()),
                                             ("sq_patches", (per_image * per_image).sum())))

    def paused_timers(self) -> contextlib.ExitStack:
        stack = contextlib.ExitStack()
        for timer in list(self._timers.values()):
            stack.enter_context(timer.paused())
        return stack


def wrap_encode(original: Callable, runtime: Runtime) -> Callable:
    @functools.wraps(original)
    def encode(self, encoders_data_batch, *args, **kwargs):
        profiling = runtime.profiling
        if profiling is not None and evaluating():
            with profiling.paused_timers():  # an evaluation pass is not part of a training step
                return original(self, encoders_data_batch, *args, **kwargs)
        if profiling is not None and encoders_data_batch:
            profiling.time_encoders(self, encoders_data_batch)
        return original(self, encoders_data_batch, *args, **kwargs)

    return encode


def wrap_optimizer_step(original: Callable, runtime: Runtime) -> Callable:
    @functools.wraps(original)
    def step(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        if runtime.profiling is not None:
            runtime.profiling.end_step()
        return result

    return step


def wrap_train_entry(original: Callable, runtime: Runtime) -> Callable:
    @functools.wraps(original)
    def train_megatron_mimo(*args, **kwargs):
        try:
            return original(*args, **kwargs)
        finally:
            profiling: Optional[Profiling] = runtime.profiling
            if profiling is not None:
                profiling.finish()

    return train_megatron_mimo
