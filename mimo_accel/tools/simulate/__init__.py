"""``mimo-accel simulate``: the planners at cluster scale, without processes.

One idea a module: :mod:`~.inputs` (the DP sizes swept, each module's DP rule, every sample's
cost), :mod:`~.sweep` (the sweep itself and its JSON), :mod:`~.memory` (whether it fits),
:mod:`~.console` and :mod:`~.charts` (its output), :mod:`~.layout` (``--layout``: the step a pipeline
layout runs under each planner), :mod:`~.command` (the command line).
"""

from mimo_accel.tools.simulate.charts import figure, write_png
from mimo_accel.tools.simulate.command import main
from mimo_accel.tools.simulate.console import render
from mimo_accel.tools.simulate.layout import LAYOUT_FORMAT, STEP_PLANS, parse_layout, simulate_layout
from mimo_accel.tools.simulate.inputs import audio_dp_for, dp_for, language_dp_for, parse_dp_list, sample_costs
from mimo_accel.tools.simulate.memory import TooLarge, available_memory, check_memory
from mimo_accel.tools.simulate.sweep import MODULE_PLANNERS, PLANNERS, SIMULATE_FORMAT, simulate
from mimo_accel.tools.simulate.window import WINDOW_PLANS

__all__ = ["LAYOUT_FORMAT", "SIMULATE_FORMAT", "STEP_PLANS", "PLANNERS", "MODULE_PLANNERS", "WINDOW_PLANS",
           "TooLarge", "audio_dp_for", "available_memory", "check_memory", "dp_for", "language_dp_for", "main",
           "figure", "parse_dp_list", "parse_layout", "render", "sample_costs", "simulate", "simulate_layout",
           "write_png"]
