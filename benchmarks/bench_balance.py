"""Plan time and balance quality: every module's replicas under four planners, and balanced_order
against LPT (and the contiguous split).

Run: python benchmarks/bench_balance.py [--repeats 30] [--batches 200] [--per-group 8] [--seed 0]
                                        [--module-batches 12] [--no-synthetic] [--no-modules]
                                        [--modules-only]

Every module (first; skip with ``--no-modules``, or run only it with ``--modules-only``): workloads
generated here that the project's profiles and tests do not use — ``receipts`` (one tall receipt
photo, OCR text of 80–6000 tokens), ``documents`` (1–12 pages at mixed DPI and paper sizes, text
100–8000 tokens), ``chat45`` (chat with 45 % text-only samples, 1–4 photos otherwise, text 16–12000
tokens); each sample may also carry voice clips (50 % of samples, 1–3 clips of 1–60 s, 50 encoder
rows per second, one placeholder token per 4 rows), used by the three-module layout. Each module's
cost per sample: vision ``a·Σp + b·Σp²`` (the default :class:`CostModel`, patches from the
Qwen3-VL resize rule: 16 px patches, 2×2 merge), audio ``Σrows + b·Σrows²``, language
``L + L²/8192`` with L = text tokens + image tokens after the 2×2 merge (patches / 4) (+ audio tokens
in the three-module layout). Layouts over the canonical grid G (8, 64, 512 groups with 8 samples
each: 64 / 512 / 4096 samples): ``1:1`` (vision G, language G), ``fan-in`` (vision G, language
G/2), ``fan-out`` (vision G/2, language G), ``three`` (vision G, audio G/2, language G/4). The four
planners side by side in one run: ``contiguous`` (upstream), ``lpt`` (#4608's method:
:func:`lpt_order` on the vision cost), ``vision-only`` (:func:`balanced_order` on the vision cost, as
the planner shipped before per-module balancing) and ``joint``
(:func:`mimo_accel.balance.balance_modules`). Printed per module: its median spread under each
planner over its bound (:func:`mimo_accel.balance.module_bounds`; spread / bound, 1 is the best
any equal-size split can do); per configuration the plan times (min / median ms) of the
vision-only and the joint plan and the joint plan's time over the vision-only plan's, timed in the
same run on the same micro-batches; then the issue's gates: the worst module's joint spread within
0.02 of its bound (median), vision's joint spread never more than 0.01 above the vision-only plan's
(median), and at 4096 samples / 512 groups the joint plan at most 3× the vision-only plan's time.

First table: the shipped workload profiles (``*.toml`` of :mod:`mimo_accel.workloads`) at
64 samples / 8 groups, 512 / 64 and 4096 / 512 (cluster scale), LPT and balanced_order side by
side: wall-clock plan time of one call (min and median over ``--repeats`` micro-batches) and
spread = max group / mean group, next to the lower bound's spread
(:func:`mimo_accel.balance.lower_bound` / mean: no equal-size split can go below it). "vs bound"
is spread / bound spread - 1: how far above the bound a plan is. The machine is printed first:
on a shared machine the median moves with the neighbours' load, the min shows what the code
costs when it has a core to itself.

Second table (skip with ``--no-synthetic``): synthetic workloads described as SampleShape lists,
costed through the real ResizeRule / CostIndex / CostModel path, over 4-64 groups;
tests/test_balance.py gates on the same workloads.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mimo_accel.balance import (  # noqa: E402
    balance_modules,
    balanced_order,
    contiguous_order,
    lower_bound,
    lpt_order,
    module_bounds,
    module_spreads,
    spread,
)
from mimo_accel.costs import CostIndex, CostModel, ResizeRule, SampleShape  # noqa: E402
from mimo_accel.grid import canonical_grid  # noqa: E402
from mimo_accel.modules import Modules  # noqa: E402
from mimo_accel.workloads import list_profiles, load_profile  # noqa: E402

SIZES = ((64, 8), (512, 64), (4096, 512))


# ------------------------------------------------------------------------------------- machine


def machine() -> str:
    """One line naming the machine the figures come from."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        usable = os.cpu_count() or 0
    try:
        load = "load average {:.2f} {:.2f} {:.2f}".format(*os.getloadavg())
    except OSError:
        load = "load average unknown"
    return (
        f"{cpu}, {usable} of {os.cpu_count()} logical CPUs usable, {load}; {platform.system()} "
        f"{platform.release()}, Python {platform.python_version()}, numpy {np.__version__}"
    )


