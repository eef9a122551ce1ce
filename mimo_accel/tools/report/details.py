"""The report's tables after the summary: every module's time per rank, the language model's real
tokens per replica, the data each rank moved, what an online calibration learnt, and each module's
FLOPs shape — a column a run where runs are compared, each within 80 columns."""

from __future__ import annotations

from typing import Any

from mimo_accel.modules import LANGUAGE
from mimo_accel.tools.report.blocks import MISSING, ReportTable, change_cell, fmt
from mimo_accel.tools.report.comparison import timed_modules
from mimo_accel.tools.report.like import Side, ratio


def _module_time_table(sides: list[Side], module: str) -> ReportTable | None:
    """A module's time per rank: mean, p50 and p99 of one run; of several, each run's mean and the
    last over the first."""
    per = [((s.get("per_module") or {}).get(module) or {}).get("per_rank", {}) for _, s in sides]
    ranks = sorted({int(r) for p in per for r in p})
    if not ranks:
        return None
    title = ("Language model time per rank (fwd + bwd per step)" if module == LANGUAGE
             else f"{module.capitalize()} encoder time per rank (fwd + bwd per step)")
    one = len(sides) == 1
    columns = [("rank", True), ("dp", True)]
    columns += [(k, True) for k in ("mean", "p50", "p99")] if one else [(f"{n} mean", True) for n, _ in sides]
    if not one:
        columns.append((f"{sides[-1][0]}/{sides[0][0]}", True))
    t = ReportTable(title, columns)
    for rank in ranks:
        stats = [p.get(str(rank)) or {} for p in per]
        dp = next((st["dp_rank"] for st in stats if st.get("dp_rank") is not None), None)
        row: list[Any] = [str(rank), MISSING if dp is None else str(dp)]
        if one:
            row += [fmt(stats[0].get(k), "s") for k in ("mean", "p50", "p99")]
        else:
            means = [st.get("mean") for st in stats]
            row += [fmt(m, "s") for m in means] + [change_cell(ratio(means[0], means[-1]), True)]
        t.rows.append(row)
    return t


def _tokens_table(sides: list[Side]) -> ReportTable | None:
    dps = sorted({int(d) for _, s in sides for d in s.get("language_tokens_per_replica") or {}})
    if not dps:
        return None
    t = ReportTable("Language real tokens per replica per step, mean",
                    [("dp", True), *((n if len(sides) > 1 else "tokens", True) for n, _ in sides)])
    for dp in dps:
        t.rows.append([str(dp), *(fmt((s.get("language_tokens_per_replica") or {}).get(str(dp)), "count")
                                  for _, s in sides)])
    return t


_MOVED = (("samples_read_per_rank", "Samples read", "count"), ("bytes_read_per_rank", "Bytes read", "bytes"),
          ("bytes_exchanged_per_rank", "Bytes exchanged", "bytes"))


def _io_tables(sides: list[Side]) -> list[ReportTable]:
    """One table for each of samples read, bytes read and bytes exchanged that a run has: a row a
    rank, a column a run (mean per step)."""
    modules = {int(r): m for _, s in sides for m, rs in (s.get("modules") or {}).items() for r in rs}
    tables = []
    for key, what, kind in _MOVED:
        if not any(v for _, s in sides for v in (s.get(key) or {}).values()):
            continue
        ranks = sorted({int(r) for _, s in sides for r in s.get(key) or {}})
        t = ReportTable(f"{what} per rank (mean per step)",
                        [("rank", True), ("module", False), *((n if len(sides) > 1 else what.lower(), True)
                                                              for n, _ in sides)])
        for rank in ranks:
            t.rows.append([str(rank), modules.get(rank, "?"), *(fmt((s.get(key) or {}).get(str(rank)), kind)
                                                                 for _, s in sides)])
        tables.append(t)
    return tables


def _calibration_table(side: dict[str, Any]) -> ReportTable | None:
    """The refits an online calibration accepted (the last run's)."""
    refits = (side.get("online_calibration") or {}).get("refits") or []
    if not refits:
        return None
    t = ReportTable("Online calibration: accepted refits (a, b, k: s per row, row², item, or per token, token², "
                    "sample; the held-out error before → after; the first iteration planned with it)",
                    [("step", True), ("module", False), ("a", True), ("b", True), ("k", True), ("error", True),
                     ("from", True)])
    for r in refits:
        c = r.get("coefficients") or {}
        t.rows.append([str(r.get("step")), str(r.get("module")), *(fmt(c.get(x), "sci") for x in ("a", "b", "k")),
                       f"{fmt(r.get('held_out_error_before'), 'ratio')} → "
                       f"{fmt(r.get('held_out_error_after'), 'ratio')}",
                       str(r.get("announced_for", MISSING))])
    return t


def _flops_table(side: dict[str, Any]) -> ReportTable | None:
    """Each module's FLOPs shape as the profile header has it (the last run's), a column a module,
    its GPUs, and the peak MFU is over."""
    per = side.get("per_module") or {}
    modules = [m for m in side.get("module_order", []) if m in per and "gpus" in per[m]]
    if not modules:
        return None
    peak = side.get("peak_tflops")
    over = (f"MFU over {peak:g} TFLOP/s per GPU ({side.get('peak_source')})" if peak else
            "no MFU: the device's peak is unknown (a CPU, or a GPU not in the table: --peak-tflops)")
    t = ReportTable(f"Model FLOPs per module (a step: 3x forward trained, 1x frozen); {over}",
                    [("", False), *((m, True) for m in modules)])
    shapes = {m: per[m].get("flops_shape") or {} for m in modules}

    def shape(m: str, key: str) -> str:
        return str(shapes[m][key]) if shapes[m].get(key) is not None else MISSING

    rows = [("GPUs", lambda m: str(per[m]["gpus"])),
            ("trained", lambda m: {True: "yes", False: "frozen"}.get(per[m].get("trained"), MISSING)),
            ("layers", lambda m: shape(m, "layers")), ("hidden", lambda m: shape(m, "hidden")),
            ("FFN", lambda m: shape(m, "ffn_hidden")),
            ("heads/groups", lambda m: f"{shapes[m]['heads']}/{shapes[m]['query_groups']}" if shapes[m] else MISSING),
            ("vocab", lambda m: shape(m, "vocab")),
            ("attention", lambda m: ("causal" if shapes[m]["causal"] else "bidirectional") if shapes[m] else MISSING),
            ("note", lambda m: per[m].get("flops_note", "") or MISSING)]
    for label, cell in rows:
        values = [cell(m) for m in modules]
        if any(v != MISSING for v in values):
            t.rows.append([label, *values])
    return t


def detail_tables(sides: list[Side]) -> list[ReportTable]:
    """The tables after the summary, in order."""
    tables = [_module_time_table(sides, m) for m in timed_modules(*(s for _, s in sides))]
    tables += [_tokens_table(sides), *_io_tables(sides), _calibration_table(sides[-1][1]), _flops_table(sides[-1][1])]
    return [t for t in tables if t is not None]
