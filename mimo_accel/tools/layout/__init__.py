"""``mimo-accel layout``: the layout to run next, within a GPU budget, priced with mimo_accel's step model.

One idea a module: :mod:`~.spec` (a layout as text), :mod:`~.machine` (the GPUs and their
interconnect), :mod:`~.models` (a model's FLOPs and parameters: presets, model files),
:mod:`~.profiled` (what a profiled run tells), :mod:`~.seconds` (what a sample costs each module at
a layout's TP and PP, and the communication terms), :mod:`~.draws` (the steps priced),
:mod:`~.pricing` (the one path that prices a layout's step, ``simulate --layout``'s too),
:mod:`~.footprint` (each module's memory per GPU), :mod:`~.search` (the layouts that fit, priced
best first), :mod:`~.problem` (everything a search prices against), :mod:`~.advice` (``advise``,
``price``, the ranked rows, the settings), :mod:`~.console` and :mod:`~.command` (the command).
"""

from mimo_accel.tools.layout.advice import ADVICE_FORMAT, Advice, Figures, NoLayoutFits, Row, advise, price, settings
from mimo_accel.tools.layout.command import main
from mimo_accel.tools.layout.problem import Problem, build_problem

__all__ = ["ADVICE_FORMAT", "Advice", "Figures", "NoLayoutFits", "Problem", "Row", "advise", "build_problem", "main",
           "price", "settings"]
