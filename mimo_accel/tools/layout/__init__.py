"""``mimo-accel layout``: what a MegatronMIMO job will do, and the layout to run next within a GPU
budget, priced with mimo_accel's step model.

One idea a module: :mod:`~.spec` (a layout as text, and its PP split), :mod:`~.machine` (the GPUs
and their interconnect), :mod:`~.models` (a model's FLOPs, parameters and stored bytes: presets,
model files), :mod:`~.memory` (each module's memory per GPU as the job is configured),
:mod:`~.profiled` (what a profiled run tells), :mod:`~.seconds` (what a sample costs each module
at a layout's TP and PP, each stage's share, and the communication terms), :mod:`~.draws` (the
steps priced, and the heaviest the data can form), :mod:`~.pricing` (the one path that prices a
layout's step), :mod:`~.search` (the layouts that fit, priced best first), :mod:`~.problem`
(what a user asks, and everything a layout is priced against), :mod:`~.change` (whether a job
should move from its layout, and what the gain is made of), :mod:`~.advice` (``advise``,
``price``, the ranked rows, the recommendation, the settings), :mod:`~.console` and
:mod:`~.command` (the command).
"""

from mimo_accel.tools.layout.advice import (ADVICE_FORMAT, Advice, Figures, NoLayoutFits, Objective, Row, Search,
                                            advise, price, settings)
from mimo_accel.tools.layout.command import main
from mimo_accel.tools.layout.problem import DataRequest, MachineRequest, Problem, Request, build

__all__ = ["ADVICE_FORMAT", "Advice", "DataRequest", "Figures", "MachineRequest", "NoLayoutFits", "Objective",
           "Problem", "Request", "Row", "Search", "advise", "build", "main", "price", "settings"]
