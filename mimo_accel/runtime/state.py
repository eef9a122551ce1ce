"""All of mimo_accel's state in a training process, in one object the patch engine owns.

``enable()`` has the patch table (:func:`mimo_accel.patching.registry.runtime_for`) make a
:class:`Runtime` with what each enabled feature keeps in it and hands it to every replacement it
installs; ``disable()`` closes and drops it, so nothing a feature learnt outlives its patches.
:meth:`Runtime.say_once` is how a feature that cannot act on its data says so once (a log warning,
``mimo_accel.status()["notes"]``, and the next step line with the profiler on).
"""

from __future__ import annotations

import collections
import logging
import threading
import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional

from mimo_accel.config import AccelConfig
from mimo_accel.notices import Notices
from mimo_accel.runtime.context import ShardContext, ShardLengths, StepRole, context_from_grids

if TYPE_CHECKING:
    from mimo_accel.costs import CostModel

logger = logging.getLogger("mimo_accel")


@dataclass
class Runtime:
    """What the installed replacements share while mimo_accel is enabled."""

    config: AccelConfig
    # upstream's step packs the language shard itself (main's sequence_pack), with mimo_accel's packer
    native_packing: bool = False
    # this rank's place in the data layout, worked out on first need from the layout the last
    # sampling-info lookup inside a loader scope recorded
    context: Optional[ShardContext] = None
    layout: Optional[tuple[Any, dict]] = None  # (Bridge's MIMO parallelism config, its grids) of that lookup
    # MimoModel -> its role: a model's role never changes, so it is worked out once
    roles: "weakref.WeakKeyDictionary[Any, Optional[StepRole]]" = field(default_factory=weakref.WeakKeyDictionary)
    # the role of the model upstream's step last asked _get_module_dp_info about: the slice and the
    # packer that follow in the same step read it (upstream hands them plain values)
    step_role: Optional[StepRole] = None
    # how the real lengths of the shard the slice just returned are known:
    # upstream main's step drops input_ids (off the first language stage) and loss_mask (off the
    # last) before it packs, so under PP only the slice still holds both to work them out from
    step_lengths: Optional[ShardLengths] = None
    # the language shard upstream's scalable reads delivered this step (no slice runs there): the
    # step's role, learnt next, works out its lengths from it before the step drops those fields
    step_batch: Optional[dict] = None
    # BridgeCommunicator -> per-peer encoder rows of forwards still waiting for a backward
    fan_in_rows: "weakref.WeakKeyDictionary[Any, collections.deque[list[int]]]" = field(
        default_factory=weakref.WeakKeyDictionary)
    # the encoders Bridge's config freezes (forwards only: the step plan's pipeline), read at setup
    frozen: tuple = ()
    # the cost model plans start from (a configured file, else each module's FLOPs), read at setup
    start_model: Optional[CostModel] = None
    # the checkpoint this run resumes from and the run that saved it (runtime.resume.Resumed), read
    # at setup before Bridge loads it; None for a fresh run
    resumed: Any = None
    # what in the run config has Bridge's own reorder move samples after they are read (None: nothing)
    upstream_moves_samples: Optional[str] = None
    # what in the run config reorders upstream instead of mimo_accel (#4608), so mimo_accel's reorder
    # stepped aside (None: it did not). The config stays as enabled: read what acts through
    # reorders, calibrates_online and features()
    reorder_stepped_aside: Optional[str] = None
    # The measuring services (the layer above this one, so named here, not imported): the profiler's
    # measuring.profiling.Profiling while it (or online calibration) is on, the training run's
    # measuring.calibration.Calibration, and measuring.activity.Activity (rank 0's step line).
    profiling: Any = None
    calibration: Any = None
    activity: Any = None
    said: Notices = field(default_factory=lambda: Notices(logger))  # this run's notices, each said once
    lock: threading.RLock = field(default_factory=threading.RLock, repr=False)

    @property
    def reorders(self) -> bool:
        """Whether mimo_accel's reorder acts in this run: on in the config, and not stepped aside."""
        return self.config.reorder and self.reorder_stepped_aside is None

    @property
    def calibrates_online(self) -> bool:
        """Whether this run learns its cost model while training (the config's, while reorder acts)."""
        return self.config.calibrates_online and self.reorders

    def features(self) -> list[str]:
        """The features acting in this run: the config's, less a reorder that stepped aside."""
        return [name for name in self.config.features() if name != "reorder" or self.reorders]

    def say_once(self, key: str, message: str) -> bool:
        """Log ``message`` the first time ``key`` is seen while this runtime lives; True when logged."""
        return self.said.say_once(key, message)

    def shard_context(self) -> Optional[ShardContext]:
        """This rank's ShardContext (None before any lookup in a loader scope, or off every module)."""
        if self.context is None and self.layout is not None:
            layout, self.layout = self.layout, None
            self.context, _ = context_from_grids(*layout)
        return self.context

    def notices(self) -> dict[str, str]:
        return self.said.said()

    def close(self) -> None:
        """Release what the features hold (the profiler's file and timers); the runtime is dropped after."""
        profiling, self.profiling = self.profiling, None
        if profiling is not None:
            profiling.close()
        activity, self.activity = self.activity, None
        if activity is not None:
            activity.close()
        self.calibration = None
        with self.lock:
            self.fan_in_rows.clear()
            self.roles.clear()
            self.step_role = None
            self.step_lengths = None
            self.step_batch = None
            self.upstream_moves_samples = None
            self.reorder_stepped_aside = None
            self.frozen = ()
            self.start_model = None
            self.resumed = None
            self.context = None
            self.layout = None
        self.said.clear()


def notify_with(runtime: Optional[Runtime]):
    """``say_once`` of ``runtime``, or a plain once-only logger when there is none (pure callers
    used outside an enabled process, e.g. by the offline tools)."""
    return runtime.say_once if runtime is not None else Notices(logger).say_once
