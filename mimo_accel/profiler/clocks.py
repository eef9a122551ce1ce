"""The clocks a rank's regions are timed with, and the device they are for (the header's ``"clock"``).

``step_time_s`` is always wall time (what the user waits for; on a GPU the step has synchronised by
its end); ``step_cpu_s`` the host CPU time of the same interval. Regions (``<module>_fwd_s``, ...)
use the region clock: ``"cuda_event"`` on CUDA (event pairs, resolved at ``end_step`` after one
synchronize), ``"thread_cpu"`` on CPU with one intra-op thread (ranks sharing a small machine are
not charged for each other's slices), ``"process_cpu"`` with several (the calling thread's clock
would miss torch's OpenMP workers), or ``"wall"`` on request. A host-clock region stopped on another
thread than it started on falls back to wall time, counted in the step's ``clock_fallbacks``.
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
