"""The blocks a report is made of — tables (:class:`ReportTable`), whose cells the terminal (rich,
:mod:`~.console`) and the HTML page (:mod:`~.html`) render alike — and how a figure and a change
read in a cell."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mimo_accel.tools.report.like import NO_CHANGE, change_text


@dataclass
class ReportTable:
    title: str
    columns: list[tuple[str, bool]]  # (header, right-justified)
    rows: list[list[Any]] = field(default_factory=list)  # cells: str, or (str, style) — see CHANGE_STYLES


# a cell's style -> (rich style, HTML class)
CHANGE_STYLES = {"better": ("green", "better"), "worse": ("red", "worse"), "dim": ("dim", "dim"), "": ("", "")}
MISSING = "—"


def fmt(value: Any, kind: str) -> str:
    if value is None:
        return MISSING
    if kind == "s":
        return f"{value * 1e3:.2f} ms" if abs(value) < 1 else f"{value:.3f} s"
    if kind == "ratio":
        return f"{value:.3f}"
    if kind == "sci":
        return f"{value:.3g}"
    if kind == "rate":
        return f"{value:,.1f}"
    if kind == "pct":
        return f"{value:.1%}"
    if kind == "count":
        return f"{value:,.1f}" if value != int(value) else f"{int(value):,}"
    if kind == "bytes":
        for unit, div in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
            if abs(value) >= div:
                return f"{value / div:.2f} {unit}"
        return f"{value:.0f} B"
    return str(value)


def style_of(r: float, lower_is_better: bool) -> str:
    better = r < 1 - NO_CHANGE if lower_is_better else r > 1 + NO_CHANGE
    worse = r > 1 + NO_CHANGE if lower_is_better else r < 1 - NO_CHANGE
    return "better" if better else "worse" if worse else ""


def change_cell(r: float | None, lower_is_better: bool) -> tuple[str, str]:
    """A change's cell: ``×0.75 (-25%)``, green where better, red where worse."""
    if r is None:
        return MISSING, "dim"
    return change_text(r), style_of(r, lower_is_better)
