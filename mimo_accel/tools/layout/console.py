"""The advisor's tables, its answer and the settings that run it."""

from __future__ import annotations

from typing import Optional

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from mimo_accel.tools.layout.advice import BESIDE, LAUNCHER, Advice, Objective, Row, settings
from mimo_accel.tools.layout.change import TIE
from mimo_accel.tools.layout.problem import Problem

__all__ = ["render_advice", "render_row", "settings_lines"]

TITLES = {"mimo_accel": "With mimo_accel (its step plan over packed real tokens)",
          "padded": "Without mimo_accel (upstream as shipped: the original order, padded batches)",
          "packed": "Upstream with its own in-batch packing (--pack-sequences-in-batch), the original order",
          "reorder_buffer": "PR #4608's reorder_buffer (ce55b79f, not merged), packed"}


def _each(values: Optional[dict], names, fmt: str) -> str:
    if not values:
        return "—"
    return " · ".join("—" if values.get(n) is None else format(values[n], fmt) for n in names)


def _table(title: str, rows: list[Row], names, plan: str, measured: bool = True) -> Table:
    t = Table(title=title, title_justify="left")
    for col in ("#", "layout", "GPUs", "step s\nmean (draws)", "samples/s", "tokens/s\nper GPU", "padded:\nstep s",
                ("MFU" if measured else "MFU, assumed") + "\n" + " · ".join(names), "GiB per GPU\n" + " · ".join(names), "bound",
                "busy share\n" + " · ".join(names)):
        t.add_column(col, justify="left" if col in ("layout", "bound") else "right", overflow="fold")
    for i, r in enumerate(rows, 1):
        mine, padded = r.figures.get(plan), r.figures.get("padded")
        memory = _each(r.memory_gib_per_gpu, names, ".1f") + ("" if r.fits else " ✗")
        if mine is None:
            t.add_row(str(i), r.spec, str(r.gpus), *["—"] * 5, memory, "—", r.why_not or "")
            continue
        d = mine.step_time_s_draws
        t.add_row(str(i), r.spec, str(r.gpus), f"{mine.step_time_s:.3f} ({min(d):.3f}–{max(d):.3f})",
                  f"{mine.samples_per_s:.1f}", f"{mine.tokens_per_s_per_gpu:,.0f}",
                  f"{padded.step_time_s:.3f}" if padded else "—", _each(mine.mfu, names, ".0%"), memory,
                  mine.bound_module or "—", _each(mine.busy_share, names, ".0%"))
    return t


def settings_lines(row: Row) -> list[str]:
    """Bridge's MegatronMIMOParallelismConfig, the language model's split and the Qwen3.5-VL
    launcher's flags for ``row``, with the lines to add where the launcher has no flag (the split)."""
    s = settings(row.layout)
    lines = ["MegatronMIMOParallelismConfig(module_parallelisms={"]
    for name, p in s["module_parallelisms"].items():
        args = ", ".join(f"{k}={v}" for k, v in p.items() if k != "context_parallel_size")
        lines.append(f'    "{name}": ModuleParallelismConfig({args}),')
    lines.append("})")
    if s["language_config"]:
        lines.append("language TransformerConfig: " + ", ".join(f"{k}={v}" for k, v in s["language_config"].items()))
    flags = " ".join(f"{k} {v}" for k, v in s["launcher"].items() if k.startswith("--"))
    comps = " ".join(f"--component {c}" for c in s["components"])
    lines.append(f"{LAUNCHER} {flags} {comps}  (world size {s['launcher']['world_size']})")
    if s["launcher_lines"]:
        lines.append(f"the launcher has no flag for the split: add in its _build_mimo_provider, beside `{BESIDE}`:")
        lines += [f"    {line}" for line in s["launcher_lines"]]
    return lines


def _head(console: Console, problem: Problem, what: str) -> None:
    p = problem
    console.print(f"[bold]mimo-accel layout[/] {escape(p.model.name)}{what}, on {escape(p.machine.describe())}")
    console.print(escape(f"  data: {p.draws.source}, gbs {p.gbs}, seq {p.draws.seq_length}, {p.draws.steps} draws "
                         f"(every layout priced on the same ones); costs: {p.seconds.describe()}"))
    s = p.settings
    console.print(escape(f"  memory as configured: sequence parallelism {'on' if s.sequence_parallel else 'off'}, "
                         f"recompute {s.recompute}, distributed optimizer {'on' if s.distributed_optimizer else 'off'}"
                         f", {s.precision} ({s.source})"))


