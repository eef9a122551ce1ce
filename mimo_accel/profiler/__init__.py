"""Per-rank step recorder and module timer: one JSON line per training step.

* :mod:`~mimo_accel.profiler.recorder`: :class:`Recorder` (region timers, counters), the file
  format (``FORMAT``; ``COUNTERS`` and the per-encoder ``<module>_items|rows|sq_rows``; regions
  ``<module>_fwd`` / ``<module>_bwd``, :func:`module_regions`) and :func:`rank_file`.
* :mod:`~mimo_accel.profiler.clocks`: the clocks regions are timed with (CUDA events, thread or
  process CPU time, wall).
* :mod:`~mimo_accel.profiler.timers`: :class:`ModuleTimer` / :func:`attach_module_timer`, an
  ``nn.Module``'s forward and backward as regions.
* :mod:`~mimo_accel.profiler.step_line`: :func:`record_number`, :func:`module_seconds` (a
  module's forward + backward in a step line).

The offline reader of a profile directory, :func:`~mimo_accel.profiler.run.read_run`, is
:mod:`mimo_accel.profiler.run`: not imported here, so training never loads it.
"""

from __future__ import annotations

from mimo_accel.profiler.recorder import (
    COUNTERS,
    FORMAT,
    FORMAT_V1,
    MODULE_COUNTERS,
    MODULE_REGIONS,
    UNNAMED_REGIONS,
    SETTABLE,
    Recorder,
    is_counter,
    json_safe,
    module_counters,
    module_regions,
    rank_file,
)
from mimo_accel.profiler.step_line import module_seconds, record_number
from mimo_accel.profiler.timers import ModuleTimer, attach_module_timer

__all__ = [
    "COUNTERS",
    "FORMAT",
    "FORMAT_V1",
    "MODULE_COUNTERS",
    "MODULE_REGIONS",
    "UNNAMED_REGIONS",
    "SETTABLE",
    "ModuleTimer",
    "Recorder",
    "attach_module_timer",
    "is_counter",
    "json_safe",
    "module_counters",
    "module_regions",
    "module_seconds",
    "record_number",
    "rank_file",
]
