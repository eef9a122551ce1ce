"""A simulation's PNG charts (matplotlib, the ``charts`` extra)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mimo_accel.tools.simulate.console import lead_of
from mimo_accel.tools.simulate.sweep import LABELS, PLANNERS


_MODULE_COLORS = ("tab:green", "tab:blue", "tab:purple", "tab:brown", "tab:olive")


def write_png(doc: dict[str, Any], path: str | Path) -> None:
    """Charts of :func:`figure`, written to ``path``. Needs matplotlib."""
    fig = figure(doc)  # first: it names the fix where matplotlib is missing
    import matplotlib.pyplot as plt

    fig.savefig(path, dpi=110)
    plt.close(fig)


def figure(doc: dict[str, Any]):
    """Three charts against the lead encoder's DP: its straggler (3 planners, p50 and p99), every
    module's replica spread (p50: the joint plan, the encoder-only plan, the module's bound), and
    the read volume. Needs matplotlib (RuntimeError naming the fix without it)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise RuntimeError("--png needs matplotlib: pip install 'mimo-accel[charts]' (or pip install "
                           "matplotlib)") from e
    rows, lead = doc["rows"], lead_of(doc)
    dps = [r["dp"] for r in rows]
    fig, (ax1, ax3, ax2) = plt.subplots(1, 3, figsize=(18, 4.8))
    for name, color in zip(PLANNERS, ("tab:red", "tab:orange", "tab:green")):
        ax1.plot(dps, [r["straggler"][name]["p50"] for r in rows], "o-", color=color, label=f"{LABELS[name]} p50")
        ax1.plot(dps, [r["straggler"][name]["p99"] for r in rows], "--", color=color, alpha=0.6, label="p99")
    if any(r["grid"] > r["dp"] for r in rows):
        ax1.plot(dps, [r["straggler"]["balanced_replicas"]["p50"] for r in rows], "^-", color="tab:purple",
                 label=f"balanced over {lead} replicas p50")
    ax1.plot(dps, [r["straggler"]["bound"]["p50"] for r in rows], ":", color="gray", label="lower bound p50")
    ax1.set_xscale("log", base=2)
    ax1.set_xlabel(f"{lead} DP")
    ax1.set_ylabel("straggler ratio (max / mean replica cost)")
    ax1.set_title(f"{lead.capitalize()} load balance — {doc['profile']['name']}")
    ax1.legend(fontsize=8)
    ax1.grid(alpha=0.3)
    base = [r["reads"]["baseline"]["amplification"] for r in rows]
    shard = [r["reads"]["sharded"]["amplification"] for r in rows]
    ax2.plot(dps, base, "o-", color="tab:red", label="baseline: every data rank reads all")
    ax2.plot(dps, shard, "o-", color="tab:green", label="sharded reads")
    exch = [(r["exchange"].get("balanced") or {}).get("bytes_moved", 0.0) / r["reads"]["micro_batch_bytes"]
            if r["reads"]["micro_batch_bytes"] else 0.0 for r in rows]
    ax2.plot(dps, exch, "s--", color="tab:blue", label="exchange-mode traffic alone (balanced)")
    ax2.set_xscale("log", base=2)
    ax2.set_yscale("log")
    ax2.set_xlabel(f"{lead} DP")
    ax2.set_ylabel("bytes read per step / micro-batch bytes")
    ax2.set_title("Read volume, whole cluster (micro-batch = DP × K samples)")
    ax2.legend(fontsize=8)
    ax2.grid(alpha=0.3, which="both")
    modules = [r["modules"] for r in rows]
    for i, name in enumerate(doc["modules"]):
        color = _MODULE_COLORS[i % len(_MODULE_COLORS)]  # never drop a module: colours repeat past five
        tables = [m["spread"][name] for m in modules]
        ax3.plot(dps, [s["joint"]["p50"] for s in tables], "o-", color=color, label=f"{name}: joint plan p50")
        ax3.plot(dps, [s["encoder_only"]["p50"] for s in tables], "x--", color=color, alpha=0.7,
                 label=f"{name}: {lead}-only plan p50")
        ax3.plot(dps, [s["bound"]["p50"] for s in tables], ":", color=color, alpha=0.5, label=f"{name}: bound p50")
    ax3.set_xscale("log", base=2)
    ax3.set_xlabel(f"{lead} DP")
    ax3.set_ylabel("replica spread (max / mean replica cost)")
    ax3.set_title("Every module's replicas")
    ax3.legend(fontsize=7)
    ax3.grid(alpha=0.3)
    fig.tight_layout()
    return fig
