"""Benchmark of THD packing of MegatronMIMO language shards.

For a few synthetic sequence-length distributions it reports, per language micro-batch (shard)
of ``B`` samples:

* ``B*S``: tokens the LM computes unpacked (Bridge's MIMO dataset pads every sample to
  ``seq_length``, so ``S = seq_length``), and ``B*max``: what a collate padding to the longest
  sample of the micro-batch would compute;
* ``T``: tokens after packing, tight (``k=1``) and aligned for CP=2 + SP/TP=4
  (``pad_multiple=4``, ``tp_size=8``);
* the padding fraction before, the share of LM token compute removed, the attention-score
  ratio ``sum(padded_i^2) / (B*S^2)``;
* the median wall time of one ``pack_language_shard`` call (all tensors of the shard, MRoPE
  positions where the distribution has them).

    python benchmarks/bench_packing.py [--batch 8] [--steps 200] [--device cpu|cuda] [--threads 1]

The last rows are the shipped workload profiles (mimo_accel/workloads/*.toml).

Pack times include deriving the lengths from attention_mask (one device -> host copy).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mimo_accel.packing import pack_language_shard, pack_layout  # noqa: E402

ALIGNED = {"pad_multiple": 4, "tp_size": 8}  # cp=2 -> 2*cp; SP: tp*cp = 4*2


@dataclass(frozen=True)
class Workload:
    name: str
    seq_length: int
    mrope: bool
    draw: Callable[[np.random.Generator, int], np.ndarray]  # (rng, B) -> lengths


def _receipts(rng: np.random.Generator, b: int) -> np.ndarray:
    # one receipt image (300-1000 placeholder tokens after patch merge) + short text
    image = rng.integers(300, 1001, size=b)
    text = np.clip(rng.lognormal(np.log(80), 0.6, size=b), 8, 600).astype(int)
    return image + text


def _mixed_chat(rng: np.random.Generator, b: int) -> np.ndarray:
    # long-tailed chat turns; 30% carry an image of 256-1024 tokens
    text = rng.lognormal(np.log(350), 1.0, size=b).astype(int)
    image = np.where(rng.random(b) < 0.3, rng.integers(256, 1025, size=b), 0)
    return np.clip(text + image, 16, 4096)


def _long_docs(rng: np.random.Generator, b: int) -> np.ndarray:
    # nearly full sequences: packing has little to remove, alignment shows its cost
    return rng.integers(3000, 4097, size=b)


WORKLOADS = [
    Workload("receipts (MRoPE)", 2048, True, _receipts),
    Workload("mixed chat", 4096, False, _mixed_chat),
    Workload("long docs", 4096, False, _long_docs),
]


def _profile_workloads() -> list[Workload]:
    """The shipped workload profiles (mimo_accel.workloads): real tokens per sample (image tokens after
    the model's resize rule + text), padded to the profile's seq_length."""
    from mimo_accel.workloads import list_profiles, load_profile

    out = []
    for name in sorted(list_profiles()):
        prof = load_profile(name)

        def draw(rng: np.random.Generator, b: int, prof=prof) -> np.ndarray:
            return prof.sample_table(b, int(rng.integers(1 << 31))).tokens.astype(np.int64)

        out.append(Workload(f"profile {name}", prof.seq_length, True, draw))
    return out


def make_shard(lengths: np.ndarray, seq_len: int, mrope: bool, device: str) -> dict:
    b = len(lengths)
    real = torch.arange(seq_len)[None, :] < torch.as_tensor(lengths)[:, None]
    ids = torch.randint(1, 32000, (b, seq_len)) * real
    pos = torch.arange(seq_len)[None, :].expand(b, -1) * real
    if mrope:
        pos = pos[None].expand(3, -1, -1)
    batch = {
        "input_ids": ids,
        "labels": torch.where(real, torch.roll(ids, -1, 1), -100),
        "loss_mask": real.float(),
        "attention_mask": real.long(),
        "position_ids": pos.contiguous(),
    }
    return {k: v.to(device) for k, v in batch.items()}


def time_pack(shards: list[dict], device: str, **kwargs) -> float:
    """Median microseconds per call."""
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    for shard in shards[:5]:  # warm-up
        pack_language_shard(shard, **kwargs)
    times = []
    for shard in shards:
        sync()
        t0 = time.perf_counter_ns()
        pack_language_shard(shard, **kwargs)
        sync()
        times.append(time.perf_counter_ns() - t0)
    return statistics.median(times) / 1e3


def run(batch: int, steps: int, device: str, seed: int) -> list[dict]:
    rows = []
    for w in WORKLOADS + _profile_workloads():
        rng = np.random.default_rng(seed)
        draws = [w.draw(rng, batch) for _ in range(steps)]
        tight = [pack_layout(d, w.seq_length) for d in draws]
        aligned = [pack_layout(d, w.seq_length, **ALIGNED) for d in draws]
        before = batch * w.seq_length
        dyn = statistics.mean(batch * int(d.max()) for d in draws)
        t1 = statistics.mean(p.total for p in tight)
        t4 = statistics.mean(p.total for p in aligned)
        real = statistics.mean(p.stats.real_tokens for p in tight)
        attn = statistics.mean(
            sum((b - a) ** 2 for a, b in zip(p.cu_seqlens_padded, p.cu_seqlens_padded[1:]))
            for p in aligned
        ) / (batch * w.seq_length**2)
        shards = [make_shard(d, w.seq_length, w.mrope, device) for d in draws[: min(steps, 100)]]
        rows.append(
            {
                "workload": w.name,
                "S": w.seq_length,
                "mean len": real / batch,
                "B*S": before,
                "B*max": dyn,
                "T k=1": t1,
                "T aligned": t4,
                "pad before": 1 - real / before,
                "saved k=1": 1 - t1 / before,
                "saved aligned": 1 - t4 / before,
                "align pad": statistics.mean(p.stats.padding_fraction_after for p in aligned),
                "attn ratio": attn,
                "pack us k=1": time_pack(shards, device),
                "pack us aligned": time_pack(shards, device, **ALIGNED),
            }
        )
    return rows


def print_table(rows: list[dict], batch: int, device: str) -> None:
    cols = list(rows[0])
    fmt = {
        "workload": "{:<20}", "S": "{:>5}", "mean len": "{:>8.0f}", "B*S": "{:>6}",
        "B*max": "{:>6.0f}", "T k=1": "{:>6.0f}", "T aligned": "{:>9.0f}",
        "pad before": "{:>10.1%}", "saved k=1": "{:>9.1%}", "saved aligned": "{:>13.1%}",
        "align pad": "{:>9.2%}", "attn ratio": "{:>10.3f}", "pack us k=1": "{:>11.0f}",
        "pack us aligned": "{:>15.0f}",
    }
    width = {c: len(fmt[c].format(rows[0][c])) for c in cols}
    print(f"THD packing, B={batch} samples per language shard, device={device} "
          f"({torch.get_num_threads()} CPU threads), "
          f"aligned = pad_multiple={ALIGNED['pad_multiple']}, tp_size={ALIGNED['tp_size']}")
    print("  ".join(c.rjust(max(width[c], len(c))) for c in cols))
    for r in rows:
        print("  ".join(fmt[c].format(r[c]).rjust(max(width[c], len(c))) for c in cols))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--batch", type=int, default=8, help="samples per language shard (B)")
    ap.add_argument("--steps", type=int, default=200, help="micro-batches drawn per workload")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1,
                    help="torch CPU threads (1: stable timings on a shared machine)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    print_table(run(args.batch, args.steps, args.device, args.seed), args.batch, args.device)


if __name__ == "__main__":
    main()