# ------------------------------------------------------------------------------------- profiles


def profile_batches(name: str, n: int, count: int, seed: int) -> list[np.ndarray]:
    """``count`` micro-batches of ``n`` samples drawn from a shipped profile, costed with the
    default :class:`CostModel`."""
    costs = load_profile(name).sample_table(n * count, seed).costs(CostModel())
    return list(costs.reshape(count, n))


def _timed(plan: Callable[[np.ndarray, int], list[int]], c: np.ndarray, k: int) -> tuple[list[int], float]:
    t0 = time.perf_counter()
    order = plan(c, k)
    return order, time.perf_counter() - t0


def profile_rows(repeats: int, seed: int) -> list[dict]:
    """Per (profile, size): plan time and spread of LPT and balanced_order, with the bound."""
    rows = []
    for name in list_profiles():
        for n, k in SIZES:
            batches = profile_batches(name, n, repeats, seed)
            row: dict = {"profile": name, "n": n, "k": k, "bound": []}
            for planner in ("lpt", "balanced"):
                row[planner] = {"ms": [], "spread": [], "vs_bound": []}
            for c in batches:
                mean = c.sum() / k
                bound = lower_bound(c, k) / mean if mean > 0 else 1.0
                row["bound"].append(bound)
                for planner, plan in (("lpt", lpt_order), ("balanced", balanced_order)):
                    order, seconds = _timed(plan, c, k)
                    s = spread(c, order, k)
                    cell = row[planner]
                    cell["ms"].append(seconds * 1e3)
                    cell["spread"].append(s)
                    cell["vs_bound"].append(s / bound - 1.0)
            rows.append(row)
    return rows


def _pct(x: float) -> str:
    # A plan at the bound can land a few ulps below it (sums added in another order): show 0.
    return f"{100 * x:.2f}%" if x > 5e-5 or x < -1e-9 else "0.00%"


def print_profile_table(rows: list[dict], repeats: int) -> None:
    header = ["profile", "samples/groups", "bound p50", "LPT spread p50", "balanced spread p50",
              "LPT vs bound p50 / max", "balanced vs bound p50 / max", "LPT ms min / p50",
              "balanced ms min / p50"]
    cells = []
    for r in rows:
        lpt, bal = r["lpt"], r["balanced"]
        cells.append([
            r["profile"], f"{r['n']}/{r['k']}", f"{np.median(r['bound']):.4f}",
            f"{np.median(lpt['spread']):.4f}", f"{np.median(bal['spread']):.4f}",
            f"{_pct(np.median(lpt['vs_bound']))} / {_pct(max(lpt['vs_bound']))}",
            f"{_pct(np.median(bal['vs_bound']))} / {_pct(max(bal['vs_bound']))}",
            f"{min(lpt['ms']):.2f} / {statistics.median(lpt['ms']):.2f}",
            f"{min(bal['ms']):.2f} / {statistics.median(bal['ms']):.2f}",
        ])
    _print_table(
        f"Shipped profiles, {repeats} micro-batches per row: plan time of one call and spread "
        "(max group / mean group; bound: lower bound / mean, no split can beat it)",
        header, cells,
    )
    big = [r for r in rows if (r["n"], r["k"]) == SIZES[-1]]
    if big:
        worst_ms = max(statistics.median(r["balanced"]["ms"]) for r in big)
        worst_gap = max(float(np.median(r["balanced"]["vs_bound"])) for r in big)
        print(
            f"\n{SIZES[-1][0]}/{SIZES[-1][1]}: balanced_order median plan time <= {worst_ms:.2f} ms on every "
            f"profile (goal 10 ms); median spread within {_pct(worst_gap)} of the bound (goal 0.5%; the "
            "bound ignores cost granularity, see lower_bound)"
        )


