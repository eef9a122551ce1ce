"""NVTX ranges around mimo_accel's work, for Nsight Systems; on CPU nothing at all.

Where CUDA is available these show on the timeline (``nsys profile -t cuda,nvtx``):
``mimo_accel/plan`` (planning a reorder window), ``mimo_accel/read`` (the sharded loader reading
a share), ``mimo_accel/pack`` (THD packing) and, with ``profile`` on, the module timers'
``mimo_accel/<module>_fwd`` / ``_bwd``. Whether NVTX is on is decided once per process, the first
time a range is asked for after torch is imported (``torch.cuda.is_available()``); where it is not
(torch's CPU build, whose ``torch.cuda.nvtx`` raises) no NVTX function is called.
"""

from __future__ import annotations

import contextlib
import functools
import sys
from typing import Any, Callable, Iterator, Optional

# Whether CUDA is there is a fact of the process: decided once, for every enable() alike.
_ops: Any = None  # None: not decided yet; False: off; else torch.cuda.nvtx


def _nvtx() -> Any:
    """torch.cuda.nvtx where CUDA is available, else None (decided once torch is imported)."""
    global _ops
    if _ops is None:
        torch = sys.modules.get("torch")
        if torch is None:
            return None  # undecided: a process that imports torch later decides then
        _ops = torch.cuda.nvtx if torch.cuda.is_available() else False
    return _ops or None


def disable() -> None:
    """No NVTX in this process from now on (a forked child of a CUDA process must not touch CUDA)."""
    global _ops
    _ops = False


@contextlib.contextmanager
def ranges_to(ops: Any) -> Iterator[None]:
    """Every range of the block goes to ``ops`` (torch.cuda.nvtx's functions, or a recorder of them)."""
    global _ops
    saved, _ops = _ops, ops
    try:
        yield
    finally:
        _ops = saved


def enabled() -> bool:
    """Whether this process emits NVTX ranges."""
    return _nvtx() is not None


def ranged(name: str) -> Callable[[Callable], Callable]:
    """Decorator: each call of the function runs inside a push/pop range ``name`` on its thread
    (nothing on CPU)."""

    def decorate(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def call(*args, **kwargs):
            ops = _nvtx()
            if ops is None:
                return fn(*args, **kwargs)
            ops.range_push(name)
            try:
                return fn(*args, **kwargs)
            finally:
                ops.range_pop()

        return call

    return decorate


def start(name: str) -> Optional[int]:
    """Open a range that may end on another thread (a backward pass); its handle, or None on CPU."""
    ops = _nvtx()
    return ops.range_start(name) if ops is not None else None


def end(handle: Optional[int]) -> None:
    """Close a range :func:`start` opened (None: nothing was opened)."""
    if handle is not None:
        _nvtx().range_end(handle)
