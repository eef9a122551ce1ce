"""Per-rank step recorder, module timer and offline reader: one JSON line per training step.

* :mod:`~mimo_accel.profiler.recorder`: :class:`Recorder` (region timers, counters, the clocks),
  the file format (``FORMAT``, ``COUNTERS``, ``REGIONS``) and :func:`rank_file`.
* :mod:`~mimo_accel.profiler.timers`: :class:`ModuleTimer` / :func:`attach_module_timer`, an
  ``nn.Module``'s forward and backward as regions.
* :mod:`~mimo_accel.profiler.run`: :func:`read_run`, the offline reader of a profile directory.
"""

from __future__ import annotations

from mimo_accel.profiler.recorder import COUNTERS, FORMAT, REGIONS, SETTABLE, Recorder, json_safe, rank_file
from mimo_accel.profiler.run import NoProfileData, ProfileError, RankLog, Run, read_run, record_number
from mimo_accel.profiler.timers import ModuleTimer, attach_module_timer

__all__ = [
    "COUNTERS",
    "FORMAT",
    "REGIONS",
    "ModuleTimer",
    "NoProfileData",
    "ProfileError",
    "RankLog",
    "Recorder",
    "Run",
    "attach_module_timer",
    "rank_file",
    "read_run",
]
