"""``mimo-accel calibrate-gpu``: each module's cost curve measured on one device, fitted into a cost-model file.

One idea a module: :mod:`~.points` (the designed inputs), :mod:`~.fit` (the curves),
:mod:`~.budget` (measuring within a time budget), :mod:`~.devices` (timers, attention, the
one-rank session), :mod:`~.models` (the modules built and timed), :mod:`~.results` (the points
file, the console table), :mod:`~.command` (the command line; its docstring tells the whole method).
"""

from mimo_accel_dev.commands.calibrate_gpu.budget import collect
from mimo_accel_dev.commands.calibrate_gpu.command import main
from mimo_accel_dev.commands.calibrate_gpu.fit import ModuleFit, fit_language, fit_vision, model_from_fits
from mimo_accel_dev.commands.calibrate_gpu.points import (LANGUAGE_CORE, POINTS_FORMAT, PROG, SIZES, VISION_CORE,
                                                   LanguagePoint, MeasureError, VisionPoint, language_points,
                                                   vision_points)

__all__ = ["LANGUAGE_CORE", "POINTS_FORMAT", "PROG", "SIZES", "VISION_CORE", "LanguagePoint", "MeasureError",
           "ModuleFit", "VisionPoint", "collect", "fit_language", "fit_vision", "language_points", "main",
           "model_from_fits", "vision_points"]