# ------------------------------------------------------------------------------------- synthetic


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
    return index.module_costs(np.arange(n), model or CostModel(), Modules.from_dp_sizes({"vision": 1}))["vision"]


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


def print_synthetic_table(batches: int, per_group: int, seed: int) -> None:
    pools = {name: workload_costs(name, 20000, seed) for name in WORKLOADS}
    rows = []
    for name, pool in pools.items():
        for k in (4, 8, 16, 32, 64):
            q = quality(pool, k, per_group, batches, seed)
            cells = [name, str(k), f"{np.median(q['bound']):.4f}"]
            for planner in PLANNERS:
                v = np.asarray(q[planner])
                cells += [f"{np.median(v):.4f}", f"{np.quantile(v, 0.99):.4f}"]
            rows.append(cells)
    header = ["workload", "groups", "bound p50"] + [f"{p} {s}" for p in PLANNERS for s in ("p50", "p99")]
    _print_table(
        f"Synthetic workloads: spread, {per_group} samples per group, {batches} micro-batches per row",
        header, rows,
    )


# -------------------------------------------------------------------------------- every module

#: The Qwen3-VL processor's resize rule (16 px patches, 2x2 merge), capped at 16384 patches.
MODULE_RULE = ResizeRule(patch_size=16, merge_size=2, min_pixels=200704, max_pixels=4194304)
LANGUAGE_SQ = 1.0 / 8192  # the language model's cost per sample: L + L²/8192
AUDIO_ROWS_PER_SECOND = 50
AUDIO_ROWS_PER_TOKEN = 4


def _lognormal_int(rng: np.random.Generator, median: float, sigma: float, lo: int, hi: int, n: int) -> np.ndarray:
    return np.clip(np.rint(rng.lognormal(np.log(median), sigma, n)), lo, hi).astype(np.int64)


