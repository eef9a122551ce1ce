"""The clocks a rank's regions are timed with, and the device they are for.

Clocks (recorded in the header under ``"clock"``):

* ``step_time_s`` is always **wall** time (``time.perf_counter``) from :meth:`Recorder.begin_step`
  (or the previous :meth:`Recorder.end_step`) to :meth:`Recorder.end_step`: it is what the user
  waits for, and on a GPU the step has synchronised by then (the loss is read on the host).
* ``step_cpu_s`` is the host CPU time of the same interval: process CPU time when the region clock
  is ``process_cpu``, else the calling thread's CPU time (on CUDA: the host side's own work).
* Regions (any ``<name>_s``: a module's forward and backward are ``<module>_fwd_s`` /
  ``<module>_bwd_s``, e.g. ``vision_fwd_s``, ``language_fwd_s``) use the **region clock**:

  - ``"cuda_event"`` on CUDA: a pair of timing events per region, recorded on the current stream;
    elapsed times are resolved at ``end_step`` after one ``synchronize`` of the last pending event
    (no other host sync is added).
  - ``"thread_cpu"`` on CPU with one intra-op thread (``time.thread_time``): CPU time of the calling
    thread, so ranks that share a small machine (oversubscription) are not charged for each
    other's time slices.
  - ``"process_cpu"`` on CPU with several intra-op threads (``time.process_time``): the calling
    thread's clock would miss the work of torch's OpenMP workers, so the whole process is counted
    (it then also counts any background threads that run during the region).
  - ``"wall"`` on request.

  On a host clock, a region stopped on a different thread from the one that started it (CPU
  autograd runs backward on the calling thread, so this should not happen) falls back to wall
  time for that interval and is counted in the step's ``clock_fallbacks`` field.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import Any

__all__ = ["CLOCKS", "CudaEventClock", "HostClock", "make_clock", "resolve_device"]

CLOCKS = ("auto", "thread_cpu", "process_cpu", "wall", "cuda_event")


class HostClock:
    """Host clock: marks are ``(clock value, thread id, wall)``; resolved immediately."""

    lazy = False

    def __init__(self, name: str) -> None:
        self.name = name
        self._fn: Callable[[], float] = {"thread_cpu": time.thread_time, "process_cpu": time.process_time,
                                         "wall": time.perf_counter}[name]
        self._per_thread = name == "thread_cpu"

    def mark(self) -> tuple[float, int, float]:
        return (self._fn(), threading.get_ident(), time.perf_counter())

    def elapsed(self, start: tuple[float, int, float], stop: tuple[float, int, float]) -> tuple[float, bool]:
        """Seconds between two marks, and whether it fell back to wall time (thread switch)."""
        if self._per_thread and start[1] != stop[1]:
            return stop[2] - start[2], True
        return stop[0] - start[0], False


class CudaEventClock:
    """CUDA clock: marks are timing events recorded on the current stream, resolved lazily."""

    lazy = True
    name = "cuda_event"

    def __init__(self) -> None:
        import torch

        self._torch = torch
        self._pool: list[Any] = []

    def mark(self) -> Any:
        ev = self._pool.pop() if self._pool else self._torch.cuda.Event(enable_timing=True)
        ev.record()
        return ev

    def resolve(self, pairs: list[tuple[str, Any, Any]]) -> list[tuple[str, float, bool]]:
        if not pairs:
            return []
        # One host wait: the last stop event. Events on other streams are normally long done by the
        # end of a step; query() them and wait only for the ones that are not.
        pairs[-1][2].synchronize()
        out = []
        for name, start, stop in pairs:
            if not stop.query():
                stop.synchronize()
            out.append((name, start.elapsed_time(stop) / 1e3, False))
            self._pool.append(start)
            self._pool.append(stop)
        return out


def make_clock(clock: str, device: str) -> HostClock | CudaEventClock:
    if clock not in CLOCKS:
        raise ValueError(f"clock must be one of {', '.join(CLOCKS)}; got {clock!r}")
    if clock == "auto":
        if device == "cuda":
            clock = "cuda_event"
        else:
            clock = "thread_cpu" if _intra_op_threads() <= 1 else "process_cpu"
    if clock == "cuda_event":
        if device != "cuda":
            raise ValueError("clock='cuda_event' needs device='cuda'")
        return CudaEventClock()
    return HostClock(clock)


def _intra_op_threads() -> int:
    torch = sys.modules.get("torch")  # do not import torch just to ask
    if torch is None:
        return 1
    try:
        return int(torch.get_num_threads())
    except Exception:  # pragma: no cover - exotic builds
        return 1


def resolve_device(device: str) -> str:
    if device not in ("auto", "cpu", "cuda"):
        raise ValueError(f"device must be 'auto', 'cpu' or 'cuda'; got {device!r}")
    if device != "auto":
        return device
    torch = sys.modules.get("torch")
    return "cuda" if torch is not None and torch.cuda.is_available() else "cpu"
