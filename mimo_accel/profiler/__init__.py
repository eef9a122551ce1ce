"""Per-rank step recorder and module timer: one JSON line per training step.

The :class:`Recorder` and the file format (``recorder``), the clocks regions are timed with
(``clocks``), an ``nn.Module``'s forward and backward as regions (``timers``), and reading one step
line (``step_line``). The offline reader of a profile directory (:mod:`mimo_accel.profiler.run`)
is not imported here, so training never loads it.
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
