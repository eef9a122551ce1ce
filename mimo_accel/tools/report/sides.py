"""Upstream as shipped, a peer's reorder and mimo_accel side by side (``mimo-accel rehearse --peer``).

Each side is a run's summary (:func:`~.summary.summarize`); the peer's carries its ``name`` (what
the table calls it: "#4608's reorder_buffer (ce55b79f)", "#4608 at 984a8a53").
"""

from __future__ import annotations

from typing import Any, Optional

from mimo_accel.modules import LANGUAGE
from mimo_accel.tools.report.comparison import lookup

_MISSING = "—"


def table(before: dict[str, Any], peer: dict[str, Any], after: dict[str, Any]):
    """The three runs' straggler p50 (whole run and last half) for every module, the language
    real tokens per replica and the step time: a rich Table."""
    from rich.table import Table

    runs = (before, peer, after)
    t = Table(title=f"Upstream as shipped, {peer['name']} and mimo_accel, the same samples")
    for col in ("", "upstream as shipped", peer["name"], "mimo_accel"):
        t.add_column(col, justify="left" if not col else "right")

    def row(label: str, key: str, form: str = "{:.3f}") -> None:
        values = [lookup(s, key) for s in runs]
        t.add_row(label, *(_MISSING if v is None else form.format(v) for v in values))

    for m in (m for m in after.get("module_order", []) if m in after.get("per_module", {})):
        row(f"{m} straggler p50", f"per_module.{m}.max_over_mean_p50")
        row(f"{m} straggler p50, last half", f"per_module.{m}.max_over_mean_p50_last_half")
    row("language real tokens per replica, max/mean p50", "language_tokens_max_over_mean_p50")
    row("step time p50", "step_time_p50", "{:.2f} s")
    return t


def language_verdict(peer: dict[str, Any], after: dict[str, Any]) -> tuple[Optional[bool], str]:
    """Whether the peer leaves the language model worse than mimo_accel's plan (its language
    straggler p50 above mimo_accel's; None where a side has none), and the line that says so."""
    key = f"per_module.{LANGUAGE}.max_over_mean_p50"
    p, a = lookup(peer, key), lookup(after, key)
    if p is None or a is None:
        return None, f"{peer['name']} against mimo_accel: no language straggler measured on both sides"
    worse = p > a
    return worse, (f"{peer['name']} {'leaves' if worse else 'does not leave'} the language model worse than "
                   f"mimo_accel's plan: language straggler p50 {p:.3f} against {a:.3f}")
