#!/usr/bin/env python3
"""What telling a dataset apart costs at 1 M rows: the digest of every row's cost inputs (the derive
cache's key, and the dataset fingerprint an index file records), beside what the key hashed before
(4,096 evenly spaced rows) and what every job start already reads (each file's head: the contents
digest).

A Bridge MegatronMIMODataset of ``--rows`` rows, as a list of dicts and as an HF
``datasets.Dataset`` (read from its arrow table, nothing decoded): 80 % of the rows name one image
(a pool of ``--files`` real PNG and JPEG files, each named by many rows), every row a text of 20-200
words. Timed on one thread, warm page cache, best of ``--repeat``:

- every row's cost inputs hashed (``SampleSource.rows_digest``): what the key follows now;
- 4,096 sampled rows hashed: what it followed before;
- ``SampleSource.read_inputs``: the files' heads, the texts and the rows, all that ``identify`` reads
  of a rank's share at every job start (each rank reads 1/``--ranks`` of it); beside it the same
  pass with the texts' and rows' digests stubbed out: the files' heads alone, what a start read
  before.

    python benchmarks/bench_identity.py [--rows 1000000] [--files 1000] [--ranks 8] [--repeat 2]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _best(fn, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def _examples(root: Path, rows: int, files: int) -> list[dict]:
    from PIL import Image

    rng = random.Random(0)
    pool = []
    for i in range(files):
        path = root / (f"{i}.png" if i % 2 else f"{i}.jpg")
        Image.new("RGB", (rng.randint(32, 640), rng.randint(32, 640)), (i % 255, 60, 120)).save(path)
        pool.append(str(path))
    words = ["".join(rng.choice("etaoinshrdlcumwfgyp") for _ in range(rng.randint(2, 9))) for _ in range(5000)]
    texts = [" ".join(rng.choices(words, k=rng.randint(20, 200))) for _ in range(1000)]
    return [{"image": pool[i % files] if i % 5 else None, "text": texts[(i * 7) % len(texts)]} for i in range(rows)]


@contextlib.contextmanager
def _digests_stubbed():
    """``read_inputs`` with the texts' and rows' digests doing nothing: the files' heads alone."""
    from mimo_accel.costs.contents import SampleDigest
    from mimo_accel.datasets import sources

    add, canonical = SampleDigest.add, sources.canonical_bytes
    SampleDigest.add, sources.canonical_bytes = (lambda self, sample, payload: None), (lambda inputs: b"")
    try:
        yield
    finally:
        SampleDigest.add, sources.canonical_bytes = add, canonical


def main(argv=None) -> int:
    from mimo_accel_dev.rehearse import cpu

    cpu.prepare_imports()  # Bridge's dataset imports megatron.bridge
    import datasets
    from megatron.bridge.data.megatron_mimo.dataset import MegatronMIMODataset
    from rich.console import Console
    from rich.table import Table
    from transformers import Qwen2VLImageProcessorPil

    from mimo_accel.costs.contents import SampleDigest
    from mimo_accel.datasets import MimoDatasetSource
    from mimo_accel.datasets.fingerprints import canonical_bytes, relocatable
    from mimo_accel_dev.rehearse.stack import offline_tokenizer

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--files", type=int, default=1000, help="distinct image files the rows name")
    p.add_argument("--ranks", type=int, default=8, help="data ranks sharing the reads")
    p.add_argument("--repeat", type=int, default=2)
    args = p.parse_args(argv)
    console = Console(width=160)
    console.print(f"machine: {platform.node()}, {os.cpu_count()} cores, {platform.processor() or platform.machine()}, "
                  f"load {os.getloadavg()[0]:.1f}")
    with tempfile.TemporaryDirectory(prefix="mimo-bench-identity-") as tmp:
        examples = _examples(Path(tmp), args.rows, args.files)
        table = Table(title=f"a dataset's identity at {args.rows:,} rows, one thread (s; per rank at {args.ranks} "
                            "ranks)", title_justify="left")
        for col in ("examples", "key before: 4,096 rows", "every row's inputs alone", "per row",
                    "each start before: files' heads", "each start now: + texts + rows", "now / before",
                    f"now, per rank at {args.ranks}"):
            table.add_column(col, justify="left" if col == "examples" else "right")
        as_hf = datasets.Dataset.from_list(examples)
        for name, rows in (("list of dicts", examples), ("HF datasets.Dataset (arrow)", as_hf)):
            ds = MegatronMIMODataset(examples=rows, processors={"vision": Qwen2VLImageProcessorPil()},
                                     tokenizer=offline_tokenizer(), seq_length=4096, special_token_ids={"vision": 5},
                                     encoder_seq_lengths={"vision": 1}, modality_columns={"vision": "image"})
            source = MimoDatasetSource(ds)
            n = source.base_length
            step = max(1, n // 4096)

            def sampled():
                digest = SampleDigest()
                for i in range(0, n, step):
                    digest.add(i, canonical_bytes({"image": relocatable(examples[i]["image"]),
                                                   "text": examples[i]["text"]}))

            every = _best(lambda: source.rows_digest(0, n), args.repeat)
            before = _best(sampled, args.repeat)
            whole = _best(lambda: source.read_inputs(0, n, workers=1), args.repeat)
            inputs = source.read_inputs(0, n, workers=1)
            assert inputs.rows.samples == n and inputs.contents.files == sum(1 for e in examples if e["image"])
            with _digests_stubbed():
                heads = _best(lambda: source.read_inputs(0, n, workers=1), args.repeat)
            table.add_row(name, f"{before:.3f}", f"{every:.2f}", f"{every / n * 1e6:.1f} µs", f"{heads:.2f}",
                          f"{whole:.2f}", f"{whole / heads:.2f}x", f"{whole / args.ranks:.2f}")
        console.print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
