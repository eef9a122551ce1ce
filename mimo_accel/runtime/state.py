"""All of mimo_accel's state in a training process, in one object the patch engine owns.

``enable()`` makes a :class:`Runtime` and hands it to every replacement it installs (a factory
takes the original function and the runtime); ``disable()`` closes it and drops it, so nothing a
feature learned or recorded outlives the patches that learned it. No runtime module keeps
mutable state of its own. Two process-lifetime counters stay outside on purpose: the untested-
version warning (once per process) and the rendezvous-store rounds of
:mod:`mimo_accel.runtime.plan_inputs` (the job's store outlives any enable/disable).

No silent no-op: :meth:`Runtime.say_once` is how a feature that cannot act on the data it got
says so once per process (a log warning; ``mimo_accel.status()["notes"]`` lists the same lines,
and with the profiler on each is written into the next step line, which ``mimo-accel report``
shows).
"""

from __future__ import annotations

import logging
import threading
import weakref
from dataclasses import dataclass, field
from typing import Any, Optional

from mimo_accel.config import AccelConfig

logger = logging.getLogger("mimo_accel")


@dataclass
class Runtime:
    """What the installed replacements share while mimo_accel is enabled."""

    config: AccelConfig
    shape: Any = None  # the patching.targets.Shape being patched (None while disabled)
    # this rank's place in the data layout (runtime.shard.ShardContext), worked out on first need
    # from the layout the last sampling-info lookup inside a loader scope recorded
    context: Any = None
    layout: Any = None  # (parallelism config, grids) of that lookup
    # model -> runtime.step.StepRole: a model's role never changes, so it is worked out once
    roles: "weakref.WeakKeyDictionary" = field(default_factory=weakref.WeakKeyDictionary)
    # the role of the one MimoModel this rank hosts, for the packer under upstream's scalable reads
    # (no slice runs there to carry it)
    rank_role: Any = None
    # BridgeCommunicator -> deque of per-peer encoder rows of forwards still waiting for a backward
    fan_in_rows: "weakref.WeakKeyDictionary" = field(default_factory=weakref.WeakKeyDictionary)
    profiling: Any = None  # runtime.profiling.Profiling when the profiler (or online calibration) is on
    calibration: Any = None  # runtime.calibration.Calibration of the training run under way
    said: dict = field(default_factory=dict)  # notice key -> message, in the order said
    lock: Any = field(default_factory=threading.RLock, repr=False)

    def say_once(self, key: str, message: str) -> bool:
        """Log ``message`` the first time ``key`` is seen while this runtime lives; True when logged."""
        with self.lock:
            if key in self.said:
                return False
            self.said[key] = message
        logger.warning(message)
        return True

    def shard_context(self):
        """This rank's ShardContext (None before any lookup in a loader scope, or off every module)."""
        if self.context is None and self.layout is not None:
            from mimo_accel.runtime.shard import context_from_grids

            layout, self.layout = self.layout, None
            self.context, _ = context_from_grids(*layout)
        return self.context

    def notices(self) -> dict:
        with self.lock:
            return dict(self.said)

    def close(self) -> None:
        """Release what the features hold (the profiler's file and timers); the runtime is dropped after."""
        profiling, self.profiling = self.profiling, None
        if profiling is not None:
            profiling.close()
        self.calibration = None
        with self.lock:
            self.fan_in_rows.clear()
            self.roles.clear()
            self.rank_role = None
            self.context = None
            self.layout = None
            self.said.clear()


def notify_with(runtime: Optional[Runtime]):
    """``say_once`` of ``runtime``, or a plain once-only logger when there is none (pure callers
    used outside an enabled process, e.g. by the offline tools)."""
    if runtime is not None:
        return runtime.say_once
    said: set = set()

    def say_once(key: str, message: str) -> bool:
        if key in said:
            return False
        said.add(key)
        logger.warning(message)
        return True

    return say_once
