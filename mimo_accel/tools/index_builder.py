"""The per-sample cost index that plan-before-read reordering needs, built from a manifest or an
in-memory dataset (the command that writes it: :mod:`mimo_accel.tools.indexing`).

The index is built once and stored beside the dataset; the planner then costs any sample without
decoding it (:class:`mimo_accel.costs.CostIndex`).

Manifest format (JSON Lines, one object per sample, in dataset order; blank lines are skipped)::

    {"images": ["imgs/a.jpg", "imgs/b.png"], "tokens": 412}
    {"image_sizes": [[480, 640]], "text": "Describe the picture ..."}
    {"tokens": 96}

- ``images``: image files, relative to the manifest's directory (absolute paths work too). Their
  sizes are read from the file headers only (PNG, JPEG, GIF, BMP, WebP; Pillow for other formats
  when installed), never decoded; serially by default (``--workers N``: a thread pool, for a network
  file system's latency).
- ``image_sizes``: ``[height, width]`` pairs in pixels, when the sizes are already known.
- At most one of ``images`` / ``image_sizes``; neither (or an empty list) means a text-only sample.
- ``tokens``: the sample's real text tokens, or ``text``: tokens are then *estimated* as
  ``ceil(len(text) / 4)`` (about four characters per token for English BPE vocabularies). Give
  ``tokens`` when you have them: the estimate only matters if the cost model weighs tokens.
- ``text`` is also what the index checks the dataset's texts by: given on every line (with
  ``tokens`` or without), as the dataset holds it (a MegatronMIMODataset's text column), its
  digest is recorded and a training job refuses the index once a text differs.

Vision patches come from the processor's resize rule (:class:`mimo_accel.costs.ResizeRule`,
Qwen2-VL's ``smart_resize``), which has no default here: a manifest with images needs the rule of the
processor you train with (``--processor``, or its patch size and pixel bounds). The manifest is
read :data:`CHUNK_LINES` lines at a time behind a progress bar, no Python object per sample kept.
The index (format v4, packed and memory-mapped by a training job) holds the manifest's images as the column of
one encoder module, ``vision`` unless ``--module NAME`` names it as the layout does (``images``,
say). ``--dataset`` indexes every modality of the dataset, each under its own module name.

Either way the index records what it describes: the digest of its files' names, sizes and first
bytes (:mod:`mimo_accel.costs.contents`; the same for a copy of the files in another directory),
which a training job compares with its dataset's, and the split.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Sequence

import numpy as np

from mimo_accel.costs import CostIndex, ResizeRule, SampleShape, image_size_from_header
from mimo_accel.costs.files import map_reads
from mimo_accel.costs.contents import Contents, SampleDigest, file_stamp

__all__ = [
    "INDEX_SUFFIX",
    "ManifestError",
    "build_index_from_dataset",
    "build_index_from_manifest",
    "default_index_path",
    "manifest_chunks",
    "summarize",
]

INDEX_SUFFIX = ".mimo-cost-index.npz"
DEFAULT_MODULE = "vision"  # the encoder module a manifest's images price (--module NAME)
CHARS_PER_TOKEN = 4
CHUNK_LINES = 1 << 16  # manifest lines parsed, sized and indexed at a time
DEFAULT_WORKERS = 1  # header-reading threads (benchmarks/bench_index.py --manifest: see docs/measurements.md)
NO_RULE_FIX = ("`mimo-accel index --processor NAME_OR_PATH`, or --patch-size, --min-pixels and --max-pixels; "
               "rule=ResizeRule(...) in Python")


class ManifestError(ValueError):
    """A manifest line that cannot be indexed; the message names the file and line."""


def default_index_path(manifest: str | os.PathLike[str]) -> Path:
    """Where the index of ``manifest`` goes by default: ``<manifest>.mimo-cost-index.npz``."""
    manifest = Path(manifest)
    return manifest.with_name(manifest.name + INDEX_SUFFIX)


def estimate_tokens(text: str) -> int:
    """Tokens of ``text`` estimated as ``ceil(len(text) / 4)``."""
    return math.ceil(len(text) / CHARS_PER_TOKEN)


# ----------------------------------------------------------------------------------------------
# Manifest
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Entry:
    line: int  # 1-based line number in the manifest
    images: tuple[Path, ...]  # files whose headers give the sizes
    sizes: tuple[tuple[int, int], ...]  # sizes given in the manifest
    tokens: int
    text: Optional[str]  # its text, where given (its digest is recorded)


def _parse_line(text: str, line: int, where: str, base: Path) -> _Entry:
    def bad(msg: str) -> ManifestError:
        return ManifestError(f"{where}:{line}: {msg}")

    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise bad(f"not valid JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(doc, dict):
        raise bad(f"expected a JSON object per line, got {type(doc).__name__}")
    if "images" in doc and "image_sizes" in doc:
        raise bad("give either \"images\" (files) or \"image_sizes\" ([h, w] pairs), not both")
    images: list[Path] = []
    sizes: list[tuple[int, int]] = []
    if "images" in doc:
        raw = doc["images"]
        if not isinstance(raw, list) or not all(isinstance(p, str) and p for p in raw):
            raise bad("\"images\" must be a list of file paths (strings, relative to the manifest)")
        images = [base / p for p in raw]
    if "image_sizes" in doc:
        raw = doc["image_sizes"]
        ok = isinstance(raw, list) and all(
            isinstance(s, list) and len(s) == 2
            and all(isinstance(x, int) and not isinstance(x, bool) and x >= 1 for x in s) for s in raw)
        if not ok:
            raise bad("\"image_sizes\" must be a list of [height, width] pairs of positive integers")
        sizes = [(s[0], s[1]) for s in raw]
    text = doc.get("text")
    if text is not None and not isinstance(text, str):
        raise bad("\"text\" must be a string")
    if "tokens" in doc:
        tokens = doc["tokens"]
        if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
            raise bad(f"\"tokens\" must be a non-negative integer, got {tokens!r}")
    elif text is not None:
        tokens = estimate_tokens(text)
    else:
        raise bad("each sample needs \"tokens\" (its real text tokens) or \"text\" (tokens estimated "
                  f"as len(text)/{CHARS_PER_TOKEN})")
    return _Entry(line, tuple(images), tuple(sizes), tokens, text)


def manifest_chunks(path: str | os.PathLike[str], lines: Optional[int] = None) -> Iterator[tuple[list[_Entry], int]]:
    """The manifest's samples, parsed and checked (no image is opened), ``lines`` samples at a time
    (None: :data:`CHUNK_LINES`): (the chunk's entries, bytes of the manifest read so far)."""
    path = Path(path)
    lines = CHUNK_LINES if lines is None else lines
    try:
        f = open(path, "rb")
    except FileNotFoundError:
        raise ManifestError(f"{path}: manifest not found") from None
    base, where, done, chunk, seen = path.parent, str(path), 0, [], False
    with f:
        for line_no, text in enumerate(f, start=1):
            done += len(text)
            if text.strip():
                try:
                    chunk.append(_parse_line(text.decode("utf-8"), line_no, where, base))
                except UnicodeDecodeError as exc:
                    raise ManifestError(f"{where}:{line_no}: not UTF-8 text ({exc.reason})") from None
            if len(chunk) >= lines:
                yield chunk, done
                chunk, seen = [], True
    if chunk or not seen:
        if not chunk:
            raise ManifestError(f"{path}: the manifest has no samples (one JSON object per line)")
        yield chunk, done


def _header_size(item: tuple[str, int, Path]) -> tuple[tuple[int, int], bytes]:
    """(an image's size from its header, its part of the contents digest)."""
    where, line, image = item
    try:
        return image_size_from_header(image), file_stamp(image)
    except FileNotFoundError:
        raise ManifestError(f"{where}:{line}: image not found: {image}") from None
    except (OSError, ValueError) as exc:
        raise ManifestError(f"{where}:{line}: cannot read the image size: {exc}") from None


def _read_sizes(entries: Sequence[_Entry], where: str,
                workers: int) -> dict[Path, tuple[tuple[int, int], bytes]]:
    """Header sizes and contents stamps of every distinct image file of a chunk, keyed by path;
    errors name the first bad line."""
    first_use: dict[Path, int] = {}
    for e in entries:
        for image in e.images:
            first_use.setdefault(image, e.line)
    items = [(where, line, image) for image, line in first_use.items()]
    sizes = map_reads(_header_size, items, workers, "mimo-accel-index")
    return dict(zip(first_use, sizes))


class _Columns:
    """The index columns of consecutive chunks of samples, each chunk held in the narrowest type
    that holds it (no Python object per sample outlives its chunk)."""

    def __init__(self) -> None:
        self.parts: dict[str, list[np.ndarray]] = {k: [] for k in ("tokens", "items", "rows", "sq_rows")}

    def add(self, shapes: Sequence[SampleShape], rule: Any, where: Callable[[int], str]) -> None:
        n = len(shapes)
        counts = np.fromiter((len(s.image_sizes) for s in shapes), dtype=np.int64, count=n)
        hw = np.array([size for s in shapes for size in s.image_sizes], dtype=np.int64).reshape(-1, 2)
        if rule is None and hw.size:
            first = int(np.flatnonzero(counts)[0])
            raise ManifestError(f"{where(first)}: a sample with images, and no resize rule to price them: give the "
                                f"rule of the processor you train with ({NO_RULE_FIX})")
        try:
            per_image = rule.patches_many(hw[:, 0], hw[:, 1]) if hw.size else np.zeros(0, np.int64)
        except ValueError:
            # Find the sample the rule refuses (e.g. aspect ratio above 200) and name it.
            for i, shape in enumerate(shapes):
                for h, w in shape.image_sizes:
                    try:
                        rule.resized(h, w)
                    except ValueError as exc:
                        raise ManifestError(f"{where(i)}: {exc}") from None
            raise
        owner = np.repeat(np.arange(n), counts)
        rows, sq = np.zeros(n, np.int64), np.zeros(n, np.int64)
        np.add.at(rows, owner, per_image)
        np.add.at(sq, owner, per_image * per_image)
        tokens = np.fromiter((s.tokens for s in shapes), dtype=np.int64, count=n)
        for key, a in (("tokens", tokens), ("items", counts), ("rows", rows), ("sq_rows", sq)):
            self.parts[key].append(a.astype(np.min_scalar_type(int(a.max()) if a.size else 0)))

    def index(self, rule: Any, module: str) -> CostIndex:
        rule = ResizeRule() if rule is None else rule  # a column needs one; without images it prices nothing
        whole = {}
        for key, parts in self.parts.items():
            whole[key] = np.concatenate(parts) if parts else np.zeros(0, np.uint8)  # the widest part's type
            whole[key].setflags(write=False)  # ours alone: the index keeps it without a copy
            parts.clear()
        return CostIndex(whole["tokens"], {module: (whole["items"], whole["rows"], whole["sq_rows"],
                                                                 rule)})


def build_index_from_manifest(path: str | os.PathLike[str], rule: Optional[ResizeRule] = None, *,
                              workers: Optional[int] = None, module: str = DEFAULT_MODULE,
                              on_progress: Optional[Callable[[int], object]] = None) -> CostIndex:
    """The cost index of the samples a JSONL manifest lists (format: see the module docstring), its
    images the column of encoder ``module``, read :data:`CHUNK_LINES` lines at a time.

    ``rule``: the resize rule of the processor the job trains with; None only for a manifest
    without images (one with images is refused at its first: no default fits every processor).
    ``workers``: threads reading a chunk's image headers (None: :data:`DEFAULT_WORKERS`; 1: serial).
    ``on_progress(bytes)``: called after each chunk with the bytes of the manifest read so far.
    The index's identity records the digest of its image files (``contents``: names, sizes, first
    bytes, :mod:`mimo_accel.costs.contents`), not when a sample gives ``image_sizes`` (the
    dataset's files for those are unknown here); and of its texts (``texts``) when every line gives
    its ``text``. A training job compares both with its dataset's.
    Raises :class:`ManifestError` (a ValueError) naming the manifest line for a bad line, a missing
    or unreadable image, an image the resize rule refuses, or images without a rule.
    """
    workers = DEFAULT_WORKERS if workers is None else workers
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    columns, contents, texts, sized, sample = _Columns(), Contents(), SampleDigest(), False, 0
    for entries, done in manifest_chunks(path):
        read = _read_sizes(entries, str(path), workers)
        shapes = [SampleShape(tuple(read[i][0] for i in e.images) + e.sizes, e.tokens) for e in entries]
        columns.add(shapes, rule, lambda i: f"{path}:{entries[i].line}")
        for e in entries:
            sized = sized or bool(e.sizes)
            contents.add(sample, [str(i) for i in e.images], [read[i][1] for i in e.images])
            if texts is not None and e.text is not None:
                texts.add(sample, e.text.encode())
            else:  # a line without its text: the index's texts cannot be compared with the dataset's
                texts = None
            sample += 1
        if on_progress is not None:
            on_progress(done)
    return columns.index(rule, module).with_identity(contents=None if sized else contents.record(),
                                                     texts=texts.record() if texts is not None else None)


def build_index_from_dataset(dataset: Any, shape_fn: Callable[[int], SampleShape],
                             rule: Optional[ResizeRule] = None, *, module: str = DEFAULT_MODULE) -> CostIndex:
    """The cost index of an in-memory dataset: ``shape_fn(i)`` gives sample i's :class:`SampleShape`
    (its images: encoder ``module``'s column, priced by ``rule``, which a dataset with images needs)."""
    columns = _Columns()
    for lo in range(0, len(dataset), CHUNK_LINES):
        shapes = []
        for i in range(lo, min(lo + CHUNK_LINES, len(dataset))):
            shape = shape_fn(i)
            if not isinstance(shape, SampleShape):
                raise TypeError(f"shape_fn({i}) must return a SampleShape, got {type(shape).__name__}")
            shapes.append(shape)
        columns.add(shapes, rule, lambda i: f"sample {lo + i}")
    return columns.index(rule, module)


# ----------------------------------------------------------------------------------------------
# Summary
# ----------------------------------------------------------------------------------------------


def _dist(values: np.ndarray) -> dict[str, float]:
    if values.size == 0:
        return {"p50": 0, "p90": 0, "max": 0}
    return {"p50": float(np.percentile(values, 50)), "p90": float(np.percentile(values, 90)),
            "max": float(values.max())}


def summarize(index: CostIndex) -> dict[str, Any]:
    """Counts and distributions of an index (what the CLI prints): per encoder module under
    ``encoders``; with one encoder also at the top level, under the image names of a v1 index."""
    n = len(index)
    encoders = {}
    for name in index.encoders:
        # the stored columns in their narrow types (unpacked, for a loaded index): no int64 copy
        col = index.encoder(name)
        items, rows = np.asarray(col.items), np.asarray(col.rows)
        without = int(n - np.count_nonzero(items))
        encoders[name] = {
            "items": int(items.sum(dtype=np.uint64)),
            "samples_without": without,
            "fraction_without": without / n if n else 0.0,
            "max_items_per_sample": int(items.max()) if n else 0,
            "rows_per_sample_with": _dist(rows[items > 0]),
            "total_rows": int(rows.sum(dtype=np.uint64)),
            "rule": index.rule_of(name).to_dict(),
        }
    out: dict[str, Any] = {"samples": n, "tokens_per_sample": _dist(np.asarray(index.token_column)), "encoders": encoders}
    if len(encoders) == 1:
        e = next(iter(encoders.values()))
        out.update({
            "images": e["items"],
            "text_only_samples": e["samples_without"],
            "text_only_fraction": e["fraction_without"],
            "max_images_per_sample": e["max_items_per_sample"],
            "patches_per_image_sample": e["rows_per_sample_with"],
            "total_patches": e["total_rows"],
            "rule": e["rule"],
        })
    return out
