"""The report as blocks (tables, messages, lines) and their rendering on the terminal with rich.

A report holds one run or several, in the order given (:data:`~.like.Side`: what the report calls
a run, and its summary): one run's figures; two runs as before and after, with the change; more as
A, B, C, ... with each run's gain over the one before it and over the first (:mod:`~.like`). Every
table fits 80 columns, the width of a batch job's log.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from mimo_accel.tools.report.blocks import CHANGE_STYLES, MISSING, ReportTable, change_cell, fmt, style_of
from mimo_accel.tools.report.comparison import lookup, module_rows, timed_modules
from mimo_accel.tools.report.details import detail_tables
from mimo_accel.tools.report.like import (Side, attributions, delta_text, features_text, gain_keys, gains, names, ratio,
                                          verdict, warnings)


def sides_of(*summaries: dict[str, Any] | None) -> list[Side]:
    """The runs of a report (the summaries given, Nones left out), each with its name (:func:`~.like.names`)."""
    given = [s for s in summaries if s is not None]
    return list(zip(names(len(given)), given))


def doc_sides(doc: dict[str, Any]) -> list[Side]:
    """The runs of a report document (:func:`~.command.build`)."""
    return sides_of(*(doc.get("runs") or (doc["before"], doc.get("after"))))


def runs_table(sides: list[Side]) -> ReportTable:
    """One row a run: its label, the features its header records, its steps and ranks."""
    t = ReportTable("Runs", [("", False), ("label", False), ("features", False), ("steps", True), ("ranks", True)])
    for name, s in sides:
        skipped = len(s.get("warmup_skipped") or ())
        t.rows.append([name, str(s.get("label", "")), features_text(s),
                       f"{s.get('steps_counted', 0)}" + (f" +{skipped} warm-up" if skipped else ""),
                       f"{len(s.get('ranks_present', []))}/{s.get('world_size') or '?'}"])
    return t


def run_lines(sides: list[Side]) -> list[str]:
    """Where each run comes from: its directory, device and clock, its run id."""
    lines = []
    for name, s in sides:
        clock = s.get("clock") or {}
        clock = clock.get("regions", "?") if isinstance(clock, dict) else clock
        run = f", run {s['run_id']}" if s.get("run_id") else ""
        lines.append(f"{name}: {s.get('directory', '')} ({s.get('device') or '?'}, {clock} clock{run})")
    return lines


def report_messages(sides: list[Side], said: list[str] | None = None) -> list[tuple[str, str]]:
    """``(kind, text)``: the warnings (kind ``warning``: ``said``, a report document's, else the
    runs' own and their comparison's, :func:`~.like.warnings`) and the notes the features gave
    (``note``)."""
    several = len(sides) > 1
    out = [("warning", w) for w in (warnings(sides) if said is None else said)]
    for name, s in sides:
        for note in s.get("notes", []):
            out.append(("note", f"note ({name}): {note}" if several else f"note: {note}"))
    skipped: dict[str, list[str]] = {}  # why a replay was skipped: one line each, naming the runs
    for name, s in sides:
        if (why := s.get("step_time_replayed_skipped")):
            skipped.setdefault(why, []).append(name)
    out += [("note", f"note ({', '.join(ns)}): {why}" if several else f"note: {why}") for why, ns in skipped.items()]
    return out


def summary_table(sides: list[Side]) -> ReportTable:
    """Every headline figure a run has, a column a run; with two runs, the change after/before. A
    figure no run has is left out; the machine's floor (``--floor``) is marked as the floor."""
    summaries = [s for _, s in sides]
    two = len(sides) == 2
    columns = [("metric", False), *((n, True) for n, _ in sides)]
    if two:
        columns.append((f"{sides[1][0]}/{sides[0][0]}", True))
    t = ReportTable("Summary", columns)
    for key, label, kind, lower in module_rows(*summaries):
        values = [lookup(s, key) for s in summaries]
        if all(v is None for v in values):
            continue
        if key.endswith(".floor"):  # one equal-work run's figure beside every run: not theirs, not a change
            t.rows.append([label, *((fmt(v, kind), "dim") for v in values), *((("the floor", "dim"),) if two else ())])
            continue
        row: list[Any] = [label, *(fmt(v, kind) for v in values)]
        if two:
            row.append(change_cell(ratio(*values), lower))
        t.rows.append(row)
    return t


def gains_table(sides: list[Side]) -> ReportTable | None:
    """Of three runs or more: each run's gain over the one before it (and over the first), a column
    a run headed by what it adds (``B +reorder``); None for fewer runs."""
    if len(sides) < 3:
        return None
    found = gains(sides)
    t = ReportTable("Gain of each run over the one before it (over the first)",
                    [("figure", False), *((f"{g['run']} {g['adds']}", True) for g in found)])
    for key, label, lower in gain_keys(sides):
        cells = [(g["over_previous"][key], g["over_first"][key]) for g in found]
        if all(p is None for p, _ in cells):
            continue
        t.rows.append([label, *((MISSING, "dim") if p is None else
                                (f"×{p:.2f} (×{f:.2f})" if f is not None else f"×{p:.2f}", style_of(p, lower))
                                for p, f in cells)])
    return t


