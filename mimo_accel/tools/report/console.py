"""The report as blocks (tables, messages, lines) and their rendering on the terminal with rich."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from mimo_accel.modules import LANGUAGE
from mimo_accel.tools.report.comparison import compare, lookup, module_rows, timed_modules


# ------------------------------------------------------------------------------------- render
# The report is one list of blocks — tables (:class:`ReportTable`), messages, lines — that the terminal
# (rich, :func:`render`) and the HTML page (:func:`write_html`) render alike.


@dataclass
class ReportTable:
    title: str
    columns: list[tuple[str, bool]]  # (header, right-justified)
    rows: list[list[Any]] = field(default_factory=list)  # cells: str, or (str, style) — see CHANGE_STYLES


# a cell's style -> (rich style, HTML class)
CHANGE_STYLES = {"better": ("green", "better"), "worse": ("red", "worse"), "dim": ("dim", "dim"), "": ("", "")}


def _fmt(value: Any, kind: str) -> str:
    if value is None:
        return "—"
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


def _change_cell(ratio: float | None, lower_is_better: bool) -> tuple[str, str]:
    if ratio is None:
        return "—", "dim"
    pct = (ratio - 1.0) * 100
    better = ratio < 0.98 if lower_is_better else ratio > 1.02
    worse = ratio > 1.02 if lower_is_better else ratio < 0.98
    return f"×{ratio:.2f} ({pct:+.0f}%)", "better" if better else "worse" if worse else ""


def _slowest_line(s: dict[str, Any], module: str) -> str:
    """``s``: one module's ``per_module`` entry."""
    slow = s.get("slowest")
    if not slow:
        if s.get("replicas", 0) == 1:
            return f"one {module} replica: no straggler to name"
        return f"no slowest {module} replica (no {module} timing, or all replicas tied)"
    ranks = slow["ranks"]
    who = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {','.join(map(str, ranks))}"
    return f"{module} DP replica {slow['dp_rank']} ({who}) slowest in {slow['fraction']:.0%} of {slow['steps']} steps"


def runs_table(before: dict[str, Any], after: dict[str, Any] | None) -> ReportTable:
    t = ReportTable("Runs", [("", False), ("label", False), ("directory", False), ("ranks", False), ("steps", False),
                        ("device / clock", False)])
    for name, s in (("before", before), ("after", after)) if after is not None else (("run", before),):
        assert s is not None
        clock = s.get("clock") or {}
        present = len(s.get("ranks_present", []))
        t.rows.append([
            name,
            str(s.get("label", "")),
            str(s.get("directory", "")),
            f"{present}/{s.get('world_size') or '?'} "
            + " ".join(f"{m}:{len(r)}" for m, r in s.get("modules", {}).items()),
            f"{s.get('steps_counted', 0)}"
            + (f" (skipped {len(s['warmup_skipped'])} warm-up)" if s.get("warmup_skipped") else ""),
            f"{s.get('device') or '?'} / {clock.get('regions', '?') if isinstance(clock, dict) else clock}",
        ])
    return t


def report_messages(before: dict[str, Any], after: dict[str, Any] | None) -> list[tuple[str, str]]:
    """``(kind, text)``: the warnings (kind ``warning``) and the notes the features gave (``note``)."""
    two = after is not None
    warnings = [*(f"before: {w}" if two else w for w in before.get("warnings", []))]
    if after is not None:
        warnings += [f"after: {w}" for w in after.get("warnings", [])]
        warnings += compare(before, after)["warnings"]
    out = [("warning", w) for w in warnings]
    for side, s in (("before", before), ("after", after)):
        for note in (s or {}).get("notes", []):
            out.append(("note", f"note ({side}): {note}" if two else f"note: {note}"))
    skipped: dict[str, list[str]] = {}  # why a replay was skipped: one line each, naming the sides
    for side, s in (("before", before), ("after", after)):
        if (why := (s or {}).get("step_time_replayed_skipped")):
            skipped.setdefault(why, []).append(side)
    out += [("note", f"note ({', '.join(sides)}): {why}" if two else f"note: {why}") for why, sides in skipped.items()]
    return out


