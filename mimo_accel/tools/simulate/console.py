"""A simulation on the terminal (rich): the sweep's rows, each module's spreads, the reorder window."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from mimo_accel.modules import LANGUAGE
from mimo_accel.tools.simulate.sweep import LABELS, MODULE_LABELS, MODULE_PLANNERS, PLANNERS
from mimo_accel.tools.simulate.window import WINDOW_PLANS


# ------------------------------------------------------------------------------------- output


def _bytes(n: float | None) -> str:
    if n is None:
        return "—"
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.0f} B"


def _count(n: float) -> str:
    return f"{n:,.0f}" if n >= 100 or float(n).is_integer() else f"{n:.1f}"


def lead_of(doc: dict[str, Any]) -> str:
    return doc.get("lead", "vision")  # a document without "lead" swept "vision"


def _cost_text(cm: dict[str, Any]) -> str:
    """Each module's cost formula with its coefficients."""
    def one(name: str, c: dict[str, float]) -> str:
        if name == LANGUAGE:
            return f"{name} {c['a']:.4g}·tokens + {c['b']:.4g}·tokens²"
        return f"{name} {c['a']:.4g}·rows + {c['b']:.4g}·rows²" + (f" + {c['k']:.4g}·items" if c.get("k") else "")

    return "; ".join(one(name, c) for name, c in cm["modules"].items())


def render(doc: dict[str, Any], console: Console | None = None) -> None:
    """Print the simulation as rich tables."""
    console = console or Console()
    prof, cm, lead = doc["profile"], doc["cost_model"], lead_of(doc)
    console.print(
        f"[bold]mimo-accel simulate[/]: profile [bold]{prof['name']}[/] — {prof['description']}\n"
        f"{_micro_batches(doc)} per DP size, {doc['samples_per_replica']} samples per {lead} replica, "
        f"seed {doc['seed']}; cost per sample: {_cost_text(cm)} ({cm['source']}); {doc['language_dp_rule']}"
    )
    t = Table(title=f"{lead.capitalize()} straggler ratio (max/mean replica cost), p50 / p99", title_justify="left")
    for col in (f"{lead} dp", "lang dp", "micro-batch"):
        t.add_column(col, justify="right")
    for name in PLANNERS:
        t.add_column(LABELS[name], justify="right")
    fan_out = any(r["grid"] > r["dp"] for r in doc["rows"])
    if fan_out:
        t.add_column(f"balanced over\n{lead} replicas", justify="right")
    t.add_column("bound", justify="right")
    t.add_column(f"{lead} speedup\nvs contiguous", justify="right")
    t.add_column("vs LPT", justify="right")
    t.add_column("plan ms p50\nbalanced / LPT", justify="right")
    for r in doc["rows"]:
        st, sp, pm = r["straggler"], r["speedup"], r["plan_ms"]
        t.add_row(
            str(r["dp"]), str(r["language_dp"]), str(r["micro_batch_size"]),
            *(f"{st[n]['p50']:.3f} / {st[n]['p99']:.3f}" for n in (*PLANNERS, "balanced_replicas")[:3 + fan_out]),
            f"{st['bound']['p50']:.3f}",
            f"{sp['balanced_vs_contiguous']:.2f}x", f"{sp['balanced_vs_lpt']:.3f}x",
            f"{pm['balanced_p50']:.2f} / {pm['lpt_p50']:.2f}",
        )
    console.print(t)
    if fan_out:
        console.print(
            f"[yellow]fan-out[/] (language dp > {lead} dp): the planner balances G = lcm(dp) canonical groups;"
            f" 'balanced over {lead} replicas' balances the d {lead} replicas directly (still a valid plan)."
        )

    _render_modules(doc, console)

    per = "per step" if doc.get("window", 1) == 1 else "per micro-batch"
    t = Table(title=f"Reads {per}: baseline (every data rank reads the micro-batch) → sharded",
              title_justify="left")
    for col in (f"{lead} dp", f"data ranks\n{lead} + lang", f"per-rank samples\n{lead}", f"per-rank bytes\n{lead}",
                "per-rank samples\nlanguage", "cluster samples", "cluster bytes", "reduction"):
        t.add_column(col, justify="right")
    for r in doc["rows"]:
        rd = r["reads"]
        b, s = rd["baseline"], rd["sharded"]
        t.add_row(
            str(r["dp"]), f"{rd['data_ranks'][lead]} + {rd['data_ranks'][LANGUAGE]}",
            f"{_count(b['per_rank_samples'])} → {_count(s['per_rank_samples'][lead])}",
            f"{_bytes(b['per_rank_bytes'])} → {_bytes(s['per_rank_bytes'][lead])}",
            f"{_count(b['per_rank_samples'])} → {_count(s['per_rank_samples'][LANGUAGE])}",
            f"{_count(b['cluster_samples'])} → {_count(s['cluster_samples'])}",
            f"{_bytes(b['cluster_bytes'])} → {_bytes(s['cluster_bytes'])}",
            f"{rd['cluster_reduction']:.1f}x",
        )
    console.print(t)

    t = Table(title=f"Reorder traffic {per}: exchange mode (read, then all_to_all) vs plan-before-read (0)",
              title_justify="left")
    for col in (f"{lead} dp", "micro-batch", "moved: LPT", "moved: balanced", "moved: balanced,\nmatched groups",
                "bytes moved:\nLPT", "bytes moved:\nbalanced", "bytes moved:\nmatched", "plan-before-read"):
        t.add_column(col, justify="right")
    for r in doc["rows"]:
        ex = r["exchange"]

        def moved(name: str) -> str:
            e = ex.get(name)
            return "—" if e is None else f"{e['samples_moved']:.1f} ({e['samples_moved_fraction']:.0%})"

        t.add_row(
            str(r["dp"]), str(r["micro_batch_size"]), moved("lpt"), moved("balanced"), moved("balanced_matched"),
            *(_bytes((ex.get(n) or {}).get("bytes_moved")) for n in ("lpt", "balanced", "balanced_matched")),
            _bytes(ex["plan_before_read_bytes"]),
        )
    console.print(t)
    if doc.get("window", 1) > 1:
        _render_window(doc, console)
    for note in doc["notes"]:
        console.print(f"[yellow]note:[/] {note}")
    console.print(f"simulated in {doc['elapsed_s']:.2f} s")