def _voice(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per sample: audio clips, Σ rows, Σ rows² (half the samples carry 1-3 voice clips of 1-60 s)."""
    clips = np.where(rng.random(n) < 0.5, rng.choice([1, 2, 3], size=n, p=[0.7, 0.2, 0.1]), 0)
    seconds = _lognormal_int(rng, 9, 0.9, 1, 60, int(clips.sum()))
    rows = seconds * AUDIO_ROWS_PER_SECOND
    owner = np.repeat(np.arange(n), clips)
    return (clips, np.bincount(owner, rows, minlength=n).astype(np.int64),
            np.bincount(owner, rows * rows, minlength=n).astype(np.int64))


def _images(rng: np.random.Generator, counts: np.ndarray, heights: np.ndarray, widths: np.ndarray):
    n = counts.size
    per = MODULE_RULE.patches_many(heights, widths)
    owner = np.repeat(np.arange(n), counts)
    return (np.bincount(owner, per, minlength=n).astype(np.int64),
            np.bincount(owner, per * per, minlength=n).astype(np.int64))


def gen_receipts(rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
    """One receipt photo per sample (tall, long-tailed), OCR text 80-6000 tokens."""
    counts = np.ones(n, dtype=np.int64)
    heights = _lognormal_int(rng, 1800, 0.55, 400, 9000, n)
    widths = np.maximum(200, (heights * rng.uniform(0.2, 0.7, n)).astype(np.int64))
    patches, sq = _images(rng, counts, heights, widths)
    return {"images": counts, "patches": patches, "sq_patches": sq,
            "text": _lognormal_int(rng, 350, 0.9, 80, 6000, n)}


_PAGES = ((8.27, 11.69), (8.5, 11.0), (8.5, 14.0), (11.69, 16.54), (13.33, 7.5))  # A4, letter, legal, A3, slide
_DPIS = (72, 96, 150, 200, 300)


def gen_documents(rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
    """Multi-page documents: 1-12 pages at mixed DPI and paper sizes, text 100-8000 tokens."""
    counts = rng.choice(np.arange(1, 13), size=n, p=np.r_[[0.2, 0.16, 0.13, 0.11, 0.09, 0.08], [0.0383] * 6]
                        / np.r_[[0.2, 0.16, 0.13, 0.11, 0.09, 0.08], [0.0383] * 6].sum())
    pages = int(counts.sum())
    paper = np.asarray(_PAGES)[rng.integers(len(_PAGES), size=pages)]
    dpi = np.asarray(_DPIS)[rng.integers(len(_DPIS), size=pages)]
    patches, sq = _images(rng, counts, (paper[:, 1] * dpi).astype(np.int64), (paper[:, 0] * dpi).astype(np.int64))
    return {"images": counts, "patches": patches, "sq_patches": sq,
            "text": _lognormal_int(rng, 900, 0.8, 100, 8000, n)}


def gen_chat45(rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
    """Chat: 45% text-only samples, the rest 1-4 photos; text 16-12000 tokens (a long tail)."""
    counts = np.where(rng.random(n) < 0.45, 0, rng.choice([1, 2, 3, 4], size=n, p=[0.6, 0.2, 0.1, 0.1]))
    total = int(counts.sum())
    long_side = _lognormal_int(rng, 1100, 0.6, 64, 6000, total)
    short_side = np.maximum(48, (long_side * rng.uniform(0.4, 1.0, total)).astype(np.int64))
    tall = rng.random(total) < 0.5
    patches, sq = _images(rng, counts, np.where(tall, long_side, short_side), np.where(tall, short_side, long_side))
    return {"images": counts, "patches": patches, "sq_patches": sq,
            "text": _lognormal_int(rng, 600, 1.1, 16, 12000, n)}


MODULE_WORKLOADS: dict[str, Callable[[np.random.Generator, int], dict[str, np.ndarray]]] = {
    "receipts": gen_receipts,
    "documents": gen_documents,
    "chat45": gen_chat45,
}

#: Layout name -> module DPs for G canonical groups.
MODULE_LAYOUTS: dict[str, Callable[[int], dict[str, int]]] = {
    "1:1": lambda g: {"vision": g, "language": g},
    "fan-in": lambda g: {"vision": g, "language": g // 2},
    "fan-out": lambda g: {"vision": g // 2, "language": g},
    "three": lambda g: {"vision": g, "audio": g // 2, "language": g // 4},
}

MODULE_PLANNERS = ("contiguous", "lpt", "vision-only", "joint")
_SHORT = {"contiguous": "contiguous", "lpt": "LPT", "vision-only": "vision-only", "joint": "joint"}


def module_pool(name: str, n: int, seed: int = 0, model: CostModel | None = None) -> dict[str, np.ndarray]:
    """Per-module costs of ``n`` generated samples of workload ``name``: ``vision``, ``audio`` (the
    voice clips), ``language`` (L + L²/8192, L = text + patches / 4) and ``language_with_audio``
    (L also counting the clips' placeholder tokens)."""
    model = model or CostModel()
    rng = np.random.default_rng([seed, 0xB41])
    s = MODULE_WORKLOADS[name](rng, n)
    clips, rows, sq_rows = _voice(rng, n)
    merge2 = MODULE_RULE.merge_size ** 2
    text_and_images = (s["text"] + s["patches"] // merge2).astype(np.float64)
    with_audio = text_and_images + np.ceil(rows / AUDIO_ROWS_PER_TOKEN)
    return {
        "vision": model.encoder_costs("vision", s["patches"], s["sq_patches"], s["images"]),
        "audio": model.a * rows.astype(np.float64) + model.b * sq_rows.astype(np.float64),
        "language": text_and_images + text_and_images ** 2 * LANGUAGE_SQ,
        "language_with_audio": with_audio + with_audio ** 2 * LANGUAGE_SQ,
    }


def _layout_costs(pool: dict[str, np.ndarray], idx: np.ndarray, dps: dict[str, int]) -> dict[str, np.ndarray]:
    out = {}
    for m in dps:
        key = "language_with_audio" if m == "language" and "audio" in dps else m
        out[m] = pool[key][idx]
    return out


def module_plans(costs: dict[str, np.ndarray], dps: dict[str, int]) -> dict[str, tuple[np.ndarray, float]]:
    """The four plans of one micro-batch, each with its wall time (s)."""
    grid = canonical_grid(dps.values())
    v = costs["vision"]
    out = {}
    for name, plan in (("contiguous", lambda: contiguous_order(v.size)), ("lpt", lambda: lpt_order(v, grid)),
                       ("vision-only", lambda: balanced_order(v, grid)),
                       ("joint", lambda: balance_modules(costs, dps))):
        t0 = time.perf_counter()
        order = plan()
        out[name] = (np.asarray(order, dtype=np.int64), time.perf_counter() - t0)
    return out


def module_rows(batches: int, seed: int, sizes=SIZES, layouts=None, workloads=None) -> list[dict]:
    """Per (workload, layout, size): every module's spread and bound per micro-batch under each
    planner, and each planner's plan time."""
    rows = []
    for name in workloads or MODULE_WORKLOADS:
        pool = module_pool(name, 20000, seed)
        for layout in layouts or MODULE_LAYOUTS:
            for n, g in sizes:
                dps = MODULE_LAYOUTS[layout](g)
                rng = np.random.default_rng([seed, n, g, len(rows)])
                row: dict = {"workload": name, "layout": layout, "n": n, "g": g, "dps": dps,
                             "spread": {m: {p: [] for p in MODULE_PLANNERS} for m in dps},
                             "bound": {m: [] for m in dps}, "ms": {p: [] for p in MODULE_PLANNERS}}
                count = batches if n < 4096 else max(3, batches // 2)
                for _ in range(count):
                    costs = _layout_costs(pool, rng.integers(pool["vision"].size, size=n), dps)
                    for m, b in module_bounds(costs, dps).items():
                        row["bound"][m].append(b)
                    for planner, (order, seconds) in module_plans(costs, dps).items():
                        row["ms"][planner].append(seconds * 1e3)
                        for m, sp in module_spreads(costs, dps, order).items():
                            row["spread"][m][planner].append(sp)
                rows.append(row)
    return rows


def module_gates(row: dict) -> dict[str, float]:
    """The issue's figures of one configuration, per micro-batch then the median over them: the
    worst module's joint spread over its bound (the largest of the modules' spread - bound), vision's
    joint spread over the vision-only plan's, and the joint plan's time over the vision-only plan's."""
    spread, bound, dps = row["spread"], row["bound"], row["dps"]
    count = len(bound[next(iter(dps))])
    gaps = [{m: spread[m]["joint"][i] - bound[m][i] for m in dps} for i in range(count)]
    worst_gap = [max(g.values()) for g in gaps]
    worst = max(dps, key=lambda m: float(np.median([g[m] for g in gaps])))
    return {
        "worst_module": worst,
        "worst_over_bound": float(np.median(worst_gap)),
        "vision_vs_vision_only": float(np.median(np.subtract(spread["vision"]["joint"], spread["vision"]["vision-only"]))),
        "time_ratio": statistics.median(row["ms"]["joint"]) / max(statistics.median(row["ms"]["vision-only"]), 1e-9),
        "time_ratio_min": min(row["ms"]["joint"]) / max(min(row["ms"]["vision-only"]), 1e-9),
    }


def print_module_table(rows: list[dict], batches: int) -> None:
    header = ["workload", "layout", "samples/G", "module", "bound p50",
              *(f"{_SHORT[p]}/bound" for p in MODULE_PLANNERS), "vision-only ms min/p50", "joint ms min/p50",
              "joint/vision-only time"]
    cells = []
    for r in rows:
        g = module_gates(r)
        dps = " ".join(f"{m[0]}{d}" for m, d in r["dps"].items())
        for i, m in enumerate(r["dps"]):
            bound = float(np.median(r["bound"][m]))
            ratios = [float(np.median(np.asarray(r["spread"][m][p]) / np.asarray(r["bound"][m])))
                      for p in MODULE_PLANNERS]
            last = i == len(r["dps"]) - 1
            vo, jo = r["ms"]["vision-only"], r["ms"]["joint"]
            cells.append([
                r["workload"] if i == 0 else "", r["layout"] if i == 0 else dps if i == 1 else "",
                f"{r['n']}/{r['g']}" if i == 0 else "", m, f"{bound:.4f}", *(f"{x:.4f}" for x in ratios),
                f"{min(vo):.2f} / {statistics.median(vo):.2f}" if last else "",
                f"{min(jo):.2f} / {statistics.median(jo):.2f}" if last else "",
                f"{g['time_ratio']:.1f}x" if last else "",
            ])
    _print_table(
        f"Every module: median spread over its bound (spread / bound; 1 = the best split) under four planners, "
        f"{batches} micro-batches per row ({max(3, batches // 2)} at 4096 samples); plan times in the same run",
        header, cells,
    )
    gates = [(r, module_gates(r)) for r in rows]
    per_replica_ok = [(r, g) for r, g in gates if r["n"] // max(r["dps"].values()) >= 8]  # >= 8 samples per replica
    near = [g["worst_over_bound"] <= 0.02 for _, g in per_replica_ok]
    vis = [g["vision_vs_vision_only"] <= 0.01 for _, g in gates]
    big = [(r, g) for r, g in gates if (r["n"], r["g"]) == (4096, 512)]
    worst = max(gates, key=lambda x: x[1]["worst_over_bound"])
    worst_vis = max(gates, key=lambda x: x[1]["vision_vs_vision_only"])
    print(f"\ngate: the worst module's joint spread within 0.02 of its bound (median): {sum(near)} of {len(near)} "
          f"configurations (worst: {worst[0]['workload']} {worst[0]['layout']} {worst[0]['n']}/{worst[0]['g']}, "
          f"{worst[1]['worst_module']} +{worst[1]['worst_over_bound']:.4f})")
    print(f"gate: vision's joint spread at most 0.01 above the vision-only plan's (median): {sum(vis)} of {len(vis)} "
          f"(largest: {worst_vis[0]['workload']} {worst_vis[0]['layout']} {worst_vis[0]['n']}/{worst_vis[0]['g']}, "
          f"{worst_vis[1]['vision_vs_vision_only']:+.4f})")
    if big:
        ratios = [g["time_ratio"] for _, g in big]
        print(f"gate: at 4096 samples / 512 groups the joint plan takes {min(ratios):.1f}x-{max(ratios):.1f}x the "
              f"vision-only plan's median time (goal <= 3x): {sum(x <= 3 for x in ratios)} of {len(ratios)}; "
              "joint ms p50 " + ", ".join(f"{r['workload']} {r['layout']} {statistics.median(r['ms']['joint']):.1f}"
                                         for r, _ in big))


# ------------------------------------------------------------------------------------- output


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
    parser.add_argument("--repeats", type=int, default=30, help="micro-batches (timed calls) per profile row")
    parser.add_argument("--batches", type=int, default=200, help="random micro-batches per synthetic row")
    parser.add_argument("--per-group", type=int, default=8, help="samples per group in the synthetic table")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-synthetic", action="store_true", help="no synthetic-workload table")
    parser.add_argument("--module-batches", type=int, default=12,
                        help="micro-batches per every-module row (half, at least 3, at 4096 samples)")
    parser.add_argument("--no-modules", action="store_true", help="no every-module table")
    parser.add_argument("--modules-only", action="store_true", help="only the every-module table")
    args = parser.parse_args(argv)

    print(f"machine: {machine()}")
    balanced_order(np.arange(64.0), 8)  # first-call imports and caches out of the timings
    balance_modules({"vision": np.arange(64.0), "language": np.arange(64.0)[::-1]}, {"vision": 8, "language": 4})
    if not args.no_modules:
        print_module_table(module_rows(args.module_batches, args.seed), args.module_batches)
    if not args.modules_only:
        print_profile_table(profile_rows(args.repeats, args.seed), args.repeats)
        if not args.no_synthetic:
            print_synthetic_table(args.batches, args.per_group, args.seed)
    print(f"machine at the end: {machine()}")


if __name__ == "__main__":
    main()