def summary_table(before: dict[str, Any], after: dict[str, Any] | None) -> ReportTable:
    two = after is not None
    change = compare(before, after)["change"] if after is not None else {}
    columns = [("metric", False), ("before" if two else "value", True)]
    if two:
        columns += [("after", True), ("after/before", True)]
    t = ReportTable("Summary", columns)
    for key, label, kind, lower in module_rows(before, after):
        b = lookup(before, key)
        row: list[Any] = [label, _fmt(b, kind)]
        if after is not None:
            a = lookup(after, key)
            ratio = change.get(key)
            if ratio is None and isinstance(a, (int, float)) and isinstance(b, (int, float)) and b:
                ratio = a / b
            row += [_fmt(a, kind), _change_cell(ratio, lower)]
        t.rows.append(row)
    return t


def _module_figures(s: dict[str, Any] | None, module: str) -> dict[str, Any] | None:
    """A side's table of ``module``: its ``per_module`` entry."""
    return ((s or {}).get("per_module") or {}).get(module)


def slowest_lines(before: dict[str, Any], after: dict[str, Any] | None) -> list[str]:
    two = after is not None
    lines = []
    for m in timed_modules(before, after):
        for side, s in (("before", before), ("after", after)) if two else (("", before),):
            st = _module_figures(s, m)
            if st:
                lines.append(f"slowest {m}{' ' + side if side else ''}: {_slowest_line(st, m)}")
    return lines


# A module whose ranks wait more than this share of the replayed step: the report points to a layout.
WAIT_FOR_A_LAYOUT = 1 / 3


def _sides(before: dict[str, Any], after: dict[str, Any] | None) -> list[dict[str, Any]]:
    return [before] if after is None else [before, after]


def _arrow(values: list[Any], kind: str) -> str:
    return " → ".join(_fmt(v, kind) for v in values)


def bound_table(before: dict[str, Any], after: dict[str, Any] | None) -> ReportTable | None:
    """Each module's busy share of the replayed step (mean over its devices, and its busiest
    device's) and wait share, before → after, and the module that bounds the step; None where no
    side has a replay."""
    sides = _sides(before, after)
    if all(s.get("bound_module") is None for s in sides):
        return None
    t = ReportTable("Who bounds the step (replayed; p50 over the steps" + (", before → after)" if after else ")"),
                    [("module", False), ("busy share", True), ("busiest rank busy", True), ("wait share", True)])
    for m in timed_modules(before, after):
        t.rows.append([m, *(_arrow([lookup(s, f"per_module.{m}.{k}") for s in sides], "pct")
                            for k in ("busy_share_p50", "busy_share_max_p50", "wait_share_p50"))])
    t.rows.append(["bounds the step", " → ".join(str(s.get("bound_module") or "—") for s in sides), "", ""])
    return t


def bound_line(before: dict[str, Any], after: dict[str, Any] | None) -> str | None:
    """Where a module's ranks wait more than a third of the replayed step (the after side, or the
    only one): which module bounds the step, how long the modules wait, and the command that
    proposes the layout to run next; else None."""
    s = after if after is not None else before
    bound, per = s.get("bound_module"), s.get("per_module") or {}
    waits = {m: w for m in s.get("module_order", []) if (w := (per.get(m) or {}).get("wait_share_p50")) is not None}
    over = {m: w for m, w in waits.items() if w > WAIT_FOR_A_LAYOUT}
    if bound is None or not over:
        return None
    waiting = ", ".join(f"the {m} ranks {_fmt(w, 'pct')}" for m, w in over.items())
    busy = (per.get(bound) or {}).get("busy_share_max_p50")
    return (f"{'after: ' if after is not None else ''}{bound} bounds the step (its busiest rank is busy "
            f"{_fmt(busy, 'pct')} of the replayed step, {_fmt(s.get('step_time_replayed_p50'), 's')} p50); "
            f"waiting more than a third of it: {waiting}. The layout to run next: "
            f"mimo-accel layout --from {s.get('directory') or 'RUN_DIR'}")


