#!/usr/bin/env python3
"""What gathering the TensorBoard/W&B figures costs the writing rank per logged iteration
(mimo_accel.runtime.metrics): a real TCPStore on loopback, every other rank's step figures already
set (as they are when the last of them arrives), then the writing rank's wait + multi_get + the
scalars. Each rank's own part is one set, and one check + get + delete of its earlier key.

    python benchmarks/bench_metrics.py [--ranks 8,64,512,4096] [--repeat 5]
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import time

import torch.distributed as dist

from mimo_accel.runtime.metrics import Metrics, rank_figures


class _State:
    """Bridge's GlobalState as the writing rank sees it, writing nowhere (only the gather is timed)."""

    class cfg:  # noqa: N801
        class logger:  # noqa: N801
            log_interval = 1

    class train_state:  # noqa: N801
        step = 0

    tensorboard_logger = None
    wandb_logger = None


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", default="8,64,512,4096", help="world sizes, comma-separated")
    p.add_argument("--repeat", type=int, default=5)
    args = p.parse_args(argv)
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                           timeout=datetime.timedelta(seconds=60))
    client = dist.TCPStore("127.0.0.1", server.port, is_master=False, timeout=datetime.timedelta(seconds=60))
    header = {"rank": 0, "module": "vision", "dp_rank": 0}
    record = {"vision_fwd_s": 0.1, "vision_bwd_s": 0.2, "samples_read": 4, "bytes_read": 10**6,
              "bytes_exchanged": 0, "tokens": 0, "predicted_spreads": {"vision": 1.01, "language": 1.02}}
    print("ranks  writer's gather per logged iteration (median)  bytes per rank")
    for world in (int(w) for w in args.ranks.split(",")):
        writer = Metrics(_State(), rank=world - 1, world=world, store=client)
        times = []
        for it in range(args.repeat):
            _State.train_state.step = it
            for r in range(world - 1):
                fig = dict(header, rank=r, dp_rank=r % 8, module="vision" if r < world // 2 else "language")
                server.set(writer._key(it + 1, r), json.dumps(rank_figures(fig, record)))
            t = time.perf_counter()
            writer.after_step(dict(header, rank=world - 1, module="language"), record)
            times.append(time.perf_counter() - t)
        size = len(json.dumps(rank_figures(header, record)))
        print(f"{world:>5}  {statistics.median(times) * 1e3:8.1f} ms{'':32}{size}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