def gain_lines(sides: list[Side]) -> list[str]:
    """What each feature added alone gained (runs of three or more), or, of two runs, what the later
    one adds."""
    if len(sides) == 2:
        return [f"{sides[1][0]} against {sides[0][0]}: {delta_text(sides[0][1], sides[1][1])}"]
    return [f"by feature: {line}" for line in attributions(sides, gains(sides))] if len(sides) > 2 else []


def _slowest(st: dict[str, Any], module: str) -> str:
    """``st``: one module's ``per_module`` entry."""
    slow = st.get("slowest")
    if not slow:
        return "none (one replica)" if st.get("replicas", 0) == 1 else "none (tied, or not timed)"
    ranks = slow["ranks"]
    who = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {','.join(map(str, ranks))}"
    return f"DP replica {slow['dp_rank']} ({who}) in {slow['fraction']:.0%} of {slow['steps']} steps"


def slowest_lines(sides: list[Side]) -> list[str]:
    """Each module's slowest replica in each run, one line a module."""
    lines = []
    for m in timed_modules(*(s for _, s in sides)):
        said = [(n, _slowest(st, m)) for n, s in sides if (st := ((s.get("per_module") or {}).get(m)))]
        if said:
            text = said[0][1] if len(sides) == 1 else "; ".join(f"{n} {w}" for n, w in said)
            lines.append(f"slowest {m}: {text}")
    return lines


# A module whose ranks wait more than this share of the replayed step: the report points to a layout.
WAIT_FOR_A_LAYOUT = 1 / 3


def bound_table(sides: list[Side]) -> ReportTable | None:
    """Each module's busy share of the replayed step (mean over its devices, and its busiest
    device's) and wait share, a column a run, and the module that bounds the step; None where no
    run has a replay."""
    if all(s.get("bound_module") is None for _, s in sides):
        return None
    t = ReportTable("Who bounds the step (replayed; p50 over the steps)",
                    [("module share", False), *((n, True) for n, _ in sides)])
    for m in timed_modules(*(s for _, s in sides)):
        for key, what in (("busy_share_p50", "busy"), ("busy_share_max_p50", "busiest rank busy"),
                          ("wait_share_p50", "wait")):
            t.rows.append([f"{m} {what}", *(fmt(lookup(s, f"per_module.{m}.{key}"), "pct") for _, s in sides)])
    t.rows.append(["bounds the step", *(str(s.get("bound_module") or MISSING) for _, s in sides)])
    return t


def bound_line(sides: list[Side]) -> str | None:
    """Where a module's ranks wait more than a third of the replayed step (the last run): which
    module bounds the step, how long the modules wait, and the command that proposes the layout to
    run next; else None."""
    name, s = sides[-1]
    bound, per = s.get("bound_module"), s.get("per_module") or {}
    waits = {m: w for m in s.get("module_order", []) if (w := (per.get(m) or {}).get("wait_share_p50")) is not None}
    over = {m: w for m, w in waits.items() if w > WAIT_FOR_A_LAYOUT}
    if bound is None or not over:
        return None
    waiting = ", ".join(f"the {m} ranks {fmt(w, 'pct')}" for m, w in over.items())
    busy = (per.get(bound) or {}).get("busy_share_max_p50")
    return (f"{name + ': ' if len(sides) > 1 else ''}{bound} bounds the step (its busiest rank is busy "
            f"{fmt(busy, 'pct')} of the replayed step, {fmt(s.get('step_time_replayed_p50'), 's')} p50); "
            f"waiting more than a third of it: {waiting}. The layout to run next: "
            f"mimo-accel layout --from {s.get('directory') or 'RUN_DIR'}")


def _rich_table(t: ReportTable) -> Table:
    table = Table(title=t.title, header_style="bold")
    for header, right in t.columns:  # fold, never cut: a narrow log keeps every word
        table.add_column(header, justify="right" if right else "left", overflow="fold")
    for row in t.rows:
        table.add_row(*(Text(c[0], style=CHANGE_STYLES[c[1]][0]) if isinstance(c, tuple) else c for c in row))
    return table


def render_runs(summaries: list[dict[str, Any]], console: Console | None = None, *,
                said: list[str] | None = None) -> None:
    """Print the report of one run's summary or of several (:func:`~.summary.summarize`), in order
    (``said``: the warnings of their report document, where there is one)."""
    console = console or Console()
    sides = sides_of(*summaries)
    console.rule("[bold]mimo-accel profile report")
    console.print(_rich_table(runs_table(sides)))
    for line in run_lines(sides):
        console.print(Text(line, style="dim"))
    if (line := verdict(sides)) is not None:
        console.print(Text(f"verdict: {line}", style="bold"))
    for kind, text in report_messages(sides, said):
        console.print(Text(f"⚠ {text}", style="yellow") if kind == "warning" else Text(text, style="cyan"))
    console.print(_rich_table(summary_table(sides)))
    if (gained := gains_table(sides)) is not None:
        console.print(_rich_table(gained))
    for line in gain_lines(sides) + slowest_lines(sides):
        console.print(line)
    if (bound := bound_table(sides)) is not None:
        console.print(_rich_table(bound))
    if (line := bound_line(sides)) is not None:
        console.print(Text(line, style="bold yellow"))
    for t in detail_tables(sides):
        console.print(_rich_table(t))


def render(before: dict[str, Any], after: dict[str, Any] | None = None, console: Console | None = None) -> None:
    """Print the report of one summary, or of a before/after pair with a change column."""
    render_runs([s for s in (before, after) if s is not None], console)
