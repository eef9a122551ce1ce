#!/usr/bin/env python3
"""What planning costs the training thread (mimo_accel.runtime.reading.plan_ahead).

One data rank's sharded sampler over Megatron Bridge's own ``MegatronPretrainingSampler``, at
4096 samples per global micro-batch on a canonical grid of 512 groups, ``reorder_window`` 8 (a
window is 8 micro-batches, 32,768 samples, planned together), for three layouts: 1:1 (vision 512,
language 512), fan-in (vision 512, language 256) and three modules (vision 512, audio 256,
language 128); the costs are bench_balance's ``receipts`` workload (one tall receipt photo, OCR
text, voice clips on half the samples) in a cost index, priced by the default cost model.

Between windows the training thread runs a fixed amount of busy Python work (about 0.6 s alone on
this machine), standing for a step's kernel launches. Per window it records the time spent inside
``next()`` for the window's 8 micro-batches, and the time the busy work took over the time of a
tenth of it run just before taking the window, while the planner was idle (its queue full): the
speed of the moment of this shared VM divides out. Side by side in one run, on the same
micro-batches:

* ``no planner``: the sampler without reorder (what a step pays without planning);
* ``ahead, process``: plans made ahead, the arithmetic in a forked child (the default);
* ``ahead, thread``: plans made ahead, the arithmetic on the planner thread (the GIL shared);
* ``serial``: the plan computed inside ``next()`` (what the sampler did before planning ahead).

Printed per layout and mode: ``next()`` per window (median, max over the windows after the
first, whose plan starts when the sampler is built), the busy work's time over its reference
(median) and its slowdown against ``no planner``, the share of the busy work's time its thread
spent off the CPU (waiting for the interpreter lock, or for a CPU: its wall time less its thread
CPU time) and that share's rise against ``no planner``, whether every window's shares equal the
serial plan's, and the planner thread's and child's CPU per window. The gates:
``next()`` at most 2 ms above ``no planner`` (median), the busy work slowed by at most 5 %.

The slowdown has two parts: time the training thread is kept off the CPU (the interpreter lock
the planner thread takes, the scheduler), and slower instructions while on it (another process's
work on the other cores sharing caches, memory and, on a VM, the host). The second is what any
work beside training costs — DataLoader workers decoding images do the same — and
``contention_floor`` shows its size on the machine at hand; the first is what planning in this
process costs, and the off-CPU column measures it apart.

    python benchmarks/bench_plan_ahead.py [--windows 8] [--layouts 1:1,fan-in,three] [--work-s 0.6]
                                          [--samples 4096] [--groups 512]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_balance import AUDIO_ROWS_PER_TOKEN, MODULE_RULE, _voice, gen_receipts, machine  # noqa: E402

from mimo_accel.costs import CostIndex, CostModel  # noqa: E402
from mimo_accel.costs.resize import FixedPatches  # noqa: E402
from mimo_accel.modules import Modules  # noqa: E402
from mimo_accel.planner import CostIndexPlanner  # noqa: E402

WINDOW = 8
LAYOUTS = {  # module DPs on a grid of g groups
    "1:1": lambda g: {"vision": g, "language": g},
    "fan-in": lambda g: {"vision": g, "language": g // 2},
    "three": lambda g: {"vision": g, "audio": g // 2, "language": g // 4},
}
MODES = ("no planner", "ahead, process", "ahead, thread", "serial")


def receipts_index(n: int, seed: int = 0) -> CostIndex:
    rng = np.random.default_rng([seed, 0xA11])
    s = gen_receipts(rng, n)
    clips, rows, sq_rows = _voice(rng, n)
    tokens = s["text"] + s["patches"] // MODULE_RULE.merge_size ** 2 + np.ceil(rows / AUDIO_ROWS_PER_TOKEN).astype(np.int64)
    return CostIndex(tokens, {
        "vision": (s["images"], s["patches"], s["sq_patches"], FixedPatches(1)),
        "audio": (clips, rows, sq_rows, FixedPatches(1)),
    })


def busy(units: int) -> float:
    """Pure-Python work of ``units`` units (the training thread launching kernels); its seconds."""
    t = time.perf_counter()
    x = 0
    for i in range(units):
        x += i * i % 7
    return time.perf_counter() - t


def calibrate(seconds: float) -> int:
    units = 200_000
    while busy(units) < 0.05:
        units *= 2
    return int(units * seconds / busy(units))


class _Serial:
    """The sampler as it planned before: each window inside ``next()``."""

    def __init__(self, sampler_args, planner, ctx):
        from mimo_accel.runtime.reading.sampler import ShareRules

        self.source, self.planner, self.rules = _global_sampler(*sampler_args), planner, ShareRules(ctx, WINDOW)

    def __iter__(self):
        for _, batches, _, _ in self.rules.windows(self.source):
            yield from self.rules.plan(self.planner, batches)[0]


def _global_sampler(n: int, mbs: int):
    from megatron.bridge.data import samplers

    return samplers.MegatronPretrainingSampler(total_samples=n, consumed_samples=0, micro_batch_size=mbs,
                                               data_parallel_rank=0, data_parallel_size=1, drop_last=True)


def run_mode(mode: str, dps: dict, index: CostIndex, windows: int, units: int, mbs: int) -> dict:
    from mimo_accel.runtime.reading.sampler import ShardedBatchSampler
    from mimo_accel.runtime.context import ShardContext

    ctx = ShardContext("vision", 0, dps["vision"], Modules.from_dp_sizes(dps).grid, dps)
    n = windows * WINDOW * mbs
    planner = CostIndexPlanner(index, CostModel(), Modules.from_dp_sizes(dps))
    if mode == "no planner":
        sampler = ShardedBatchSampler(_global_sampler(n, mbs), ctx)
    elif mode == "serial":
        sampler = _Serial((n, mbs), planner, ctx)
    else:
        sampler = ShardedBatchSampler(_global_sampler(n, mbs), ctx, planner, window=WINDOW, in_process=(mode == "ahead, process"))
    it = iter(sampler)
    next_s, work_s, off_cpu, shares, cpu = [], [], [], [], []
    for _ in range(windows):
        # a reference burst first, while the planner is idle (it has planned its queue full), so that
        # the machine's speed of the moment divides out of the work's time
        reference = busy(units // 10) * 10
        t = time.perf_counter()
        window = [next(it) for _ in range(WINDOW)]
        next_s.append(time.perf_counter() - t)
        shares.append([list(w.indices) for w in window])
        cpu.append(_planner_cpu(it))
        on_cpu = time.thread_time()
        took = busy(units)  # planning the window after next meanwhile
        on_cpu = time.thread_time() - on_cpu
        work_s.append(took / reference)
        off_cpu.append((took - on_cpu) / took)  # waiting for the interpreter lock or a CPU
    return {"next_s": next_s, "work_s": work_s, "off_cpu": off_cpu, "shares": shares, "cpu": _per_window(cpu)}


def _planner_cpu(it) -> tuple[float | None, float | None]:
    """CPU seconds so far of the pass's planner thread (in this process: what it can take of the
    interpreter lock) and of its forked child; None for either that is not running."""
    import multiprocessing

    thread = getattr(it, "thread", None)
    thread_s = time.clock_gettime(time.pthread_getcpuclockid(thread.ident)) if thread and thread.is_alive() else None
    child_s = None
    for child in multiprocessing.active_children():
        if child.name == "mimo-accel-planner" and child.is_alive():
            fields = Path(f"/proc/{child.pid}/stat").read_text().rpartition(")")[2].split()
            child_s = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime
    return thread_s, child_s


def _per_window(readings: list) -> tuple[float | None, float | None]:
    """Mean CPU per window planned, from the readings after window 1 while the planner ran (its
    thread ends once the pass's last windows are queued)."""
    out = []
    for j in range(2):
        seen = [(w, r[j]) for w, r in enumerate(readings) if w >= 1 and r[j] is not None]
        out.append((seen[-1][1] - seen[0][1]) / (seen[-1][0] - seen[0][0]) if len(seen) >= 2 else None)
    return tuple(out)


def contention_floor(units: int, repeats: int = 5) -> float:
    """The busy work's time with a numpy process beside it (the machine's other cores, its memory
    and caches shared; no interpreter lock) over its time alone: what any planner beside the
    training thread costs this machine, whatever it shares in Python."""
    import subprocess

    code = ("import numpy as np, time\na = np.random.default_rng(0).random(1 << 20)\nt = time.time()\n"
            "while time.time() - t < 30: np.argsort(a)")
    alone, beside = [], []
    for _ in range(repeats):
        alone.append(busy(units))
        proc = subprocess.Popen([sys.executable, "-c", code])
        try:
            time.sleep(0.3)  # numpy imported, sorting
            beside.append(busy(units))
        finally:
            proc.kill()
            proc.wait()
    return statistics.median(beside) / statistics.median(alone)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--windows", type=int, default=8)
    p.add_argument("--layouts", default=",".join(LAYOUTS))
    p.add_argument("--work-s", type=float, default=0.6, help="the simulated step between windows, alone")
    p.add_argument("--samples", type=int, default=4096, help="samples per global micro-batch")
    p.add_argument("--groups", type=int, default=512, help="the canonical grid (the largest module DP)")
    args = p.parse_args(argv)
    from mimo_accel_dev.rehearse import cpu

    cpu.check_megatron_importable()  # Bridge's samplers (and the 3.11 back-port they need here)
    print(machine())
    units = calibrate(args.work_s)
    index = receipts_index(args.windows * WINDOW * args.samples)
    print(f"{args.samples} samples x window {WINDOW} / {args.groups} groups; {args.windows} windows; busy work "
          f"{units} units (~{args.work_s:.2f} s alone)")
    floor = contention_floor(units)
    print(f"this machine's floor: the busy work beside a numpy process (no planner) takes {floor:.3f}x its time alone")
    print(f"{'layout':<8} {'mode':<16} {'next() per window p50 / max':>28} {'vs none':>9} {'busy / ref p50':>14} "
          f"{'slowdown':>9} {'off CPU p50':>11} {'rise':>7}  same as serial  "
          f"{'planner CPU per window: thread / child':>38}")
    ok = True
    for name in args.layouts.split(","):
        dps = LAYOUTS[name](args.groups)
        results = {mode: run_mode(mode, dps, index, args.windows, units, args.samples) for mode in MODES}
        base_next = statistics.median(results["no planner"]["next_s"][1:])
        base_work = statistics.median(results["no planner"]["work_s"][1:])
        base_off = statistics.median(results["no planner"]["off_cpu"][1:])
        for mode in MODES:
            r = results[mode]
            nxt, work = r["next_s"][1:], statistics.median(r["work_s"][1:])
            same = r["shares"] == results["serial"]["shares"] if mode != "no planner" else None
            over, slow = statistics.median(nxt) - base_next, work / base_work - 1
            off = statistics.median(r["off_cpu"][1:])
            if mode == "ahead, process":
                ok &= over <= 0.002 and slow <= 0.05 and bool(same)
            thread_s, child_s = r["cpu"]
            cpu = " / ".join("-" if c is None else f"{c * 1e3:.1f} ms" for c in (thread_s, child_s))
            print(f"{name:<8} {mode:<16} {statistics.median(nxt) * 1e3:>12.2f} / {max(nxt) * 1e3:>7.2f} ms "
                  f"{over * 1e3:>+7.2f} ms {work:>14.3f} {slow:>+8.1%} {off:>11.2%} {off - base_off:>+7.2%}  "
                  f"{'' if same is None else str(same):<14}  "
                  f"{cpu:>38}")
    print("gates (ahead, process): next() <= 2 ms above no planner, busy work slowed <= 5 %, shares = serial:",
          "met" if ok else "NOT met")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
