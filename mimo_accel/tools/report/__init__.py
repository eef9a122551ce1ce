"""``mimo-accel report``: profiler runs side by side — rich tables, JSON/HTML export, PNG charts.

One idea a module: :mod:`~.summary` (a run's figures and their definitions), :mod:`~.work` (what
a run computed each step: the samples it trained, equal work), :mod:`~.throughput` (each module's
samples/s, tokens/s and TFLOP/s per GPU, MFU), :mod:`~.replayed` (the step replayed on a device per
rank, and who bounds it), :mod:`~.comparison` (before against after), :mod:`~.like` (like with like:
features, why runs are not comparable, each run's gain, the verdict), :mod:`~.blocks` and
:mod:`~.console` (the tables, on the terminal), :mod:`~.details` (the tables after the summary),
:mod:`~.sides` (upstream, a peer's reorder and mimo_accel side by side), :mod:`~.charts` (PNG),
:mod:`~.html` (one page), :mod:`~.command` (the document, its JSON, the command).
"""

from mimo_accel.tools.report.charts import write_png
from mimo_accel.tools.report.command import build, build_runs, main, write_json
from mimo_accel.tools.report.comparison import compare
from mimo_accel.tools.report.console import render, render_runs
from mimo_accel.tools.report.html import write_html
from mimo_accel.tools.report.summary import REPORT_FORMAT, STABLE_KEYS, summarize

__all__ = ["REPORT_FORMAT", "STABLE_KEYS", "build", "build_runs", "compare", "main", "render", "render_runs",
           "summarize", "write_html", "write_json", "write_png"]
