"""Per-rank step recorder, module timer and offline reader: one JSON line per training step.

* :mod:`~mimo_accel.profiler.recorder`: :class:`Recorder` (region timers, counters, the clocks),
  the file format (``FORMAT``; ``COUNTERS`` and the per-encoder ``<module>_items|rows|sq_rows``;
  regions ``<module>_fwd`` / ``<module>_bwd``, :func:`module_regions`) and :func:`rank_file`.
* :mod:`~mimo_accel.profiler.clocks`: the clocks regions are timed with (CUDA events, thread or
  process CPU time, wall).
* :mod:`~mimo_accel.profiler.timers`: :class:`ModuleTimer` / :func:`attach_module_timer`, an
  ``nn.Module``'s forward and backward as regions.
* :mod:`~mimo_accel.profiler.run`: :func:`read_run`, the offline reader of a profile directory
  (formats 1 and 2), and :func:`module_seconds`, a module's forward + backward in a step line.
"""

from __future__ import annotations

from mimo_accel.profiler.recorder import (
    COUNTERS,
    FORMAT,
    FORMAT_V1,
    MODULE_COUNTERS,
    MODULE_REGIONS,
    REGIONS,
    SETTABLE,
    Recorder,
    is_counter,
    json_safe,
    module_counters,
    module_regions,
    rank_file,
)
from mimo_accel.profiler.run import (
    NoProfileData,
    ProfileError,
    RankLog,
    Run,
    module_seconds,
    read_run,
    record_number,
)
from mimo_accel.profiler.timers import ModuleTimer, attach_module_timer

__all__ = [
    "COUNTERS",
    "FORMAT",
    "FORMAT_V1",
    "MODULE_COUNTERS",
    "MODULE_REGIONS",
    "REGIONS",
    "ModuleTimer",
    "NoProfileData",
    "ProfileError",
    "RankLog",
    "Recorder",
    "Run",
    "attach_module_timer",
    "is_counter",
    "module_counters",
    "module_regions",
    "module_seconds",
    "rank_file",
    "read_run",
]
