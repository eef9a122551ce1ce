"""The step plan on upstream's validated layout: the modelled step of mimo_accel's plan against the
original order, PR #4608's reorder_buffer and a plain local search, with plan times.

Run: python benchmarks/bench_step_plan.py [--steps 3] [--micro-batches 16,32] [--ratios 0.25,0.5,1,2]
                                          [--workloads receipts,documents,mixed_chat] [--seed 0] [--no-large]

Layout: Megatron-Bridge's Qwen3.5-VL tutorial (``tutorials/megatron_mimo/qwen35-vl-non-colocated-sft.md``):
images DP1 -> language DP2 with 2 PP stages, a global micro-batch of 2 (one sample per language
replica), W = 16 or 32 micro-batches a step; the encoder trained or frozen. The step's time is
:func:`mimo_accel.balance.step_time` (1F1B, the encoder as the stage before the language model's
first stage, forward 1/3 and backward 2/3 of a trained module's time).

Workloads generated here, shaped like the shipped profiles but not drawn from them: ``receipts``
(one tall photo, short OCR text), ``documents`` (1-10 scanned pages, longer text), ``mixed_chat``
(55 % text only, else 1-4 photos, long-tailed text). Patches from a Qwen-style resize (16 px
patches, pixels clipped to 200k-4M); encoder cost ``rows + 0.0009·Σ rows²`` per image, language
``L + L²/8192`` with L = text tokens + patches/4. Each step's encoder costs are then scaled so the
encoder stage (its summed cost) is ``ratio`` × the language model's per-stage time (its summed
cost over 2 replicas × 2 stages): the ratios sweep from language-bound to encoder-bound.

Plans, side by side on the same steps:

* ``original``: the samples as they come;
* ``reorder_buffer``: PR #4608's reorder_buffer (ce55b79f, not merged), defaults (:func:`mimo_accel.balance.peers.reorder_buffer_order`
  on patches over G = lcm(DPs) = 2, each micro-batch alone);
* ``mimo_accel``: :func:`mimo_accel.balance.plan_step`;
* ``local search``: the yardstick, written here: from the original order, the best swap of two
  samples by :func:`step_time` over every pair, made while it shortens the step (no restarts).

Printed: per configuration the median over the steps of each plan's step over the original's, and
the plan times; then the medians over every configuration and step, the gates (mimo_accel's median
at least 15 % below the original's and within 3 % of the local search's; a 64-sample plan within
0.5 s), and (skip with ``--no-large``) plan_step's time at 4096 samples, W 8, 512 groups against
:func:`mimo_accel.balance.balance_modules`' on the same input (gate: the min within 2x). The machine
is printed first and last: on a shared machine the medians move with the neighbours' load.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_balance import _print_table, machine  # noqa: E402

from mimo_accel.balance import balance_modules, plan_step, step_time  # noqa: E402
from mimo_accel.balance.peers import reorder_buffer_costs, reorder_buffer_order  # noqa: E402

DPS = {"images": 1, "language": 2}
STAGES = {"language": 2}
MBS = 2
PLANS = ("original", "reorder_buffer", "mimo_accel", "local")


# ------------------------------------------------------------------------------------ workloads


def _patches(rng: np.random.Generator, heights: np.ndarray, widths: np.ndarray) -> np.ndarray:
    """Qwen-style resize: pixels clipped to [200704, 4194304], sides to multiples of 32 px; 16 px patches."""
    pixels = heights * widths
    scale = np.sqrt(np.clip(pixels, 200704, 4194304) / pixels)
    h = np.maximum(32, np.round(heights * scale / 32) * 32)
    w = np.maximum(32, np.round(widths * scale / 32) * 32)
    return (h / 16) * (w / 16)


def workload(name: str, n: int, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    """(patches, text tokens, encoder cost, language cost) of n samples."""
    if name == "receipts":
        counts = np.ones(n, dtype=np.int64)
        h, w = rng.lognormal(np.log(1400), 0.7, n), rng.lognormal(np.log(600), 0.35, n)
        tokens = np.clip(rng.lognormal(np.log(200), 0.8, n), 16, 4000)
    elif name == "documents":
        counts = rng.integers(1, 11, n)
        h, w = rng.lognormal(np.log(2000), 0.25, counts.sum()), rng.lognormal(np.log(1500), 0.25, counts.sum())
        tokens = np.clip(rng.lognormal(np.log(500), 0.7, n), 32, 6000)
    elif name == "mixed_chat":
        counts = np.where(rng.random(n) < 0.55, 0, rng.integers(1, 5, n))
        h, w = rng.lognormal(np.log(800), 0.5, counts.sum()), rng.lognormal(np.log(1000), 0.5, counts.sum())
        tokens = np.clip(rng.lognormal(np.log(600), 1.0, n), 16, 12000)
    else:
        raise ValueError(f"unknown workload {name!r}")
    rows = _patches(rng, h, w)
    owner = np.repeat(np.arange(n), counts)
    patches = np.bincount(owner, weights=rows, minlength=n)
    encoder = np.bincount(owner, weights=rows + 0.0009 * rows ** 2, minlength=n)
    length = tokens + patches / 4
    return patches, tokens, encoder, length + length ** 2 / 8192


def _scaled(encoder: np.ndarray, language: np.ndarray, ratio: float) -> np.ndarray:
    """Encoder costs scaled so the encoder stage is ``ratio`` × the language per-stage time."""
    per_stage = language.sum() / (DPS["language"] * STAGES["language"])
    return encoder * (ratio * per_stage / (encoder.sum() / DPS["images"]))


# ------------------------------------------------------------------------------------------ plans


def local_search(costs: dict, micro_batches: int, **kw) -> list[int]:
    """The yardstick: from the original order, the best pairwise swap by step_time, while it helps."""
    n = len(costs["language"])
    order = np.arange(n)
    now = step_time(costs, DPS, order, micro_batches, **kw)
    a, b = np.triu_indices(n, 1)
    rows = np.arange(a.size)
    while True:
        tried = np.repeat(order[None, :], a.size, axis=0)
        tried[rows, a], tried[rows, b] = order[b], order[a]
        times = step_time(costs, DPS, tried, micro_batches, **kw)
        best = int(np.argmin(times))
        if not times[best] < now:
            return order.tolist()
        order, now = tried[best], times[best]


def one_step(costs: dict, patches: np.ndarray, tokens: np.ndarray, micro_batches: int, frozen: bool) -> dict:
    kw = {"stages": STAGES, "frozen": ("images",) if frozen else ()}
    n = patches.size
    planned, ms = {}, {}
    for name, plan in (
            ("original", lambda: list(range(n))),
            ("reorder_buffer", lambda: reorder_buffer_order(reorder_buffer_costs(patches, tokens), 2, micro_batches)),
            ("mimo_accel", lambda: plan_step(costs, DPS, micro_batches, **kw)),
            ("local", lambda: local_search(costs, micro_batches, **kw))):
        t0 = time.perf_counter()
        planned[name] = plan()
        ms[name] = (time.perf_counter() - t0) * 1e3
    times = step_time(costs, DPS, np.array([planned[p] for p in PLANS]), micro_batches, **kw)
    bound = max(costs["images"].sum(), costs["language"].sum() / (DPS["language"] * STAGES["language"]))
    return {"time": dict(zip(PLANS, times.tolist())), "ms": ms, "bound": float(bound)}


def run(workloads: list[str], windows: list[int], ratios: list[float], steps: int, seed: int) -> list[dict]:
    rows = []
    for w in windows:
        for frozen in (False, True):
            for name in workloads:
                for ratio in ratios:
                    rng = np.random.default_rng([seed, w, len(name), int(ratio * 100)])
                    results = []
                    for _ in range(steps):
                        patches, tokens, encoder, language = workload(name, w * MBS, rng)
                        costs = {"images": _scaled(encoder, language, ratio), "language": language}
                        results.append(one_step(costs, patches, tokens, w, frozen))
                    rows.append({"w": w, "frozen": frozen, "workload": name, "ratio": ratio, "steps": results})
    return rows


def _median(values) -> float:
    return float(statistics.median(values))


def report(rows: list[dict]) -> dict:
    table = []
    for r in rows:
        rel = {p: _median(s["time"][p] / s["time"]["original"] for s in r["steps"]) for p in PLANS[1:]}
        table.append([str(r["w"]), "frozen" if r["frozen"] else "trained", r["workload"], f"{r['ratio']:g}",
                      f"{_median(s['time']['original'] / s['bound'] for s in r['steps']):.3f}",
                      *(f"{rel[p]:.3f}" for p in PLANS[1:]),
                      f"{_median(s['time']['mimo_accel'] / s['time']['local'] for s in r['steps']):.3f}",
                      f"{_median(s['ms']['mimo_accel'] for s in r['steps']):.0f}",
                      f"{_median(s['ms']['local'] for s in r['steps']):.0f}"])
    _print_table("Modelled step over the original order's (median over the steps)",
                 ["W", "encoder", "workload", "enc/lang stage", "original/bound", "reorder_buffer", "mimo_accel",
                  "local search", "mimo/local", "plan ms mimo", "plan ms local"], table)
    every = [s for r in rows for s in r["steps"]]
    out = {p: _median(s["time"][p] / s["time"]["original"] for s in every) for p in PLANS[1:]}
    out["mimo_vs_local"] = _median(s["time"]["mimo_accel"] / s["time"]["local"] for s in every)
    for w in sorted({r["w"] for r in rows}):
        ms = [s["ms"]["mimo_accel"] for r in rows if r["w"] == w for s in r["steps"]]
        out[f"plan_ms_{w * MBS}"] = (_median(ms), max(ms))
    return out


def large(repeats: int, seed: int) -> list[list[str]]:
    """plan_step against balance_modules at 4096 samples, W 8, 512 groups (64 a micro-batch): each
    call timed back to back with the other on the same input; min (the code's cost with a core to
    itself) and median (with the neighbours' load)."""
    rng = np.random.default_rng(seed)
    out = []
    for dps in ({"vision": 64, "language": 64}, {"vision": 64, "language": 32}, {"vision": 32, "language": 64}):
        plan_ms, today_ms, gain = [], [], []
        for r in range(repeats + 1):
            costs = {"vision": rng.lognormal(0, 0.8, 4096) * 2, "language": rng.lognormal(0, 0.6, 4096)}
            t0 = time.perf_counter()
            today = balance_modules(costs, dps, 8)
            t1 = time.perf_counter()
            planned = plan_step(costs, dps, 8)
            t2 = time.perf_counter()
            if r:  # the first call builds the layout's step model (cached): left out
                today_ms.append((t1 - t0) * 1e3)
                plan_ms.append((t2 - t1) * 1e3)
                gain.append(step_time(costs, dps, planned, 8) / step_time(costs, dps, today, 8))
        out.append([f"{dps['vision']} -> {dps['language']}", f"{min(today_ms):.1f} / {_median(today_ms):.1f}",
                    f"{min(plan_ms):.1f} / {_median(plan_ms):.1f}", f"{min(plan_ms) / min(today_ms):.2f}x",
                    f"{_median(p / t for p, t in zip(plan_ms, today_ms)):.2f}x", f"{_median(gain):.3f}"])
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=3, help="steps per configuration")
    p.add_argument("--micro-batches", default="16,32", help="W: micro-batches a step (gbs / mbs)")
    p.add_argument("--ratios", default="0.25,0.5,1,2", help="encoder stage over the language per-stage time")
    p.add_argument("--workloads", default="receipts,documents,mixed_chat")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--large-repeats", type=int, default=9, help="timed calls per layout at 4096 samples")
    p.add_argument("--no-large", action="store_true", help="skip the 4096-sample timing")
    args = p.parse_args(argv)
    print(f"machine: {machine()}")
    plan_step({"images": np.arange(1.0, 5.0), "language": np.ones(4)}, DPS, 2, stages=STAGES)  # imports out of timings
    rows = run(args.workloads.split(","), [int(w) for w in args.micro_batches.split(",")],
               [float(r) for r in args.ratios.split(",")], args.steps, args.seed)
    out = report(rows)
    print(f"median step over the original's, every configuration and step: reorder_buffer {out['reorder_buffer']:.3f}, "
          f"mimo_accel {out['mimo_accel']:.3f}, local search {out['local']:.3f}; mimo_accel over local search "
          f"{out['mimo_vs_local']:.3f}")
    for key in sorted(k for k in out if k.startswith("plan_ms_")):
        print(f"mimo_accel plan time at {key.removeprefix('plan_ms_')} samples: median {out[key][0]:.0f} ms, "
              f"max {out[key][1]:.0f} ms")
    print(f"gate: mimo_accel median {1 - out['mimo_accel']:.1%} below the original (>= 15 %): "
          f"{'ok' if out['mimo_accel'] <= 0.85 else 'MISSED'}; within {out['mimo_vs_local'] - 1:+.1%} of the local "
          f"search (<= 3 %): {'ok' if out['mimo_vs_local'] <= 1.03 else 'MISSED'}")
    if "plan_ms_64" in out:
        print(f"gate: a 64-sample plan within 0.5 s: {'ok' if out['plan_ms_64'][1] <= 500 else 'MISSED'} "
              f"(max {out['plan_ms_64'][1]:.0f} ms)")
    if not args.no_large:
        big = large(args.large_repeats, args.seed)
        _print_table("4096 samples, W 8, 512 groups: plan time (ms, min / median) and step",
                     ["vision -> language DP", "balance_modules", "plan_step", "plan_step / balance_modules (min)",
                      "(median of pairs)", "step: plan_step / balance_modules"], big)
        worst = max(float(r[3].rstrip("x")) for r in big)
        print(f"gate: plan_step within 2x of balance_modules' time (min): {'ok' if worst <= 2 else 'MISSED'} "
              f"(worst {worst:.2f}x)")
    print(f"machine at the end: {machine()}")


if __name__ == "__main__":
    main()
