"""The cost index: deriving it (header reads, the whole probe), building it from a manifest, and
loading it at 100 M samples.

``probe`` (the default part) writes real JPEG (plain and with a 24 KB EXIF block before the frame
header, as camera files have), and PNG files with Pillow, then times on one thread:
  - mimo_accel's header reader (`image_size_from_header`), per format;
  - Pillow's lazy `Image.open(...).size`, for comparison;
  - the whole per-sample probe a training rank runs (`MimoDatasetSource` over a real
    MegatronMIMODataset: header, Qwen2-VL resize rule, tokenizing the text with a trained BPE
    tokenizer), serial.
From the whole-probe rate it extrapolates the time to index 1M samples on 64 ranks (each rank
probes 1/64 of them in parallel; one all_gather of 4 int64 per sample follows).

``manifest``: `mimo-accel index` over a manifest of real image files, with 1, 2, 4 and 8
header-reading threads and the thread pool's own default size (best of 3, warm page cache); what
the files' contents digest adds to it (beside the same run with the digest stubbed out) and what
``--verify``'s decoding costs; and the peak memory of indexing manifests of growing length (image
sizes given, no files), in a fresh process each.

``mapped``: a synthetic index of ``--mapped`` samples written under /tmp (deleted after): its load
time (`CostIndex.load` + the digest the loaders compare), then ``--procs`` processes on this node
each loading it and pricing ``--batches`` micro-batches of ``--batch`` samples (the same on every
rank, as every data rank prices the whole global micro-batch), with each process's memory growth
from /proc (RSS, its anonymous and file parts, PSS), for format v4 (packed columns) and, beside
it, the same index in format v3 (byte-aligned narrow columns, also mapped). Before both: the
format-v2 file of ``--before`` samples loaded as the loader did before format v3 (`np.load`, every
column copied to int64, the SHA-256 of the int64 columns), extrapolated to ``--mapped`` samples.

    .venv/bin/python benchmarks/bench_index.py [--files 2000] [--samples 4000] [--ranks 64]
    .venv/bin/python benchmarks/bench_index.py --parts manifest [--manifest-files 4000]
    .venv/bin/python benchmarks/bench_index.py --parts mapped [--mapped 100000000 --before 10000000 --procs 8]

Files are read warm from the page cache of a local disk; a cold network file system adds its
open latency per file, which the probe's per-rank thread pool (`workers`) overlaps.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
# Per-core figures: the HF fast tokenizer would otherwise spread a batch over every core.
os.environ["TOKENIZERS_PARALLELISM"] = "false"


def _write_images(root: Path, n: int, seed: int = 0) -> dict[str, list[Path]]:
    from PIL import Image

    rng = random.Random(seed)
    exif = Image.Exif()
    exif[0x010E] = "x" * 24_000  # ImageDescription: a large APP1 segment before the frame header
    exif_bytes = exif.tobytes()
    files: dict[str, list[Path]] = {"jpeg": [], "jpeg+exif": [], "png": []}
    for i in range(n):
        w, h = rng.randint(32, 320), rng.randint(32, 320)
        img = Image.new("RGB", (w, h), (i % 255, 80, 160))
        for kind, ext, kwargs in (("jpeg", "jpg", {}), ("jpeg+exif", "jpg", {"exif": exif_bytes}), ("png", "png", {})):
            path = root / f"{kind.replace('+', '_')}_{i}.{ext}"
            img.save(path, **kwargs)
            files[kind].append(path)
    return files


def _rate(fn, items, repeat: int = 3) -> float:
    """Best-of-``repeat`` items per second of ``fn`` over ``items``, on this thread."""
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        for x in items:
            fn(x)
        best = min(best, time.perf_counter() - t)
    return len(items) / best


def _bpe_tokenizer(texts):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel()
    tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=8000, special_tokens=["[PAD]", "[UNK]"]))
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]")


def _vocabulary(rng: random.Random, size: int = 5000) -> tuple[list[str], list[float]]:
    """Made-up words with Zipf frequencies, like a language (repeated words hit the BPE cache)."""
    letters = "etaoinshrdlcumwfgypbvkjxqz"
    words = ["".join(rng.choice(letters) for _ in range(rng.randint(2, 9))) for _ in range(size)]
    return words, [1.0 / (rank + 1) for rank in range(size)]


def _words(rng: random.Random, vocabulary: tuple[list[str], list[float]], n: int) -> str:
    return " ".join(rng.choices(vocabulary[0], weights=vocabulary[1], k=n))


def main(argv=None) -> int:
    from rich.console import Console

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--parts", default="probe", help="comma-separated: probe, manifest, mapped (default probe)")
    p.add_argument("--files", type=int, default=2000, help="probe: files written per format")
    p.add_argument("--samples", type=int, default=4000, help="probe: samples in the whole-probe run")
    p.add_argument("--ranks", type=int, default=64, help="probe: ranks probing in parallel")
    p.add_argument("--total", type=int, default=1_000_000, help="probe: samples to extrapolate to")
    p.add_argument("--manifest-files", type=int, default=4000, help="manifest: image files (one per line)")
    p.add_argument("--manifest-lines", default="1000000,2000000,4000000",
                   help="manifest: lengths of the manifests whose peak memory is measured")
    p.add_argument("--mapped", type=int, default=100_000_000, help="mapped: samples of the synthetic index")
    p.add_argument("--before", type=int, default=10_000_000, help="mapped: samples of the format-v2 file")
    p.add_argument("--procs", type=int, default=8, help="mapped: processes sharing the index on this node")
    p.add_argument("--batches", type=int, default=4, help="mapped: micro-batches each process prices")
    p.add_argument("--batch", type=int, default=4096, help="mapped: samples per micro-batch")
    args = p.parse_args(argv)
    parts = args.parts.split(",")
    unknown = sorted(set(parts) - {"probe", "manifest", "mapped"})
    if unknown:
        p.error(f"unknown --parts {unknown}: probe, manifest, mapped")
    console = Console(width=160)  # the tables on one line each, in a log too
    console.print(f"machine: {platform.node()}, {os.cpu_count()} cores, {_total_memory_gb():.0f} GB, "
                  f"{platform.processor() or platform.machine()}, load {os.getloadavg()[0]:.1f}")
    for part in parts:
        {"probe": _probe, "manifest": _manifest, "mapped": _mapped}[part](args, console)
    return 0


def _total_memory_gb() -> float:
    with open("/proc/meminfo") as f:
        return int(f.readline().split()[1]) / 2**20


def _probe(args, console) -> None:
    from mimo_accel_dev.rehearse import cpu

    cpu.prepare_imports()  # Bridge's dataset imports megatron.bridge
    from PIL import Image
    from rich.table import Table
    from transformers import Qwen2VLImageProcessorPil
    from megatron.bridge.data.megatron_mimo.dataset import MegatronMIMODataset

    from mimo_accel.costs import image_size_from_header
    from mimo_accel.datasets import MimoDatasetSource

    with tempfile.TemporaryDirectory(prefix="mimo-bench-index-") as tmp:
        root = Path(tmp)
        t = time.perf_counter()
        files = _write_images(root, args.files)
        console.print(f"wrote {3 * args.files:,} files in {time.perf_counter() - t:.1f} s")

        table = Table(title="headers probed per second, one core (warm page cache)", title_justify="left")
        for col in ("format", "mimo_accel header reader", "Pillow Image.open().size", "mean file size"):
            table.add_column(col, justify="right" if col != "format" else "left")
        rates = {}
        for kind, paths in files.items():
            for path in paths[:50]:  # the two readers must agree
                with Image.open(path) as im:
                    assert image_size_from_header(path) == (im.size[1], im.size[0]), path
            ours = _rate(image_size_from_header, paths)

            def pil(path):
                with Image.open(path) as im:
                    return im.size

            theirs = _rate(pil, paths)
            rates[kind] = ours
            size = sum(f.stat().st_size for f in paths) / len(paths)
            table.add_row(kind, f"{ours:,.0f}/s", f"{theirs:,.0f}/s", f"{size / 1024:.1f} KB")
        console.print(table)

        # The whole per-sample probe: a MegatronMIMODataset with one image per sample (a mix of the
        # three kinds), texts of 20-200 words, a BPE tokenizer, Qwen2-VL's resize rule; serial.
        rng = random.Random(1)
        vocabulary = _vocabulary(rng)
        texts = [_words(rng, vocabulary, rng.randint(20, 200)) for _ in range(args.samples)]
        tokenizer = _bpe_tokenizer(texts[:1000])
        pool = [f for kind in files for f in files[kind]]
        examples = [{"image": str(pool[i % len(pool)]), "text": texts[i]} for i in range(args.samples)]
        ds = MegatronMIMODataset(examples=examples, processors={"vision": Qwen2VLImageProcessorPil()},
                                 tokenizer=tokenizer, seq_length=4096, special_token_ids={"vision": 5},
                                 encoder_seq_lengths={"vision": 1}, modality_columns={"vision": "image"})
        source = MimoDatasetSource(ds)
        t = time.perf_counter()
        source.fingerprint()
        fingerprint_s = time.perf_counter() - t
        best = float("inf")
        for _ in range(3):
            t = time.perf_counter()
            probed = source.probe(0, len(ds), workers=1)
            best = min(best, time.perf_counter() - t)
        assert len(probed) == len(ds) and (probed.encoders["vision"][0] == 1).all()  # one image each
        per_core = len(ds) / best
        pooled = float("inf")
        for _ in range(3):  # the probe's default: a thread pool for a chunk of many files
            t = time.perf_counter()
            source.probe(0, len(ds))
            pooled = min(pooled, time.perf_counter() - t)
        t = time.perf_counter()
        tokens = tokenizer(texts, truncation=True, max_length=4096, return_attention_mask=False)["input_ids"]
        tokenize_s = time.perf_counter() - t
        mean_tokens = sum(map(len, tokens)) / len(tokens)

        per_rank = -(-args.total // args.ranks)
        probe_s = per_rank / per_core
        fingerprint_s *= per_rank / len(ds)  # every row of a rank's share (benchmarks/bench_identity.py)
        gather_mb = args.total * 4 * 8 / 2**20
        total_s = probe_s + fingerprint_s
        summary = Table(title=f"deriving the index of {args.total:,} samples on {args.ranks} ranks",
                        show_header=False, title_justify="left")
        summary.add_column("what", style="bold")
        summary.add_column("value")
        summary.add_row("whole probe (header + resize rule + tokens), one core", f"{per_core:,.0f} samples/s")
        summary.add_row("  with the probe's default thread pool", f"{len(ds) / pooled:,.0f} samples/s "
                                                                  f"({best / pooled:.2f}x serial)")
        summary.add_row("  of which tokenizing", f"{tokenize_s / best:.0%} ({mean_tokens:,.0f} tokens per sample, "
                                               f"{len(ds) / tokenize_s:,.0f} texts/s)")
        summary.add_row("samples per rank", f"{per_rank:,}")
        summary.add_row("probe time per rank", f"{probe_s:.2f} s")
        summary.add_row("fingerprint (every row of its share + tokenizer), per rank", f"{fingerprint_s:.2f} s")
        summary.add_row("all_gather payload", f"{gather_mb:.0f} MB in all (4 int64 per sample)")
        verdict = "[green]under a minute[/]" if total_s < 60 else "[red]over a minute[/]"
        summary.add_row("extrapolated time (probe + fingerprint)", f"{total_s:.2f} s — {verdict}")
        console.print(summary)
        console.print(f"headers alone at {args.ranks} ranks: {args.total / (min(rates.values()) * args.ranks):.2f} s "
                      f"for {args.total:,} images at the slowest format's rate")


# ----------------------------------------------------------------------------------------------
# manifest: `mimo-accel index`'s header-reading threads, and its memory as manifests grow
# ----------------------------------------------------------------------------------------------


def _manifest(args, console) -> None:
    from concurrent.futures import ThreadPoolExecutor

    from PIL import Image
    from rich.table import Table

    from mimo_accel.costs import ResizeRule
    from mimo_accel.tools import index_builder

    with tempfile.TemporaryDirectory(prefix="mimo-bench-manifest-") as tmp:
        root = Path(tmp)
        rng = random.Random(2)
        with open(root / "m.jsonl", "w") as f:
            for i in range(args.manifest_files):
                name = f"{i}.{'png' if i % 2 else 'jpg'}"
                Image.new("RGB", (rng.randint(32, 640), rng.randint(32, 640)), (i % 255, 90, 30)).save(root / name)
                f.write(json.dumps({"images": [name], "tokens": rng.randint(16, 2048)}) + "\n")
        pool_default = ThreadPoolExecutor()._max_workers  # what workers=None gave before: the pool's own size
        table = Table(title=f"mimo-accel index over {args.manifest_files:,} image files (one per line), best of 3, "
                            "warm page cache", title_justify="left")
        for col in ("header-reading threads", "samples/s", "vs serial"):
            table.add_column(col, justify="right")
        rates = {}
        for workers in sorted({1, 2, 4, 8, pool_default}):
            best = float("inf")
            for _ in range(3):
                t = time.perf_counter()
                index = index_builder.build_index_from_manifest(root / "m.jsonl", ResizeRule(), workers=workers)
                best = min(best, time.perf_counter() - t)
            assert len(index) == args.manifest_files
            rates[workers] = args.manifest_files / best
            label = f"{workers}" + (" (the pool's default size)" if workers == pool_default else "") + \
                (" (the default)" if workers == index_builder.DEFAULT_WORKERS else "")
            table.add_row(label, f"{rates[workers]:,.0f}", f"{rates[workers] / rates[1]:.2f}x")
        console.print(table)
        _digest_and_verify(root, args.manifest_files, console)

    table = Table(title="mimo-accel index: peak memory by manifest length (image sizes given; a fresh process "
                        "each)", title_justify="left")
    for col in ("lines", "manifest", "time", "lines/s", "peak RSS", "peak RSS per line"):
        table.add_column(col, justify="right")
    ctx = multiprocessing.get_context("spawn")
    for lines in (int(x) for x in args.manifest_lines.split(",")):
        with tempfile.TemporaryDirectory(prefix="mimo-bench-manifest-") as tmp:
            path = Path(tmp) / "sizes.jsonl"
            rng = random.Random(3)
            with open(path, "w") as f:
                for i in range(lines):
                    k = i % 3
                    sizes = [[rng.randint(32, 2000), rng.randint(32, 2000)] for _ in range(k)]
                    f.write(json.dumps({"image_sizes": sizes, "tokens": rng.randint(16, 4096)}) + "\n")
            with ctx.Pool(1) as pool:
                seconds, peak_kb, baseline_kb, n = pool.apply(_index_manifest_in_a_fresh_process, (str(path),))
            assert n == lines
            grown = (peak_kb - baseline_kb) * 1024
            table.add_row(f"{lines:,}", f"{path.stat().st_size / 2**20:,.0f} MB", f"{seconds:.1f} s",
                          f"{lines / seconds:,.0f}", f"{grown / 2**20:,.0f} MB", f"{grown / lines:.0f} B")
    console.print(table)


def _digest_and_verify(root: Path, n: int, console) -> None:
    """What the files' contents digest adds to indexing (the same run with the stamp stubbed out:
    headers alone, as indexing was before the digest), and what ``--verify``'s decoding costs, on
    1 thread and on one per CPU (its default), best of 3 each."""
    from rich.table import Table

    from mimo_accel.costs import ResizeRule
    from mimo_accel.tools import decode_check, index_builder

    def best(fn) -> float:
        times = []
        for _ in range(3):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
        return n / min(times)

    def headers_alone():
        real = index_builder.file_stamp
        index_builder.file_stamp = lambda path: b""
        try:
            index_builder.build_index_from_manifest(root / "m.jsonl", ResizeRule(), workers=1)
        finally:
            index_builder.file_stamp = real

    files = [(str(i), str(root / f"{i}.{'png' if i % 2 else 'jpg'}"), "image") for i in range(n)]

    def decode(workers):
        assert not list(decode_check.undecodable([(files, n)], workers=workers))

    rates = {"headers alone (the stamp stubbed out)": best(headers_alone),
             "headers and the contents digest (mimo-accel index)": best(
                 lambda: index_builder.build_index_from_manifest(root / "m.jsonl", ResizeRule(), workers=1)),
             "--verify's decoding, 1 thread": best(lambda: decode(1)),
             f"--verify's decoding, {os.cpu_count()} threads (the default)": best(lambda: decode(None))}
    table = Table(title=f"the files' digest and --verify over the same {n:,} files, best of 3", title_justify="left")
    for col in ("what", "files/s", "vs headers alone"):
        table.add_column(col, justify="right")
    first = next(iter(rates.values()))
    for what, rate in rates.items():
        table.add_row(what, f"{rate:,.0f}", f"{rate / first:.2f}x")
    console.print(table)


def _index_manifest_in_a_fresh_process(path: str) -> tuple[float, int, int, int]:
    import resource

    from mimo_accel.costs import ResizeRule
    from mimo_accel.tools import index_builder  # imported before the baseline: only the indexing counts

    baseline = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t = time.perf_counter()
    index = index_builder.build_index_from_manifest(path, ResizeRule())
    index.save(path + ".npz")
    seconds = time.perf_counter() - t
    return seconds, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, baseline, len(index)


# ----------------------------------------------------------------------------------------------
# mapped: a 100 M-sample index, its load time and its memory on 8 ranks of a node
# ----------------------------------------------------------------------------------------------


def _synthetic_columns(n: int, seed: int = 0) -> dict:
    """An image-text mix: 0-3 images of 64..16383 patches each (one size per sample, so Σp² = k·p²),
    16..8191 tokens; written chunk by chunk into the narrow arrays the index keeps."""
    import numpy as np

    out = {"tokens": np.empty(n, np.uint16), "items": np.empty(n, np.uint8), "rows": np.empty(n, np.uint16),
           "sq_rows": np.empty(n, np.uint32)}
    rng = np.random.default_rng(seed)
    step = 1 << 22
    for lo in range(0, n, step):
        m = min(step, n - lo)
        k = rng.integers(0, 4, m, dtype=np.int64)
        per = rng.integers(64, 16384, m, dtype=np.int64)
        out["items"][lo:lo + m] = k
        out["rows"][lo:lo + m] = k * per
        out["sq_rows"][lo:lo + m] = k * per * per
        out["tokens"][lo:lo + m] = rng.integers(16, 8192, m)
    return out


def _memory() -> dict:
    """This process's resident memory (MB): RSS and its anonymous and file-backed parts
    (/proc/self/status), and PSS (/proc/self/smaps_rollup: shared pages divided among their users)."""
    out = {}
    for name, keys in (("/proc/self/status", ("VmRSS", "RssAnon", "RssFile")),
                       ("/proc/self/smaps_rollup", ("Pss", "Pss_Anon", "Pss_File"))):
        with open(name) as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in keys:
                    out[key] = int(value.split()[0]) / 1024
    return out


def _load_as_before(path: str):
    """What loading a format-v2 file did before format v3: `np.load`, every column copied into int64,
    and the digest the loaders compare across ranks (SHA-256 of the int64 columns)."""
    import hashlib

    import numpy as np

    with np.load(path) as data:
        columns = {k: data[k].astype(np.int64) for k in data.files if k != "header"}
    h = hashlib.sha256()
    for k in sorted(columns):
        h.update(columns[k].tobytes())
    return columns, h.hexdigest()


def _rank(path: str, how: str, n: int, batches: int, batch: int, barrier, results) -> None:
    """One data rank: load the index, price the micro-batches, then (once every rank has) measure."""
    import numpy as np

    from mimo_accel.costs import CostIndex, CostModel
    from mimo_accel.datasets.split_index import index_digest
    from mimo_accel.modules import Modules

    modules, model = Modules.from_dp_sizes({"vision": 8, "language": 8}), CostModel()
    pick = [np.random.default_rng(b).integers(0, n, batch) for b in range(batches)]
    barrier.wait()
    before = _memory()
    t = time.perf_counter()
    if how == "v4":
        index = CostIndex.load(path)
        index_digest(index)
        load_s = time.perf_counter() - t
        for i in pick:
            costs = index.module_costs(i, model, modules)
    else:
        columns, _ = _load_as_before(path)
        load_s = time.perf_counter() - t
        for i in pick:
            costs = {"vision": model.encoder_costs("vision", columns["e0_rows"][i], columns["e0_sq_rows"][i],
                                                   columns["e0_items"][i]),
                     "language": model.language_costs(columns["tokens"][i])}
    assert all(np.isfinite(c).all() for c in costs.values())
    barrier.wait()  # every rank has touched its pages: PSS divides the shared ones among all of them
    after = _memory()
    results.put({"load_s": load_s, **{k: after[k] - before[k] for k in after}})
    barrier.wait()


def _ranks(path: str, how: str, n: int, args) -> list[dict]:
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(args.procs), ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(path, how, n, args.batches, args.batch, barrier, results))
             for _ in range(args.procs)]
    for proc in procs:
        proc.start()
    out = [results.get(timeout=1200) for _ in procs]
    for proc in procs:
        proc.join(timeout=120)
        assert proc.exitcode == 0, f"a rank exited {proc.exitcode}"
    return out


def _mapped(args, console) -> None:
    import numpy as np
    from rich.table import Table

    from mimo_accel.costs import CostIndex, ResizeRule
    from mimo_accel.datasets.split_index import index_digest

    n, before_n = args.mapped, args.before
    rows = []
    with tempfile.TemporaryDirectory(prefix="mimo-bench-mapped-", dir="/tmp") as tmp:
        # before: a format-v2 file (int64 columns, np.savez) of before_n samples
        old = Path(tmp) / "v2.npz"
        c = _synthetic_columns(before_n)
        header = {"format": "mimo-accel-cost-index/2", "length": before_n,
                  "encoders": [{"name": "vision", "rule": ResizeRule().to_dict()}]}
        np.savez(old, header=np.array(json.dumps(header)), tokens=c["tokens"].astype(np.int64),
                 e0_items=c["items"].astype(np.int64), e0_rows=c["rows"].astype(np.int64),
                 e0_sq_rows=c["sq_rows"].astype(np.int64))
        del c
        loads = []
        for _ in range(3):
            t = time.perf_counter()
            _load_as_before(str(old))
            loads.append(time.perf_counter() - t)
        rows.append(("v2, as loaded before", before_n, old.stat().st_size, statistics.median(loads),
                     _ranks(str(old), "v2", before_n, args)))

        # after: the memory-mapped formats of n samples, v4 (packed) and v3 (byte-aligned)
        t = time.perf_counter()
        c = _synthetic_columns(n)
        for a in c.values():
            a.setflags(write=False)  # the index keeps them without a copy
        index = CostIndex(c.pop("tokens"), {"vision": (c["items"], c["rows"], c["sq_rows"],
                                                                    ResizeRule())})
        built_s = time.perf_counter() - t
        digest = index.digest()
        paths = {"v4": Path(tmp) / "v4.npz"}  # the one format that loads
        saved = {}
        for how, path in paths.items():
            t = time.perf_counter()
            index.save(path)
            saved[how] = time.perf_counter() - t
        del index, c
        console.print(f"index of {n:,} samples built and checked in {built_s:.1f} s, its digest included; written "
                      f"as v4 in {saved['v4']:.1f} s (packing each column)")
        for how, path in paths.items():
            loads = []
            for _ in range(5):
                t = time.perf_counter()
                loaded = CostIndex.load(path)
                index_digest(loaded)
                loads.append(time.perf_counter() - t)
                assert loaded.mapped and loaded.digest() == digest
            del loaded
            console.print(f"{how} file: load + digest {min(loads) * 1e3:.1f} ms best, "
                          f"{statistics.median(loads) * 1e3:.1f} ms median, {max(loads) * 1e3:.1f} ms worst of 5")
            label = "v4, packed, memory-mapped"
            rows.append((label, n, path.stat().st_size, statistics.median(loads), _ranks(str(path), how, n, args)))
            path.unlink()  # one large file in the page cache at a time

    table = Table(title=f"the cost index on {args.procs} processes of one node, each loading it and pricing "
                        f"{args.batches} micro-batches of {args.batch:,} samples (the same on every rank); growth "
                        "per process, worst rank", title_justify="left")
    for col in ("format", "samples", "file", "load (one process)", "load (busiest rank)", "RSS", "  anon",
                "  file", "PSS", f"extrapolated to {n:,}: load, RSS"):
        table.add_column(col, justify="right")
    for label, samples, size, load_s, ranks in rows:
        worst = {k: max(r[k] for r in ranks) for k in ranks[0]}
        scale = n / samples
        table.add_row(label, f"{samples:,}", f"{size / 2**20:,.0f} MB", f"{load_s * 1e3:,.1f} ms",
                      f"{worst['load_s'] * 1e3:,.1f} ms", f"{worst['VmRSS']:,.0f} MB", f"{worst['RssAnon']:,.0f} MB",
                      f"{worst['RssFile']:,.0f} MB", f"{worst['Pss']:,.0f} MB",
                      f"{load_s * scale:,.1f} s, {worst['VmRSS'] * scale / 1024:,.1f} GB" if scale != 1 else "(measured)")
    console.print(table)


if __name__ == "__main__":
    sys.exit(main())
