"""The report's PNG charts (matplotlib, the ``charts`` extra): module time, step time, each module's straggler."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mimo_accel.tools.report.comparison import timed_modules
from mimo_accel.tools.report.like import Side


# ---------------------------------------------------------------------------------------- charts


def pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise RuntimeError("charts need matplotlib: pip install 'mimo-accel[charts]' (or pip install "
                           "matplotlib)") from e
    return plt


def _plot_module_time(ax, sides: list[Side]) -> None:
    """Per-rank module time bars (every timed module's ranks, a bar a run), p99 ticks."""

    def per_rank(s: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for m in timed_modules(s):
            out.update(s["per_module"][m]["per_rank"])
        return out

    module_of = {int(r): m for _, s in sides for m in timed_modules(s) for r in s["per_module"][m]["per_rank"]}
    ranks = sorted({int(r) for _, s in sides for r in per_rank(s)})
    width = 0.8 / len(sides)
    for i, (name, s) in enumerate(sides):
        per = per_rank(s)
        xs = [j + (i - (len(sides) - 1) / 2) * width for j in range(len(ranks))]
        means = [((per.get(str(r)) or {}).get("mean") or 0.0) * 1e3 for r in ranks]
        p99 = [((per.get(str(r)) or {}).get("p99") or 0.0) * 1e3 for r in ranks]
        ax.bar(xs, means, width=width, label=f"{name} mean")
        ax.scatter(xs, p99, marker="_", s=120, color="black", zorder=3, label="p99" if i == 0 else None)
    ax.set_xticks(range(len(ranks)))
    small = len(ranks) > 16
    ax.set_xticklabels([f"{r}\n{module_of.get(r, '')}" if not small else str(r) for r in ranks],
                       fontsize=8 if small else 9)
    ax.set_xlabel("rank (module)")
    ax.set_ylabel("module fwd+bwd per step (ms)")
    ax.set_title("Module time per rank")
    if ranks:
        ax.legend()
    else:
        ax.text(0.5, 0.5, "no module timing", ha="center", va="center", transform=ax.transAxes)


def _plot_step_time_cdf(ax, sides: list[Side]) -> None:
    for name, s in sides:
        times = sorted(v * 1e3 for v in s.get("series", {}).get("step_time_s", []))
        if times:
            ys = [(i + 1) / len(times) for i in range(len(times))]
            ax.step([times[0], *times], [0.0, *ys], where="post", label=f"{name} ({s.get('label', '')})")
    ax.set_xlabel("step time (ms)")
    ax.set_ylabel("fraction of steps")
    ax.set_title("Step time CDF")
    ax.set_ylim(0, 1.02)
    ax.legend()


def _straggler_modules(sides: list[Side]) -> list[str]:
    """The modules with a per-step straggler series in any run, in the layout's order."""
    return [m for m in timed_modules(*(s for _, s in sides))
            if any(((s.get("series") or {}).get("modules") or {}).get(m, {}).get("max_over_mean")
                   for _, s in sides)]


def _plot_straggler(ax, module: str, sides: list[Side]) -> None:
    """One module's straggler ratio (max / mean over its replicas) per step, a line per run."""
    for name, s in sides:
        series = ((s.get("series") or {}).get("modules") or {}).get(module) or {}
        steps, ratios = series.get("step") or [], series.get("max_over_mean") or []
        if ratios and len(steps) == len(ratios):
            ax.plot(steps, ratios, marker="o", markersize=3, label=f"{name} ({s.get('label', '')})")
    ax.axhline(1.0, color="grey", linewidth=0.8, linestyle=":")
    ax.set_xlabel("step")
    ax.set_ylabel("max / mean over replicas")
    ax.set_title(f"{module} straggler per step")
    ax.legend()


def chart_figures(sides: list[Side]) -> list[tuple[str, Any]]:
    """``(caption, figure)``: module time per rank and the step-time CDF; every module's straggler
    per step (``sides``: the report's runs, :func:`~.console.sides_of`)."""
    plt = pyplot()
    out = []
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    _plot_module_time(ax1, sides)
    _plot_step_time_cdf(ax2, sides)
    fig.tight_layout()
    out.append(("Module time per rank (mean, p99) and step time CDF", fig))
    modules = _straggler_modules(sides)
    if modules:
        fig, axes = plt.subplots(1, len(modules), figsize=(max(6.0, 4.5 * len(modules)), 3.8), squeeze=False)
        for ax, m in zip(axes[0], modules):
            _plot_straggler(ax, m, sides)
        fig.tight_layout()
        out.append(("Straggler (max / mean of the replicas' fwd + bwd time) per step, per module", fig))
    return out


def png_bytes(fig) -> bytes:
    import io

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    pyplot().close(fig)
    return buf.getvalue()


def write_png(sides: list[Side], path: str | Path) -> None:
    """Per-rank module time bars (every timed module's ranks, a bar a run), a step-time CDF and,
    below them, each module's straggler per step, as one PNG. Needs matplotlib."""
    plt = pyplot()
    modules = _straggler_modules(sides)
    rows = 2 if modules else 1
    cols = max(2, len(modules))
    fig = plt.figure(figsize=(max(12.0, 4.5 * cols), 4.5 * rows))
    grid = fig.add_gridspec(rows, cols)
    half = cols // 2
    _plot_module_time(fig.add_subplot(grid[0, :half]), sides)
    _plot_step_time_cdf(fig.add_subplot(grid[0, half:]), sides)
    for i, m in enumerate(modules):
        _plot_straggler(fig.add_subplot(grid[1, i]), m, sides)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
