#!/usr/bin/env python3
"""What gathering the TensorBoard/W&B figures costs the writing rank's training thread per logged
iteration (mimo_accel.runtime.measuring.metrics), from 8 to 4,096 simulated ranks: a real TCPStore on loopback,
every other rank's step figures already set (as they are when the last of them arrives).

Before: the writing rank's hook waited for the others' keys, read them (`multi_get`), marked the
iteration read and computed the scalars on the training thread (the same work, `Metrics.gather`,
run inline). After: its hook sets its own key and hands the gather to a thread of its own (its own
store connection), collecting the previous logged iteration's first. Between logged iterations
the training thread runs a busy Python loop of ``--step`` seconds, standing for a step's kernel
launches, beside the gather (so a GIL hand-over can land in the hook, as in training). The
gather's own CPU time on its thread bounds the GIL time it can take from the training thread
elsewhere in the step. Each other rank's own part is one set, and one check + get + delete of its
earlier key.

    python benchmarks/bench_metrics.py [--ranks 8,64,512,4096] [--repeat 20] [--step 0.5]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import time

import torch.distributed as dist

from mimo_accel.runtime.measuring.metrics import Metrics, rank_figures


class _State:
    """Bridge's GlobalState as the writing rank sees it, writing nowhere (only the gather is timed)."""

    class cfg:  # noqa: N801
        class logger:  # noqa: N801
            log_interval = 1

    class train_state:  # noqa: N801
        step = 0

    tensorboard_logger = None
    wandb_logger = None


class _Timed(Metrics):
    """Metrics whose gather (on its thread) is timed."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.gather_s: list[float] = []
        self.gather_cpu_s: list[float] = []

    def gather(self, *args, **kwargs):
        t, cpu = time.perf_counter(), time.thread_time()
        try:
            return super().gather(*args, **kwargs)
        finally:
            self.gather_s.append(time.perf_counter() - t)
            self.gather_cpu_s.append(time.thread_time() - cpu)


def _busy(seconds: float) -> int:
    """Python work for ``seconds`` (a training thread launching kernels): the units done."""
    done, end = 0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        for _ in range(200):
            done += 1
    return done


HEADER = {"rank": 0, "module": "vision", "dp_rank": 0}
RECORD = {"vision_fwd_s": 0.1, "vision_bwd_s": 0.2, "samples_read": 4, "bytes_read": 10**6, "bytes_exchanged": 0,
          "tokens": 0, "predicted_spreads": {"vision": 1.01, "language": 1.02}}


def _others_arrive(server, writer: Metrics, world: int, iteration: int) -> None:
    for r in range(world - 1):
        fig = dict(HEADER, rank=r, dp_rank=r % 8, module="vision" if r < world // 2 else "language")
        server.set(writer._key(iteration, r), json.dumps(rank_figures(fig, RECORD)))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", default="8,64,512,4096", help="world sizes, comma-separated")
    p.add_argument("--repeat", type=int, default=20, help="logged iterations per world size")
    p.add_argument("--step", type=float, default=0.5, help="seconds of busy training thread between them")
    args = p.parse_args(argv)
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                           timeout=datetime.timedelta(seconds=60))
    client = dist.TCPStore("127.0.0.1", server.port, is_master=False, timeout=datetime.timedelta(seconds=60))
    print(f"machine: {platform.node()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}; median of "
          f"{args.repeat} logged iterations, {args.step:g} s busy step between them")
    print("ranks  before: training thread (median, max)  after: training thread (median, max)  "
          "after: gather's CPU on its thread  gather's wall  bytes per rank")
    for world in (int(w) for w in args.ranks.split(",")):
        own = dict(HEADER, rank=world - 1, module="language")
        # before: the gather inline, on the training thread
        inline = _Timed(_State(), rank=world - 1, world=world, store=client)
        before = []
        for it in range(args.repeat):
            _others_arrive(server, inline, world, it + 1)
            t = time.perf_counter()
            client.set(inline._key(it + 1, world - 1), json.dumps(rank_figures(own, RECORD)))
            inline.gather(client, it + 1)
            before.append(time.perf_counter() - t)
        # after: the hook as it is, a busy step between logged iterations
        writer = _Timed(_State(), rank=world - 1, world=world, store=client)
        after = []
        for it in range(args.repeat):
            _State.train_state.step = it
            _others_arrive(server, writer, world, it + 1)
            t = time.perf_counter()
            writer.after_step(own, RECORD)
            after.append(time.perf_counter() - t)
            _busy(args.step)
        writer.close()
        assert len(writer.gather_s) == args.repeat  # every logged iteration gathered
        size = len(json.dumps(rank_figures(HEADER, RECORD)))
        print(f"{world:>5}  {statistics.median(before) * 1e3:15.2f} ms, {max(before) * 1e3:7.2f} ms  "
              f"{statistics.median(after) * 1e3:23.2f} ms, {max(after) * 1e3:6.2f} ms  "
              f"{statistics.median(writer.gather_cpu_s) * 1e3:30.1f} ms  {statistics.median(writer.gather_s) * 1e3:10.1f} ms"
              f"  {size:>14}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
