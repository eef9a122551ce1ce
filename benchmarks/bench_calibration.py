#!/usr/bin/env python3
"""What online calibration costs the training thread (mimo_accel.runtime.measuring.calibration).

The writing (fitting) rank's optimizer-step hook, as in a job of N ranks on a real TCPStore on
loopback: before each step the other N-1 ranks' step figures are in the store (as when the last of
them arrives), each vision and language replica's time a known cost of what it computed, so that
refits are accepted; then the writing rank's ``Metrics.after_step`` is timed on the training
thread (it sets its figures and hands the gather, the fit and any announcement to its own thread),
followed by a fixed amount of busy Python work standing for the step's kernel launches, whose time
is compared with the same run without calibration. Counted: the store values an announcement
writes per refit.

    python benchmarks/bench_calibration.py [--ranks 8,64,512] [--steps 40] [--work-s 0.2]
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_metrics import _State  # noqa: E402  (Bridge's GlobalState as the writing rank sees it)
from bench_plan_ahead import busy, calibrate  # noqa: E402

from mimo_accel.costs import CostModel  # noqa: E402
from mimo_accel.runtime.measuring.calibration import Calibration  # noqa: E402
from mimo_accel.runtime.measuring.metrics import Metrics, rank_figures  # noqa: E402

TRUE = {"vision": np.array([2e-5, 1e-9, 5e-3]), "language": np.array([1e-5, 5e-7])}


def _figures(rng, world: int) -> list[tuple[dict, dict]]:
    """One step's (header, record) of every rank: half vision replicas, half language replicas."""
    out = []
    for r in range(world):
        vision = r < world // 2
        module, dp = ("vision", r) if vision else ("language", r - world // 2)
        if vision:
            items, rows = int(rng.integers(1, 6)), int(rng.integers(200, 3000))
            features = {"vision_items": items, "vision_rows": rows, "vision_sq_rows": rows * rows // items}
            x = np.array([rows, rows * rows // items, items])
        else:
            tokens = int(rng.integers(200, 1500))
            features = {"tokens": tokens, "sq_tokens": tokens * tokens}
            x = np.array([tokens, tokens * tokens])
        t = float(x @ TRUE[module]) + 0.01
        record = {f"{module}_fwd_s": t / 3, f"{module}_bwd_s": 2 * t / 3, "samples_read": 4, **features}
        out.append(({"rank": r, "module": module, "dp_rank": dp}, record))
    return out


def run(world: int, steps: int, units: int, calibrating: bool, store, prefix: int) -> dict:
    rng = np.random.default_rng(world)
    calibration = Calibration(CostModel(), prefix) if calibrating else None
    _State.train_state.step = 0
    writer = Metrics(_State(), rank=world - 1, world=world, store=store, calibration=calibration, writes=True,
                     lead=4)
    writer.run = 10_000 + prefix  # keys of their own
    hook, work = [], []
    for step in range(steps):
        _State.train_state.step = step
        figures = _figures(rng, world)
        for r, (header, record) in enumerate(figures[:-1]):
            store.set(writer._key(step + 1, r), json.dumps(rank_figures(header, record)))
        t = time.perf_counter()
        writer.after_step(*figures[-1])
        hook.append(time.perf_counter() - t)
        work.append(busy(units))
    writer.close()
    announced = len(calibration.schedule.announcements) if calibration else 0
    keys = sum(1 for k in range(1, announced + 1) if store.check([f"{calibration.prefix}/{k}"])) if calibration else 0
    return {"hook": hook[2:], "work": work[2:], "announced": announced, "keys": keys,
            "refits": len(calibration.fitter.refits) if calibration and calibration.fitter else 0}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", default="8,64,512")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--work-s", type=float, default=0.2, help="the busy work per step, alone")
    args = p.parse_args(argv)
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                           timeout=datetime.timedelta(seconds=60))
    client = dist.TCPStore("127.0.0.1", server.port, is_master=False, timeout=datetime.timedelta(seconds=60))
    units = calibrate(args.work_s)
    print(f"busy work {units} units (~{args.work_s:.2f} s alone) per step, {args.steps} steps")
    print(f"{'ranks':>5}  {'hook, training thread (mean / p50 / max)':>44}  {'busy work vs off':>17}  "
          "refits  announcements  store values each")
    for n, world in enumerate(int(w) for w in args.ranks.split(",")):
        off = run(world, args.steps, units, False, client, 2 * n)
        on = run(world, args.steps, units, True, client, 2 * n + 1)
        h = on["hook"]
        slow = statistics.median(on["work"]) / statistics.median(off["work"]) - 1
        per = on["keys"] / on["announced"] if on["announced"] else 0
        print(f"{world:>5}  {statistics.mean(h) * 1e3:>12.3f} / {statistics.median(h) * 1e3:7.3f} / "
              f"{max(h) * 1e3:7.3f} ms (off: {statistics.mean(off['hook']) * 1e3:.3f})  {slow:>+16.1%}  "
              f"{on['refits']:>6}  {on['announced']:>13}  {per:>17.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
