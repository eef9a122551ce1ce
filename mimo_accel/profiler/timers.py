"""Module timer: an ``nn.Module``'s forward and backward as regions of a :class:`Recorder`."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

from mimo_accel.profiler.recorder import Recorder, module_regions


class ModuleTimer:
    """Times an ``nn.Module``'s forward and backward as regions ``<name>_fwd`` / ``<name>_bwd``.

    Forward: forward-pre-hook to forward-hook (``always_call``, so an exception closes it); a forward
    run inside a backward (activation recomputation) counts in the backward. Backward: from the
    arrival of the gradient of the module's output (a hook on each output tensor, registered by the
    forward hook) to the end of the autograd graph task that delivered it (a final callback; where the
    encoder shares a graph with other modules, its tail: the encoder ran first). Not
    ``register_full_backward_hook``: where no input requires grad (pixel values never do) torch fires
    it as the output gradient arrives, measuring ~0. ``skip``: asked at each forward's start; a yes
    leaves that forward and its backward untimed (an evaluation pass). The regions are declared to the
    recorder, so every later step line carries them, null when untimed."""

    def __init__(self, module: Any, recorder: Recorder, name: str = "vision",
                 skip: Callable[[], bool] | None = None) -> None:
        import torch

        self._torch = torch
        self.recorder = recorder
        self.name = name
        self._fwd, self._bwd = module_regions(name)
        recorder.declare(regions=(self._fwd, self._bwd))
        self._active = True
        self._skip = skip
        self._skipped = 0
        self._recompute_depth = 0
        self._bwd_tasks: set[int] = set()
        self._lock = threading.Lock()
        self._handles = [
            module.register_forward_pre_hook(self._pre_forward),
            module.register_forward_hook(self._post_forward, always_call=True),
        ]

    # forward ------------------------------------------------------------------------------------
    def _pre_forward(self, module: Any, args: Any) -> None:
        if not self._active:
            return
        if self._skipped or (self._skip is not None and self._skip()):
            self._skipped += 1  # this forward and any nested in it: not timed
            return
        task = self._torch._C._current_graph_task_id()
        if task != -1:
            # Recomputation inside a backward (activation checkpointing). With reentrant
            # checkpointing the forward ran under no_grad, so no output hook was registered:
            # the backward region starts here at the latest.
            self._recompute_depth += 1
            self._begin_backward(task)
            return
        self.recorder.start(self._fwd)

    def _post_forward(self, module: Any, args: Any, output: Any) -> None:
        if not self._active:
            return
        if self._skipped:
            self._skipped -= 1
            return
        if self._recompute_depth:
            self._recompute_depth -= 1
            return
        self.recorder.stop(self._fwd)
        if not self._torch.is_grad_enabled():
            return
        if isinstance(output, self._torch.Tensor):  # the common case, without the walk
            if output.requires_grad:
                output.register_hook(self._on_output_grad)
            return
        for t in iter_tensors(output, self._torch.Tensor):
            if t.requires_grad:
                t.register_hook(self._on_output_grad)

    # backward -----------------------------------------------------------------------------------
    def _on_output_grad(self, grad: Any) -> None:
        if self._active:
            self._begin_backward(self._torch._C._current_graph_task_id())

    def _begin_backward(self, task: int) -> None:
        with self._lock:
            if task in self._bwd_tasks:
                return
            self._bwd_tasks.add(task)
        self.recorder.start(self._bwd)
        self._torch.autograd.Variable._execution_engine.queue_callback(lambda: self._on_backward_done(task))

    def _on_backward_done(self, task: int) -> None:
        with self._lock:
            self._bwd_tasks.discard(task)
        self.recorder.stop(self._bwd)

    @contextlib.contextmanager
    def paused(self):
        """Nothing the module runs inside this block is timed (an evaluation pass)."""
        was, self._active = self._active, False
        try:
            yield
        finally:
            self._active = was

    def remove(self) -> None:
        """Remove the module hooks; output-gradient hooks already registered become no-ops."""
        self._active = False
        for h in self._handles:
            h.remove()
        self._handles.clear()


def iter_tensors(obj: Any, tensor_type: type, _depth: int = 0) -> Iterator[Any]:
    """The tensors of a module's output, in order, through nested tuples, lists and dicts."""
    if isinstance(obj, tensor_type):
        yield obj
    elif _depth < 4 and isinstance(obj, (tuple, list, dict)):
        for o in obj.values() if isinstance(obj, dict) else obj:
            yield from iter_tensors(o, tensor_type, _depth + 1)


def attach_module_timer(module: Any, recorder: Recorder, name: str = "vision",
                        skip: Callable[[], bool] | None = None) -> ModuleTimer:
    """Time ``module``'s forward and backward into ``recorder`` as ``<name>_fwd``/``<name>_bwd``
    (``name``: the module's name in the layout, e.g. ``"vision"``, ``"audios"``, ``"language"``).

    ``skip``: forwards for which it returns true are not timed. Returns a handle;
    ``handle.remove()`` detaches it. See :class:`ModuleTimer`.
    """
    return ModuleTimer(module, recorder, name, skip=skip)
