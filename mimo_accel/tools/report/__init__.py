"""``mimo-accel report``: before/after report of profiler runs — rich tables, JSON/HTML export, PNG charts.

One idea a module: :mod:`~.summary` (a run's figures and their definitions), :mod:`~.throughput`
(each module's samples/s, tokens/s and TFLOP/s per GPU, MFU), :mod:`~.replayed` (the step
replayed on a device per rank, and who bounds it), :mod:`~.comparison`
(before against after), :mod:`~.console` (the tables, on the terminal), :mod:`~.sides` (upstream, a
peer's reorder and mimo_accel side by side), :mod:`~.charts` (PNG),
:mod:`~.html` (one page), :mod:`~.command` (the document, its JSON, the command).
"""

from mimo_accel.tools.report.charts import write_png
from mimo_accel.tools.report.command import build, main, write_json
from mimo_accel.tools.report.comparison import compare
from mimo_accel.tools.report.console import render
from mimo_accel.tools.report.html import write_html
from mimo_accel.tools.report.summary import REPORT_FORMAT, STABLE_KEYS, summarize

__all__ = ["REPORT_FORMAT", "STABLE_KEYS", "build", "compare", "main", "render", "summarize", "write_html",
           "write_json", "write_png"]