def _render_modules(doc: dict[str, Any], console: Console) -> None:
    """Every module's spread under the four plans, p50, beside its bound; the worst module; the
    plan times of the encoder-only and the joint plan, side by side."""
    lead = lead_of(doc)
    t = Table(title="Every module's replica spread (max/mean replica cost), p50 over micro-batches; "
                    "worst = the worst module's", title_justify="left")
    for col in (f"{lead} dp", "layout (dp)", "module"):
        t.add_column(col, justify="right")
    for name in MODULE_PLANNERS:
        t.add_column(MODULE_LABELS[name].format(lead=lead), justify="right")
    for col in ("bound", "joint\nover bound", f"plan ms p50\n{lead}-only / joint"):
        t.add_column(col, justify="right")
    for r in doc["rows"]:
        mod = r.get("modules")
        if not mod:
            continue
        short = _short_names(list(mod["dps"]))
        layout = " / ".join(f"{short[m]}{dp}" for m, dp in mod["dps"].items())
        names = list(mod["spread"])
        for i, m in enumerate([*names, "worst"]):
            st = mod["worst"] if m == "worst" else mod["spread"][m]
            pm = mod["plan_ms"]
            over = (mod["worst_over_bound"]["joint"]["p50"] if m == "worst"
                    else st["joint"]["p50"] - st["bound"]["p50"])
            t.add_row(
                str(r["dp"]) if i == 0 else "", layout if i == 0 else "", f"[bold]{m}[/]" if m == "worst" else m,
                *(f"{st[p]['p50']:.3f}" for p in MODULE_PLANNERS), f"{st['bound']['p50']:.3f}", f"{over:+.3f}",
                f"{pm['encoder_only_p50']:.2f} / {pm['joint_p50']:.2f}" if m == "worst" else "",
                end_section=m == "worst",
            )
    console.print(t)
    console.print(
        f"LPT (#4608): lpt_order on the {lead} cost; {lead}-only: balanced_order on the {lead} cost (the shipped"
        " planner); joint: balance_modules over every module. Module costs per sample as the planner prices them"
        " (CostIndex.module_costs): an encoder a·rows + b·rows² (+ k·items), the language model"
        " a·tokens + b·tokens² over its real tokens. worst-row 'joint over bound': the largest excess of a"
        " module over its own bound."
    )


def _short_names(names: list[str]) -> dict[str, str]:
    """Each name's shortest prefix that no other name starts with (vision, video -> vis, vid)."""
    def unique(name: str) -> str:
        return next((name[:k] for k in range(1, len(name))
                     if not any(o != name and o.startswith(name[:k]) for o in names)), name)

    return {name: unique(name) for name in names}


def _micro_batches(doc: dict[str, Any]) -> str:
    w = doc.get("window", 1)
    return f"{doc['steps']} micro-batches" if w == 1 else f"{doc['steps']} steps x {w} micro-batches"


def _render_window(doc: dict[str, Any], console: Console) -> None:
    w, lead = doc["window"], lead_of(doc)
    t = Table(title=f"Global-batch window: {w} micro-batches per step planned together. Step straggler = max/mean "
                    f"over {lead} replicas of their cost summed over the step, p50", title_justify="left")
    for col in (f"{lead} dp", "micro-batch\nbound", "per-micro-batch\nplans", "window\n(planner)",
                "window,\nreplica totals", "step\nbound", "bound excess removed\nper-mb / window / replica",
                "lockstep p50\nper-mb / window / replica", "window plan\nms p50"):
        t.add_column(col, justify="right")
    for r in doc["rows"]:
        wr = r["window"]
        st, rm, ls = wr["straggler"], wr["removed"], wr["lockstep"]
        t.add_row(
            str(r["dp"]), f"{wr['bound_per_micro_batch']['p50']:.3f}",
            *(f"{st[n]['p50']:.3f}" for n in (*WINDOW_PLANS, "bound")),
            " / ".join("—" if rm[n] is None else f"{rm[n]:.0%}" for n in WINDOW_PLANS),
            " / ".join(f"{ls[n]['p50']:.3f}" for n in WINDOW_PLANS),
            f"{wr['plan_ms']['window_p50']:.1f}",
        )
    console.print(t)
    console.print(
        "micro-batch bound: the per-micro-batch straggler no plan of one micro-batch can beat (the largest image"
        " and the cheapest fill); [bold]removed[/]: the share of its excess over 1 gone at the step level."
        " per-micro-batch plans: each micro-batch balanced alone over the dp replicas (window 1); window (planner):"
        " balanced_order over"
        f" the step's {w} x dp groups, as reorder_window={w} plans it; replica totals (diagnostic): the step"
        " balanced over the dp replicas, each replica's samples dealt into its micro-batches heaviest first."
        " lockstep: sum over micro-batches of the slowest replica / of the mean, if every micro-batch waited for"
        " all replicas."
    )
