"""Plans made ahead, off the training thread (docs/design.md, "Plans made ahead").

torch iterates a DataLoader's batch sampler on the training thread, so a plan made inside
``next()`` would be paid on the step's critical path. Each pass over a reordering loader has a
planner thread of its own: it reads a copy of upstream's sampler window by window, has the window
planned in a forked child (:class:`ForkedPlanner`: numpy on a thread would take the interpreter
lock from the training thread), agrees the plan with every data-loading rank and queues this
replica's share, up to :data:`DEPTH` windows ahead. ``next()`` takes the next share; a wait for it
travels with the batch to the profiler (``plan_wait_s``). The shares are the serial plan's, bit for
bit, and the copy's state (``consumed_samples``, epoch) is carried to the loader's sampler as each
window is taken.
"""

from __future__ import annotations

import copy
import functools
import logging
import multiprocessing
import os
import queue
import threading
import time
import traceback
import weakref
from collections import deque
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterator, Optional

import numpy as np

from mimo_accel.nvtx import ranged

logger = logging.getLogger("mimo_accel")

DEPTH = 3  # windows queued ahead of the one training
_POLL_S = 0.1  # how often a thread blocked on a full queue looks whether its consumer is gone


# ------------------------------------------------------------------------------ the arithmetic


def _portable(exc: BaseException) -> BaseException:
    """``exc`` if it survives pickling, else a RuntimeError carrying its type and message."""
    import pickle

    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:  # noqa: BLE001 - any exception that does not round-trip
        return RuntimeError(f"{type(exc).__name__}: {exc}")


def _serve(planner, conn, parent: int) -> None:
    """The child's loop: plan each window sent, reply with the order, the spread and what the
    planner said (said again by the parent, whose logging this child must not touch)."""
    from mimo_accel import nvtx

    nvtx.disable()  # a forked child touches nothing of CUDA; its planning shows as the parent thread's range
    said: list = []
    if hasattr(planner, "notify"):
        planner.notify = lambda key, message: said.append((key, message))
    while True:
        if not conn.poll(1.0):
            if os.getppid() != parent:  # the training process is gone
                return
            continue
        try:
            message = conn.recv()
        except EOFError:
            return
        if message is None:
            return
        indices, micro_batches, extra = message
        try:
            order, *rest = planner(indices, micro_batches, *extra)
            reply = ("ok", np.asarray(order, dtype=np.int64), rest, list(said))
        except BaseException as exc:  # noqa: BLE001 - handed to the parent, raised there
            exc.add_note("".join(traceback.format_exception(exc)).rstrip())
            reply = ("error", _portable(exc), None, list(said))
        said.clear()
        conn.send(reply)


