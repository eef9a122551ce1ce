"""Measuring within a time budget: points in order, each started only if it is predicted to fit."""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Optional

from mimo_accel_dev.commands.calibrate_gpu.fit import ModuleFit
from mimo_accel_dev.commands.calibrate_gpu.points import MeasureError

_MARGIN = 1.25  # a point is started only if 1.25 × its predicted time fits in what is left


# ---------------------------------------------------------------------------- collect (budget)


@dataclass
class Measured:
    """One point's timed repeats (seconds)."""

    point: Any
    times: list[float]

    @property
    def median(self) -> float:
        return float(statistics.median(self.times))


@dataclass
class Collection:
    module: str
    measured: list[Measured]
    planned: int
    stopped: Optional[str] = None  # why points were left out (the budget), else None
    skipped: list[str] = dataclasses.field(default_factory=list)  # points that failed (e.g. out of memory)


def collect(module: str, points: Sequence[Any], measure: Callable[[Any], list[float]], *, deadline: float,
            core: int, iterations: int, fit: Callable[[list, list], ModuleFit],
            clock: Callable[[], float] = time.monotonic,
            on_point: Optional[Callable[[int, Measured], None]] = None,
            skip_errors: tuple[type[BaseException], ...] = ()) -> Collection:
    """Measure ``points`` in order: the first ``core`` always, each later one only if its predicted
    duration (``iterations`` × the fit so far, × a margin) fits before ``deadline`` on ``clock``.
    ``measure(point)`` returns the timed repeats of one point. A point whose measure raises one of
    ``skip_errors`` is left out and named (e.g. out of device memory)."""
    out = Collection(module, [], len(points))
    for i, point in enumerate(points):
        if i >= core:
            left = deadline - clock()
            need = _predicted(out, point, fit) * iterations * _MARGIN
            if left <= 0 or need > left:
                out.stopped = (f"the budget is spent: {module} measured {len(out.measured)} of {len(points)} points"
                               f" (the next, {point.label}, would take ~{need:.3g} s; {max(left, 0.0):.3g} s left)")
                break
        try:
            times = measure(point)
        except skip_errors as exc:
            out.skipped.append(f"{point.label}: {' '.join(str(exc).split())[:200]}")
            continue
        m = Measured(point, list(times))
        out.measured.append(m)
        if on_point is not None:
            on_point(i, m)
    return out


def _predicted(c: Collection, point: Any, fit: Callable[[list, list], ModuleFit]) -> float:
    """One iteration's predicted time at ``point``: the fit of what is measured, else the
    slowest point so far scaled by its size."""
    pts, ys = [m.point for m in c.measured], [m.median for m in c.measured]
    try:
        return fit(pts, ys).predict(point.features())
    except MeasureError:
        if not ys:
            return 0.0
        return max(y * point.features()[0] / max(p.features()[0], 1.0) for p, y in zip(pts, ys))
