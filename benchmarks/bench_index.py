"""Image headers probed per second per core, and the time to derive a 1M-sample cost index.

Writes real JPEG (plain and with a 24 KB EXIF block before the frame header, as camera files
have), and PNG files with Pillow, then times on one thread:
  - mimo_accel's header reader (`image_size_from_header`), per format;
  - Pillow's lazy `Image.open(...).size`, for comparison;
  - the whole per-sample probe a training rank runs (`MimoDatasetSource` over a real
    MegatronMIMODataset: header, Qwen2-VL resize rule, tokenizing the text with a trained BPE
    tokenizer), serial.
From the whole-probe rate it extrapolates the time to index 1M samples on 64 ranks (each rank
probes 1/64 of them in parallel; one all_gather of 4 int64 per sample follows).

    .venv/bin/python benchmarks/bench_index.py [--files 2000] [--samples 4000] [--ranks 64]

Files are read warm from the page cache of a local disk; a cold network file system adds its
open latency per file, which the probe's per-rank thread pool (`workers`) overlaps.
"""

from __future__ import annotations

import argparse
import os
import random
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
    from mimo_accel.rehearse import cpu

    cpu.prepare_imports()  # Bridge's dataset imports megatron.bridge
    from PIL import Image
    from rich.console import Console
    from rich.table import Table
    from transformers import Qwen2VLImageProcessorPil
    from megatron.bridge.data.megatron_mimo.dataset import MegatronMIMODataset

    from mimo_accel.costs import image_size_from_header
    from mimo_accel.datasets import MimoDatasetSource

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--files", type=int, default=2000, help="files written per format")
    p.add_argument("--samples", type=int, default=4000, help="samples in the whole-probe run")
    p.add_argument("--ranks", type=int, default=64)
    p.add_argument("--total", type=int, default=1_000_000, help="samples to extrapolate to")
    args = p.parse_args(argv)
    console = Console()

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
        t = time.perf_counter()
        tokens = tokenizer(texts, truncation=True, max_length=4096, return_attention_mask=False)["input_ids"]
        tokenize_s = time.perf_counter() - t
        mean_tokens = sum(map(len, tokens)) / len(tokens)

        per_rank = -(-args.total // args.ranks)
        probe_s = per_rank / per_core
        gather_mb = args.total * 4 * 8 / 2**20
        total_s = probe_s + fingerprint_s
        summary = Table(title=f"deriving the index of {args.total:,} samples on {args.ranks} ranks",
                        show_header=False, title_justify="left")
        summary.add_column("what", style="bold")
        summary.add_column("value")
        summary.add_row("whole probe (header + resize rule + tokens), one core", f"{per_core:,.0f} samples/s")
        summary.add_row("  of which tokenizing", f"{tokenize_s / best:.0%} ({mean_tokens:,.0f} tokens per sample, "
                                               f"{len(ds) / tokenize_s:,.0f} texts/s)")
        summary.add_row("samples per rank", f"{per_rank:,}")
        summary.add_row("probe time per rank", f"{probe_s:.2f} s")
        summary.add_row("fingerprint (sampled rows + tokenizer), per rank", f"{fingerprint_s:.2f} s")
        summary.add_row("all_gather payload", f"{gather_mb:.0f} MB in all (4 int64 per sample)")
        verdict = "[green]under a minute[/]" if total_s < 60 else "[red]over a minute[/]"
        summary.add_row("extrapolated time (probe + fingerprint)", f"{total_s:.2f} s — {verdict}")
        console.print(summary)
        console.print(f"headers alone at {args.ranks} ranks: {args.total / (min(rates.values()) * args.ranks):.2f} s "
                      f"for {args.total:,} images at the slowest format's rate")
    return 0


if __name__ == "__main__":
    sys.exit(main())