class ForkedPlanner:
    """``planner`` run in a forked child: ``self(indices, micro_batches)`` as the planner itself.

    Forked, not spawned: the child starts at once with the planner, its cost index (shared with
    the parent page by page) and whatever the parent patched, and imports nothing. The child runs
    numpy only, never CUDA or the job's store. It exits when :meth:`close` asks, when the parent
    process is gone, and with the parent (a daemonic child).
    """

    def __init__(self, planner, notify: Optional[Callable[[str, str], object]] = None):
        context = multiprocessing.get_context("fork")
        self._conn, child = context.Pipe()
        self.notify = notify if notify is not None else getattr(planner, "notify", None)
        self.process = context.Process(target=_serve, args=(planner, child, os.getpid()), daemon=True,
                                       name="mimo-accel-planner")
        self.process.start()
        child.close()

    @ranged("mimo_accel/plan")  # on the planner thread, around the child's planning (NVTX on CUDA only)
    def __call__(self, indices, micro_batches: int, *extra):
        self._conn.send((np.asarray(indices, dtype=np.int64), micro_batches, extra))
        try:
            kind, value, rest, said = self._conn.recv()
        except EOFError:
            self._reap(1.0)
            raise RuntimeError(f"mimo_accel: the planner process exited (exit code {self.process.exitcode}) "
                               "while planning; was it killed (out of memory)?") from None
        for key, message in said:
            if self.notify is not None:
                self.notify(key, message)
        if kind == "error":
            raise value
        return (value, *rest)  # the order as int64, as the child made it

    def close(self) -> None:
        try:
            self._conn.send(None)
        except (OSError, ValueError):
            pass  # the child is gone already
        self._conn.close()
        self._reap(5.0)

    def _reap(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` for the child to exit, then end it. Asks the kernel (waitpid), not
        ``join(timeout)``'s sentinel pipe: a process that another thread forks meanwhile (a DataLoader
        worker) can inherit that pipe's open end and hold it until it exits itself."""
        deadline = time.monotonic() + timeout_s
        while self.process.exitcode is None and time.monotonic() < deadline:
            time.sleep(0.002)
        if self.process.exitcode is None:
            self.process.terminate()
        self.process.join()  # no timeout: waitpid itself


# --------------------------------------------------------------------------------- the pass


@dataclass(frozen=True)
class PassSpec:
    """What one pass plans: ``windows()`` yields ``(ordinal, micro-batches, sampler state, first
    micro-batch)`` of upstream's sampler copy; ``plan(worker, batches, model)`` gives a window's
    shares (a list of :class:`~mimo_accel.runtime.reading.shard.ReplicaShare`), its digest and its first
    global index."""

    windows: Callable[[], Iterator]
    plan: Callable[[Any, list], tuple]
    planner: Any
    check: Any = None  # a plan_check.WindowCheck, or None (a single data rank)
    pass_no: int = 0
    in_process: bool = True
    # models(first micro-batch of a window) -> its calibration.WindowModel, or None (online calibration)
    models: Optional[Callable[[int], Any]] = None


def put_unless_stopped(out: "queue.Queue", item, stop: threading.Event) -> bool:
    """Put ``item`` on the bounded queue ``out`` once there is room; False if ``stop`` is set first
    (its consumer is gone: a producer thread must not block forever)."""
    while not stop.is_set():
        try:
            out.put(item, timeout=_POLL_S)
            return True
        except queue.Full:
            continue
    return False


def _feed(spec: PassSpec, out: "queue.Queue", stop: threading.Event, worker) -> None:
    """The planner thread: plan, agree and queue each window of the pass, ahead of training, with
    ``worker`` (a ForkedPlanner, closed when the pass ends, or the planner itself, run on this thread)."""
    put = functools.partial(put_unless_stopped, out, stop=stop)
    check, posted = spec.check, False
    ordinal = 0
    try:
        for ordinal, batches, state, first_micro_batch in spec.windows():
            posted = False
            if stop.is_set():
                break
            model = spec.models(first_micro_batch) if spec.models is not None else None
            shares, digest, first = spec.plan(worker, batches, model)
            if check is not None:
                posted = True
                check.agree(spec.pass_no, ordinal, digest, first_index=first)
            if not put(("window", shares, state)):
                ordinal += 1
                posted = False
                break
        else:
            put(("end", None, None))
            return
        if check is not None and not posted:  # dropped: the others must not wait for this rank
            check.abandon(spec.pass_no, ordinal, "its loader was dropped")
    except BaseException as exc:  # noqa: BLE001 - handed to the training thread, raised at its batch
        if check is not None and not posted:
            try:
                check.failed(spec.pass_no, ordinal, exc)
            except Exception:  # noqa: BLE001 - the planner's own error is the one to raise
                logger.exception("mimo_accel: could not tell the other ranks that planning failed")
        put(("error", exc, None))
    finally:
        if isinstance(worker, ForkedPlanner):
            worker.close()


class PlannedPass:
    """One pass over a reordering loader: this replica's share of each global micro-batch, planned
    ahead by a thread of its own (started when the pass is made).

    Dropping the pass (or exhausting it) stops its thread and child process.
    """

    def __init__(self, spec: PassSpec, on_window: Callable[[dict], None], base: Optional[dict] = None,
                 depth: int = DEPTH):
        self._base = base  # the loader's sampler's attributes when the pass copied it
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._on_window = on_window  # carries the sampler copy's state over to the loader's sampler
        self._pending: deque = deque()
        self._done = False
        self.untaken = True  # nothing taken from this pass yet
        # Forked here, on the thread that makes the pass (the one that forks the DataLoader's workers
        # too): a fork from the planner thread, racing one from that thread, hands each child the
        # other's half-made pipes, and each then waits seconds on the other's exit.
        # (POSIX only; a daemonic multiprocessing child may not have children)
        can_fork = hasattr(os, "fork") and not multiprocessing.current_process().daemon
        worker = ForkedPlanner(spec.planner) if spec.in_process and can_fork else spec.planner
        self.thread = threading.Thread(target=_feed, args=(spec, self._queue, self._stop, worker), daemon=True,
                                       name=f"mimo-accel-plan-ahead-{spec.pass_no}")
        self.thread.start()
        weakref.finalize(self, self._stop.set)

    def __iter__(self) -> "PlannedPass":
        return self

    def __next__(self):
        self.untaken = False
        if self._pending:
            return self._pending.popleft()
        if self._done:
            raise StopIteration
        t0 = time.perf_counter()
        while True:
            try:
                kind, value, state = self._queue.get(timeout=1.0)
                break
            except queue.Empty:
                if not self.thread.is_alive():
                    self._done = True
                    raise RuntimeError("mimo_accel: the planner thread ended without handing over its "
                                       "windows") from None
        waited = time.perf_counter() - t0
        if kind != "window":  # the pass is over: its thread is ending, and leaves nothing behind
            self.close()
            self.thread.join(timeout=10.0)
            if kind == "error":
                raise value
            raise StopIteration
        self._on_window(state)
        value[0] = replace(value[0], plan_wait_s=waited)  # the window's first share waited
        self._pending.extend(value)
        return self._pending.popleft()

    def fresh_for(self, sampler) -> bool:
        """Whether ``sampler`` is still where it was when this pass copied it (nothing taken yet)."""
        if self._base is None:  # a sampler that cannot be copied: the pass reads it itself
            return True
        now = vars(sampler)
        return now.keys() == self._base.keys() and all(now[k] is v for k, v in self._base.items())

    def close(self) -> None:
        """Stop planning this pass (its thread ends at its next window or queue wait)."""
        self._done = True
        self._stop.set()


def detached(sampler):
    """A copy of upstream's batch sampler for a pass to read ahead: ``(copy, carry, state, base)``.
    ``state()`` gives the attributes the copy's iteration rebound so far (Megatron's
    ``consumed_samples``, ``epoch``), ``carry(state)`` sets them on ``sampler``, ``base`` is
    ``sampler``'s attributes as copied. A sampler that cannot be copied is read itself."""
    try:
        source = copy.copy(sampler)
        base = dict(vars(source))
    except TypeError:  # no __dict__, or not copyable
        return sampler, (lambda state: None), (lambda: {}), None

    def state() -> dict:
        return {k: v for k, v in vars(source).items() if base.get(k, _MISSING) is not v}

    def carry(changed: dict) -> None:
        vars(sampler).update(changed)

    return source, carry, state, base


_MISSING = object()