def _per_rank_table(title: str, per_rank: list[dict[str, Any]], two: bool) -> ReportTable | None:
    before_pr, after_pr = per_rank[0], per_rank[1] if two else None
    ranks = sorted({int(r) for pr in (before_pr, after_pr) if pr for r in pr})
    if not ranks:
        return None
    sides = [("", before_pr)] if after_pr is None else [("before ", before_pr), ("after ", after_pr)]
    columns = [("rank", True), ("dp", True)]
    for prefix, _ in sides:
        columns += [(f"{prefix}{stat}", True) for stat in ("mean", "p50", "p99")]
    if after_pr is not None:
        columns.append(("mean after/before", True))
    t = ReportTable(title, columns)
    for rank in ranks:
        row: list[Any] = [str(rank)]
        dp = None
        means = []
        for _, s in sides:
            st = (s or {}).get(str(rank))
            if st:
                dp = st.get("dp_rank")
            means.append(st.get("mean") if st else None)
            row += [_fmt(st.get(k) if st else None, "s") for k in ("mean", "p50", "p99")]
        row.insert(1, "—" if dp is None else str(dp))
        if after_pr is not None:
            b, a = means
            row.append(_change_cell(a / b if a is not None and b else None, True))
        t.rows.append(row)
    return t


def _module_time_tables(before: dict[str, Any], after: dict[str, Any] | None) -> list[ReportTable]:
    two = after is not None
    tables = []
    for module in timed_modules(before, after):
        title = ("Language model time per rank (fwd + bwd per step)" if module == LANGUAGE
                 else f"{module.capitalize()} encoder time per rank (fwd + bwd per step)")
        per = [(_module_figures(s, module) or {}).get("per_rank", {}) for s in (before, after)]
        tables.append(_per_rank_table(title, per, two))
    return [t for t in tables if t is not None]


def _tokens_table(before: dict[str, Any], after: dict[str, Any] | None) -> ReportTable | None:
    sides = [("", before)] if after is None else [("before ", before), ("after ", after)]
    dps = sorted({int(d) for _, s in sides for d in (s or {}).get("language_tokens_per_replica", {})})
    if not dps:
        return None
    t = ReportTable("Language real tokens per replica per step, mean",
               [("dp", True), *((f"{prefix}tokens", True) for prefix, _ in sides)])
    for dp in dps:
        t.rows.append([str(dp), *(_fmt((s or {}).get("language_tokens_per_replica", {}).get(str(dp)), "count")
                                  for _, s in sides)])
    return t


def _io_table(before: dict[str, Any], after: dict[str, Any] | None) -> ReportTable | None:
    keys = (("samples_read_per_rank", "samples read", "count"), ("bytes_read_per_rank", "bytes read", "bytes"),
            ("bytes_exchanged_per_rank", "bytes exchanged", "bytes"))
    sides = [s for s in (before, after) if s]
    keys = tuple(k for k in keys if any(v for s in sides for v in s.get(k[0], {}).values()))
    if not keys:
        return None
    ranks = sorted({int(r) for s in sides for r in s.get("samples_read_per_rank", {})})
    modules = {int(r): m for s in sides for m, rs in s.get("modules", {}).items() for r in rs}
    columns = [("rank", True), ("module", False)]
    for _, label, _ in keys:
        columns += ([(label, True)] if after is None else [(f"{label} before", True), (f"{label} after", True)])
    t = ReportTable("Data movement per rank (mean per step)", columns)
    for rank in ranks:
        row = [str(rank), modules.get(rank, "?")]
        for key, _, kind in keys:
            for s in sides:
                row.append(_fmt(s.get(key, {}).get(str(rank)), kind))
        t.rows.append(row)
    return t


