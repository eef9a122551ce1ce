"""Balance quality and planning time of balanced_order against the contiguous split and LPT.

Run: python benchmarks/bench_balance.py [--batches 200] [--per-group 8] [--calls 300] [--seed 0]

Workloads are synthetic datasets described as SampleShape lists, costed through the real
ResizeRule / CostIndex / CostModel path, so the quadratic attention term and the resize caps
shape the cost distribution as they would in training. tests/test_balance.py gates on the same
workloads.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mimo_accel.balance import balanced_order, contiguous_order, lower_bound, lpt_order, spread  # noqa: E402
from mimo_accel.costs import CostIndex, CostModel, ResizeRule, SampleShape  # noqa: E402


def _photo(
    rng: np.random.Generator, median_side: float, sigma: float, aspect_lo: float, aspect_hi: float
) -> tuple[int, int]:
    # Long side lognormal, short side a uniform fraction of it; floors keep out implausible slivers.
    long_side = max(56.0, rng.lognormal(np.log(median_side), sigma))
    short_side = max(28.0, long_side * rng.uniform(aspect_lo, aspect_hi))
    return int(long_side), int(short_side)


def receipts(rng: np.random.Generator, n: int) -> list[SampleShape]:
    """One phone photo of a receipt per sample: tall, sizes lognormal-skewed."""
    return [SampleShape((_photo(rng, 1400, 0.5, 0.3, 0.8),), int(rng.integers(60, 600))) for _ in range(n)]


_DPI = (72, 100, 150, 200, 300)
_PAGES_IN = ((8.27, 11.69), (8.5, 11.0), (13.33, 7.5))  # A4, US letter, 16:9 slide


def documents(rng: np.random.Generator, n: int) -> list[SampleShape]:
    """Multi-page documents: 1-8 rendered pages at mixed resolutions."""
    shapes = []
    for _ in range(n):
        pages = []
        for _ in range(int(rng.integers(1, 9))):
            w_in, h_in = _PAGES_IN[int(rng.integers(len(_PAGES_IN)))]
            dpi = _DPI[int(rng.integers(len(_DPI)))]
            pages.append((int(h_in * dpi), int(w_in * dpi)))
        shapes.append(SampleShape(tuple(pages), int(rng.integers(200, 2000))))
    return shapes


def chat(rng: np.random.Generator, n: int) -> list[SampleShape]:
    """Mixed chat: 60% text-only, the rest 1-3 web images of skewed sizes."""
    shapes = []
    for _ in range(n):
        tokens = int(rng.integers(30, 1500))
        if rng.random() < 0.6:
            shapes.append(SampleShape((), tokens))
            continue
        count = int(rng.choice([1, 2, 3], p=[0.7, 0.2, 0.1]))
        shapes.append(SampleShape(tuple(_photo(rng, 800, 0.6, 0.5, 1.0) for _ in range(count)), tokens))
    return shapes


WORKLOADS: dict[str, Callable[[np.random.Generator, int], list[SampleShape]]] = {
    "receipts": receipts,
    "documents": documents,
    "chat": chat,
}


def workload_costs(name: str, n: int, seed: int = 0, model: CostModel | None = None) -> np.ndarray:
    """Costs of ``n`` samples of workload ``name`` (a dataset pool to draw micro-batches from)."""
    rng = np.random.default_rng(seed)
    index = CostIndex.from_shapes(WORKLOADS[name](rng, n), ResizeRule())
    return index.costs(np.arange(n), model or CostModel())


PLANNERS: dict[str, Callable[[np.ndarray, int], list[int]]] = {
    "contiguous": lambda c, k: contiguous_order(c.size),
    "lpt": lpt_order,
    "balanced": balanced_order,
}


def quality(pool: np.ndarray, n_groups: int, per_group: int, batches: int, seed: int) -> dict[str, list[float]]:
    """Spread of each planner, and of the lower bound ("bound"), over random micro-batches."""
    rng = np.random.default_rng(seed)
    out: dict[str, list[float]] = {name: [] for name in ("bound", *PLANNERS)}
    for _ in range(batches):
        c = pool[rng.integers(pool.size, size=n_groups * per_group)]
        mean = c.sum() / n_groups
        out["bound"].append(lower_bound(c, n_groups) / mean if mean > 0 else 1.0)
        for name, plan in PLANNERS.items():
            out[name].append(spread(c, plan(c, n_groups), n_groups))
    return out


def plan_time_us(pool: np.ndarray, n: int, n_groups: int, calls: int, seed: int) -> tuple[float, float, float]:
    """Median wall-clock time, its 10th percentile, and median thread-CPU time of one call, in µs.

    On a shared machine the median moves with the neighbours' load; the 10th percentile shows
    what the code costs when it has the core to itself.
    """
    rng = np.random.default_rng(seed)
    batches = [pool[rng.integers(pool.size, size=n)] for _ in range(calls)]
    wall, cpu = [], []
    for c in batches:
        t0, c0 = time.perf_counter(), time.thread_time()
        balanced_order(c, n_groups)
        cpu.append(time.thread_time() - c0)
        wall.append(time.perf_counter() - t0)
    return statistics.median(wall) * 1e6, float(np.quantile(wall, 0.1)) * 1e6, statistics.median(cpu) * 1e6


def _print_table(title: str, header: list[str], rows: list[list[str]]) -> None:
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
        print(f"\n{title}")
        print("  ".join(h.rjust(w) for h, w in zip(header, widths)))
        for r in rows:
            print("  ".join(v.rjust(w) for v, w in zip(r, widths)))
        return
    table = Table(title=title)
    for h in header:
        table.add_column(h, justify="right")
    for r in rows:
        table.add_row(*r)
    Console(width=None if sys.stdout.isatty() else 200).print(table)  # no truncation when piped


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=200, help="random micro-batches per cell")
    parser.add_argument("--per-group", type=int, default=8, help="samples per group in the quality table")
    parser.add_argument("--calls", type=int, default=300, help="timed calls per cell")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    pools = {name: workload_costs(name, 20000, args.seed) for name in WORKLOADS}
    rows = []
    for name, pool in pools.items():
        for k in (4, 8, 16, 32, 64):
            q = quality(pool, k, args.per_group, args.batches, args.seed)
            cells = [name, str(k), f"{np.median(q['bound']):.4f}"]
            for planner in PLANNERS:
                v = np.asarray(q[planner])
                cells += [f"{np.median(v):.4f}", f"{np.quantile(v, 0.99):.4f}"]
            rows.append(cells)
    header = ["workload", "groups", "bound p50"] + [f"{p} {s}" for p in PLANNERS for s in ("p50", "p99")]
    title = (
        f"spread = max group / mean group; {args.per_group} samples per group, {args.batches} micro-batches"
        " (bound: lower bound / mean, no split can beat it)"
    )
    _print_table(title, header, rows)

    rows = []
    for name, pool in pools.items():
        for n, k in ((64, 8), (512, 64)):
            wall, wall_p10, cpu = plan_time_us(pool, n, k, args.calls, args.seed)
            rows.append([name, f"{n}/{k}", f"{wall:.0f}", f"{wall_p10:.0f}", f"{cpu:.0f}"])
    _print_table(
        f"balanced_order plan time over {args.calls} calls (goal: 200 µs at 64/8, 2000 µs at 512/64)",
        ["workload", "samples/groups", "wall p50 µs", "wall p10 µs", "cpu p50 µs"],
        rows,
    )


if __name__ == "__main__":
    main()