def _notes(console: Console, problem: Problem) -> None:
    if not problem.seconds.measured:
        console.print("[yellow]note:[/] MFU here is assumed, not measured: the stated efficiency times each module's "
                      "busy share of the step (FLOPs priced at the assumed efficiency); a profile measures it")
    for note in problem.notes:
        console.print(f"[yellow]note:[/] {escape(note)}")


def render_row(row: Row, problem: Problem, console: Optional[Console] = None) -> None:
    """One layout priced under every plan: what the job will do."""
    console = console or Console()
    _head(console, problem, f": {row.spec}")
    names = list(problem.model.modules)
    for plan in row.figures:
        console.print(_table(TITLES[plan], [row], names, plan, problem.seconds.measured))
    if not row.fits:
        console.print(f"[red]does not fit:[/] {escape(row.why_not)}")
    _notes(console, problem)


def render_advice(advice: Advice, console: Optional[Console] = None) -> None:
    console = console or Console()
    p = advice.problem
    names = list(p.model.modules)
    objective = ("the job's samples/s within the budget, within " f"{TIE:.0%} by tokens/s per GPU; layouts using "
                 "at most half the budget after the rest") if advice.search.objective is Objective.THROUGHPUT else \
        f"tokens/s per active GPU, within {TIE:.0%} by samples/s"
    _head(console, p, f", budget {advice.budget} GPUs, ranked by {objective}")
    measured = p.seconds.measured
    for plan, rows in advice.ranked.items():
        console.print(_table(TITLES[plan] + ", best first", rows, names, plan, measured))
    if advice.current is not None:
        console.print(_table("The current layout (--current, or the profiled run's)", [advice.current], names,
                             "mimo_accel", measured))
    if advice.unfit:
        console.print(_table("Layouts that do not fit (--all)", advice.unfit[:50], names, "mimo_accel", measured))
    rec, acc = advice.recommended, advice.recommended.accelerated
    gains = " and ".join(f"{g:.2f}× the throughput of {what}" for g, what in (
        (advice.gain("padded"), "the best layout without it"),
        (advice.gain("packed"), "the best with upstream's own packing")) if g)
    if advice.keep_current:
        best = "" if advice.best.spec == rec.spec else f" (the best found: {escape(advice.best.spec)})"
        console.print(f"[bold]Keep the current layout[/] {escape(rec.spec)}: {escape(advice.margin or '')}{best}")
    else:
        console.print(f"[bold]Recommended with mimo_accel:[/] {escape(rec.spec)} ({rec.gpus} GPUs)")
        if advice.margin:
            console.print(f"  against the current layout ({escape(advice.current.spec)}): {escape(advice.margin)}",
                          highlight=False)
    console.print(f"  {acc.step_time_s:.3f} s a step, {acc.samples_per_s:.1f} samples/s, {gains}; bound by "
                  f"{acc.bound_module}", highlight=False)
    for line in settings_lines(rec):
        console.print(f"  {line}", highlight=False, soft_wrap=True)
    even = advice.even
    if even is not None:
        e = even.accelerated
        against = f"; against the current layout {even.change.said()}" if even.change else ""
        console.print(f"[bold]The best even split[/] (runs with the launcher as it is): {escape(even.spec)} "
                      f"({even.gpus} GPUs), {e.step_time_s:.3f} s a step, {e.samples_per_s:.1f} samples/s"
                      f"{escape(against)}", highlight=False)
        for line in settings_lines(even):
            console.print(f"  {line}", highlight=False, soft_wrap=True)
    console.print("  mimo_accel: reorder_window=step with packing (the step plan priced here), e.g. "
                  "MIMO_ACCEL=reorder,packing MIMO_ACCEL_REORDER_WINDOW=step", highlight=False)
    _notes(console, p)
    s = advice.searched
    console.print(f"{s['layouts']} layouts fit, {s['priced']} priced, in {advice.elapsed_s:.1f} s")
