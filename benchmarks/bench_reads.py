"""Samples and bytes read+decoded per rank and cluster-wide, upstream vs sharded reads.

Real gloo ranks, Bridge's own `build_megatron_mimo_data_loaders`, a dataset that counts every
`__getitem__` and the bytes it decodes. Layout: vision dp d -> language dp d (2d ranks).

    .venv/bin/python benchmarks/bench_reads.py [--dp 1,2,4,8] [--steps 4] [--micro-batch 16]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _reads(rank, world, dp, steps, micro_batch, sharded):
    import mimo_accel
    from megatron.bridge.data.megatron_mimo.loaders import build_megatron_mimo_data_loaders

    from mimo_accel_dev.rehearse import stack as st
    from mimo_accel_dev.rehearse.ranks import build_grids, layout_of, loader_config

    if sharded:
        mimo_accel.enable(sharded_reads=True)
    layout = layout_of(dp, dp)
    grids = build_grids(layout)
    provider = st.build_provider(st.StackConfig(layout=layout))
    provider._grids = grids
    counts = {"samples": 0, "bytes": 0}

    class Counting(st.SyntheticVLMDataset):
        def __getitem__(self, idx):
            sample = super().__getitem__(idx)
            counts["samples"] += 1
            counts["bytes"] += sum(v.numel() * v.element_size() for v in sample.values() if hasattr(v, "numel"))
            return sample

    data = st.make_data_provider(lambda n: Counting(n, st.VariedSpec(), seq_length=64, patch_dim=24,
                                                    vocab_size=2048))
    train, _, _ = build_megatron_mimo_data_loaders(
        loader_config(provider, micro_batch),
        SimpleNamespace(consumed_train_samples=0), data, steps * micro_batch, 0, 0)
    it = iter(train)
    for _ in range(steps):
        next(it)
    mimo_accel.disable()
    return counts


def main(argv=None) -> int:
    from rich.console import Console
    from rich.table import Table

    from mimo_accel_dev.rehearse.ranks import run_ranks

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dp", default="1,2,4,8")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--micro-batch", type=int, default=16)
    args = p.parse_args(argv)
    table = Table(title=f"Reads per step (micro-batch {args.micro_batch}, vision dp d -> language dp d)")
    for col in ("dp", "ranks", "upstream per rank", "sharded per rank", "ratio",
                "upstream cluster", "sharded cluster", "upstream cluster KiB", "sharded cluster KiB"):
        table.add_column(col, justify="right")
    for dp in [int(x) for x in args.dp.split(",")]:
        res = {}
        for sharded in (False, True):
            counts = run_ranks(_reads, 2 * dp, dp, args.steps, args.micro_batch, sharded, deadline_s=300)
            res[sharded] = counts
        per = {s: max(c["samples"] for c in res[s]) / args.steps for s in res}
        cluster = {s: sum(c["samples"] for c in res[s]) / args.steps for s in res}
        kib = {s: sum(c["bytes"] for c in res[s]) / args.steps / 1024 for s in res}
        table.add_row(str(dp), str(2 * dp), f"{per[False]:.0f}", f"{per[True]:.0f}", f"1/{per[False] / per[True]:.0f}",
                      f"{cluster[False]:.0f}", f"{cluster[True]:.0f}", f"{kib[False]:.0f}", f"{kib[True]:.0f}")
    Console(width=max(Console().width, 140)).print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
