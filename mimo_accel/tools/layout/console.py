"""The advisor's tables and the settings that run its recommendation."""

from __future__ import annotations

from typing import Optional

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from mimo_accel.tools.layout.advice import TIE, Advice, Row, settings

__all__ = ["render_advice", "render_row", "settings_lines"]


def _each(values: Optional[dict], names, fmt: str) -> str:
    if not values:
        return "—"
    return " · ".join("—" if values.get(n) is None else format(values[n], fmt) for n in names)


def _table(title: str, rows: list[Row], names, side: str) -> Table:
    t = Table(title=title, title_justify="left")
    other = "without" if side == "with" else "with"
    for col, just in (("#", "right"), ("layout", "left"), ("GPUs", "right"), ("step s", "right"),
                      ("samples/s", "right"), ("tokens/s\nper GPU", "right"), (f"{other}:\nstep s", "right"),
                      ("MFU\n" + " · ".join(names), "right"), ("GiB per GPU\n" + " · ".join(names), "right"),
                      ("bound", "left"), ("busy share\n" + " · ".join(names), "right")):
        t.add_column(col, justify=just)
    for i, r in enumerate(rows, 1):
        mine, theirs = (r.accelerated, r.baseline) if side == "with" else (r.baseline, r.accelerated)
        if mine is None:
            t.add_row(str(i), r.spec, str(r.gpus), "—", "—", "—", "—", "—",
                      _each(r.memory_gib_per_gpu, names, ".1f"), "—", r.why_not or "")
            continue
        t.add_row(str(i), r.spec, str(r.gpus), f"{mine.step_time_s:.3f}", f"{mine.samples_per_s:.1f}",
                  f"{mine.tokens_per_s_per_gpu:,.0f}", f"{theirs.step_time_s:.3f}" if theirs else "—",
                  _each(mine.mfu, names, ".0%"), _each(r.memory_gib_per_gpu, names, ".1f")
                  + ("" if r.fits else " ✗"), mine.bound_module, _each(mine.busy_share, names, ".0%"))
    return t


def settings_lines(row: Row) -> list[str]:
    """Bridge's MegatronMIMOParallelismConfig and the Qwen3.5-VL launcher's flags for ``row``."""
    s = settings(row.layout)
    lines = ["MegatronMIMOParallelismConfig(module_parallelisms={"]
    for name, p in s["module_parallelisms"].items():
        args = ", ".join(f"{k}={v}" for k, v in p.items() if k != "context_parallel_size")
        lines.append(f'    "{name}": ModuleParallelismConfig({args}),')
    lines.append("})")
    flags = " ".join(f"{k} {v}" for k, v in s["launcher"].items() if k.startswith("--"))
    comps = " ".join(f"--component {c}" for c in s["components"])
    lines.append(f"examples/megatron_mimo/qwen35_vl/finetune_qwen35_vl.py {flags} {comps}  "
                 f"(world size {s['launcher']['world_size']})")
    return lines


def render_row(row: Row, console: Console, names) -> None:
    console.print(_table("The layout priced", [row], names, "with"))


def render_advice(advice: Advice, console: Optional[Console] = None) -> None:
    console = console or Console()
    p = advice.problem
    names = list(p.model.modules)
    objective = ("the job's samples/s within the budget, within " f"{TIE:.0%} by tokens/s per GPU; layouts using "
                 "at most half the budget after the rest") if advice.objective == "throughput" else \
        f"tokens/s per active GPU, within {TIE:.0%} by samples/s"
    console.print(f"[bold]mimo-accel layout[/] {escape(p.model.name)}, budget {advice.budget} GPUs, on "
                  f"{escape(p.machine.describe())}")
    console.print(escape(f"  data: {p.draws.source}, gbs {p.gbs}, seq {p.draws.seq_length}, {p.draws.steps} steps "
                         f"drawn; costs: {p.seconds.describe()}; ranked by {objective}"))
    console.print(_table("With mimo_accel (its step plan over packed real tokens), best first", advice.with_mimo_accel,
                         names, "with"))
    console.print(_table("Without mimo_accel (upstream as shipped: the original order, padded batches), best first",
                         advice.without, names, "without"))
    if advice.current is not None:
        console.print(_table("The current layout (--current, or the profiled run's)", [advice.current], names, "with"))
    if advice.unfit:
        console.print(_table("Layouts that do not fit (--all)", advice.unfit[:50], names, "with"))
    rec, base = advice.recommended, advice.recommended_without
    gain = base.baseline.step_time_s / rec.accelerated.step_time_s
    console.print(f"[bold]Recommended with mimo_accel:[/] {escape(rec.spec)} ({rec.gpus} GPUs): "
                  f"{rec.accelerated.step_time_s:.3f} s a step, {rec.accelerated.samples_per_s:.1f} samples/s, "
                  f"{gain:.2f}× the throughput of the best layout without it ({base.spec}: "
                  f"{base.baseline.step_time_s:.3f} s); bound by {rec.accelerated.bound_module}")
    for line in settings_lines(rec):
        console.print(f"  {line}", highlight=False, soft_wrap=True)
    console.print("  mimo_accel: reorder_window=step with packing (the step plan priced here), e.g. "
                  "MIMO_ACCEL=shard,reorder,pack MIMO_ACCEL_REORDER_WINDOW=step", highlight=False)
    for note in p.notes:
        console.print(f"[yellow]note:[/] {escape(note)}")
    s = advice.searched
    console.print(f"{s['layouts']} layouts fit, {s['priced']} priced, in {advice.elapsed_s:.1f} s")