def _calibration_table(side: dict[str, Any] | None) -> ReportTable | None:
    """The refits an online calibration accepted (the accelerated side's)."""
    refits = ((side or {}).get("online_calibration") or {}).get("refits") or []
    if not refits:
        return None
    t = ReportTable("Online calibration: accepted refits (s per row / row² / item; per token / token² / sample)",
               [("step", True), ("module", False), ("a", True), ("b", True), ("k", True),
                ("held-out error", True), ("planned from", True)])
    for r in refits:
        c = r.get("coefficients") or {}
        t.rows.append([str(r.get("step")), str(r.get("module")), *(_fmt(c.get(x), "sci") for x in ("a", "b", "k")),
                       f"{_fmt(r.get('held_out_error_before'), 'ratio')} → {_fmt(r.get('held_out_error_after'), 'ratio')}",
                       str(r.get("announced_for", "—"))])
    return t


def _flops_table(side: dict[str, Any]) -> ReportTable | None:
    """Each module's FLOPs shape as the profile header has it (the later side's), its GPUs, and the
    peak MFU is over."""
    per = side.get("per_module") or {}
    modules = [m for m in side.get("module_order", []) if m in per and "gpus" in per[m]]
    if not modules:
        return None
    peak = side.get("peak_tflops")
    over = (f"MFU over {peak:g} TFLOP/s per GPU ({side.get('peak_source')})" if peak else
            "no MFU: the device's peak is unknown (a CPU, or a GPU not in the table: --peak-tflops)")
    t = ReportTable(f"Model FLOPs per module (a step: 3x forward trained, 1x frozen); {over}",
                    [("module", False), ("GPUs", True), ("trained", False), ("layers", True), ("hidden", True),
                     ("FFN", True), ("heads/groups", True), ("vocab", True), ("attention", False), ("note", False)])
    for m in modules:
        st, shape = per[m], per[m].get("flops_shape") or {}
        trained = {True: "yes", False: "frozen"}.get(st.get("trained"), "—")
        dims = [str(shape[k]) if shape else "—" for k in ("layers", "hidden", "ffn_hidden")]
        heads = f"{shape['heads']}/{shape['query_groups']}" if shape else "—"
        kind = ("causal" if shape["causal"] else "bidirectional") if shape else "—"
        t.rows.append([m, str(st["gpus"]), trained, *dims, heads, str(shape.get("vocab") or "—"), kind,
                       st.get("flops_note", "")])
    return t


def detail_tables(before: dict[str, Any], after: dict[str, Any] | None) -> list[ReportTable]:
    """The tables after the summary: every module's time per rank, tokens, data movement, what an
    online calibration learnt, and each module's FLOPs shape."""
    tables = _module_time_tables(before, after)
    tables += [t for t in (_tokens_table(before, after), _io_table(before, after),
                           _calibration_table(after if after is not None else before),
                           _flops_table(after if after is not None else before))
               if t is not None]
    return tables


def _rich_table(t: ReportTable) -> Table:
    table = Table(title=t.title, header_style="bold")
    for header, right in t.columns:
        table.add_column(header, justify="right" if right else "left",
                         overflow="fold" if header == "directory" else "ellipsis")
    for row in t.rows:
        table.add_row(*(Text(c[0], style=CHANGE_STYLES[c[1]][0]) if isinstance(c, tuple) else c for c in row))
    return table


def render(
    before: dict[str, Any],
    after: dict[str, Any] | None = None,
    console: Console | None = None,
) -> None:
    """Print the report of one summary, or of a before/after pair with a change column."""
    console = console or Console()
    console.rule("[bold]mimo-accel profile report")
    console.print(_rich_table(runs_table(before, after)))
    for kind, text in report_messages(before, after):
        console.print(Text(f"⚠ {text}", style="yellow") if kind == "warning" else Text(text, style="cyan"))
    console.print(_rich_table(summary_table(before, after)))
    for line in slowest_lines(before, after):
        console.print(line)
    if (bound := bound_table(before, after)) is not None:
        console.print(_rich_table(bound))
    if (line := bound_line(before, after)) is not None:
        console.print(Text(line, style="bold yellow"))
    for t in detail_tables(before, after):
        console.print(_rich_table(t))
