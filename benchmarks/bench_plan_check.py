#!/usr/bin/env python3
"""What agreeing every window's plan costs (mimo_accel.runtime.reading.plan_check.WindowCheck), from 8 to
4,096 simulated data ranks, on a real TCPStore on loopback.

Per window, the other N-1 ranks' posts (one ``compare_set`` and one ``add`` each) go into the
store first, as they do when the rank measured is the last to arrive; then the measured rank's
whole ``agree()`` is timed: its post, the verdict it writes as the last arrival, the deletion of
the window before, and its wait and read of the verdict: the most store work any rank does for a
window. The store operations per window are counted over all ranks. The check runs on each rank's
planner thread (mimo_accel.runtime.reading.plan_ahead), so none of this is on the training thread's path;
the figure says what it would cost there.

    python benchmarks/bench_plan_check.py [--ranks 8,64,512,4096] [--windows 20]
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import sys
import time
from pathlib import Path

import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mimo_accel.runtime.reading.plan_check import WindowCheck, plan_digest  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", default="8,64,512,4096", help="data ranks, comma-separated")
    p.add_argument("--windows", type=int, default=20)
    args = p.parse_args(argv)
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                           timeout=datetime.timedelta(seconds=60))
    client = dist.TCPStore("127.0.0.1", server.port, is_master=False, timeout=datetime.timedelta(seconds=60))
    others = dist.TCPStore("127.0.0.1", server.port, is_master=False, timeout=datetime.timedelta(seconds=60))
    print("ranks  last rank's agree() per window (median, max)  store ops per window (all ranks)  keys left")
    for serial, n in enumerate(int(w) for w in args.ranks.split(",")):
        ranks = list(range(n))
        measured = WindowCheck(ranks, "bench", me=n - 1, store=client, serial=serial)
        peers = [WindowCheck(ranks, "bench", me=r, store=others, serial=serial) for r in ranks[:-1]]
        times = []
        for w in range(args.windows):
            digest = plan_digest(range(w, w + 8), range(w, w + 8))
            key, before = peers[0]._keys(0, w)
            for peer in peers:  # the others' posts (they then wait for the verdict)
                peer._post(key, digest, before)
            t = time.perf_counter()
            measured.agree(0, w, digest)
            times.append(time.perf_counter() - t)
        ops = 4 * n + 6  # every rank: compare_set, add, wait, get; the last also add, set, 4 deletes
        print(f"{n:>5}  {statistics.median(times) * 1e3:8.3f} ms, {max(times) * 1e3:8.3f} ms{'':19}{ops:>8}"
              f"{'':28}{server.num_keys()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
