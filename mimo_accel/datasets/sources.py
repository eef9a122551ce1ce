"""What every dataset probe shares: the :class:`SampleSource` base, what a probe returns
(:class:`Probed`), per-sample assembly of image sizes and patches, and :class:`DeriveError` with the
three ways out.

Pure: no torch.distributed; transformers, datasets and Pillow are only touched through the objects
the dataset already holds.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping, NamedTuple, Optional, Sequence

import numpy as np

from mimo_accel.costs import CostIndex, FixedPatches, ResizeRule
from mimo_accel.costs.contents import Contents, SampleDigest, file_stamps
from mimo_accel.costs.files import map_reads
from mimo_accel.costs.images import ImageSizeError, RemoteImageError, is_local_file, image_size_of
from mimo_accel.costs.index import per_sample_sums
from mimo_accel.datasets.fingerprints import canonical_bytes, sha256_hex

__all__ = ["PROBE_FORMAT", "DeriveError", "Inputs", "Probed", "RowInputs", "SampleError", "SampleSource"]

# /2: one column set per encoder module; /3: file names as base names; /4: every row's cost inputs
PROBE_FORMAT = "mimo-accel-probe/4"
WAYS_OUT = (
    "Three ways out: (1) an index file: build it with `mimo-accel index` (from a JSONL manifest, or "
    "--dataset MODULE:FACTORY) and pass enable(cost_index=PATH) / MIMO_ACCEL_COST_INDEX; (2) give the "
    "dataset a `mimo_accel_cost_index` attribute (a mimo_accel.costs.CostIndex); (3) exchange mode, "
    "enable(reorder_mode='exchange') / MIMO_ACCEL_REORDER_MODE=exchange, which costs samples after "
    "they are decoded and needs no index."
)
CHUNK = 512  # samples read, tokenized and reported per step
_CONTENTS_CHUNK = 4096  # base samples whose inputs (files' heads, texts, cells) are read at a time


class DeriveError(ValueError):
    """Per-sample costs cannot be derived from this dataset or sample; the message names the fix."""


class SampleError(DeriveError):
    """A sample the dataset itself would fail to load; the message names it and the fix."""


def empty_list_problem(where: str, column: str) -> str:
    """What a modality cell holding an empty list is, named (``where``: the sample)."""
    return (f"{where}, column {column!r}: an empty list; Bridge's MegatronMIMODataset hands it to the processor, "
            "which fails (\"need at least one array to concatenate\"). Give None, or leave the column out, for a "
            "sample without one")


def is_empty_list(cell: Any) -> bool:
    """A list (or tuple) cell with nothing but None in it: no item to process, not None either."""
    return isinstance(cell, (list, tuple)) and all(v is None for v in cell)


# ----------------------------------------------------------------------------------------------
# What a probe returns
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Probed:
    """Cost ingredients of consecutive samples: the language tokens and, per encoder module, its
    (items, rows, sq_rows) columns (int64 arrays of one length)."""

    tokens: np.ndarray
    encoders: Mapping[str, tuple[np.ndarray, np.ndarray, np.ndarray]]

    def __len__(self) -> int:
        return int(self.tokens.size)

    @classmethod
    def concat(cls, parts: Sequence[Probed]) -> Probed:
        def cat(arrays: list) -> np.ndarray:
            return np.concatenate(arrays).astype(np.int64) if arrays else np.zeros(0, np.int64)

        names = list(parts[0].encoders) if parts else []
        if any(list(p.encoders) != names for p in parts):
            raise ValueError("probed parts name different encoders")
        return cls(cat([p.tokens for p in parts]),
                   {n: tuple(cat([p.encoders[n][k] for p in parts]) for k in range(3)) for n in names})

    def to_index(self, rules: Any, length: int) -> CostIndex:
        """The index of a dataset of ``length`` samples, sample i being probed sample i % len;
        ``rules``: each encoder's rule (a mapping by module name; one rule for a single encoder)."""
        if length == len(self):
            take = slice(None)
        else:
            take = np.arange(length) % max(len(self), 1)
        if not isinstance(rules, Mapping):
            rules = {name: rules for name in self.encoders}
        return CostIndex(self.tokens[take], {
            n: (items[take], rows[take], sq[take], rules[n]) for n, (items, rows, sq) in self.encoders.items()})


class RowInputs(NamedTuple):
    """One base sample's cost inputs as the dataset holds them: the local files its costs are read
    from, as (path, kind: ``"image"`` or ``"audio"``); the text its tokens are counted from (None:
    a form no manifest gives, a conversation's turns); and every cost input of the row (its
    modality cells, files by base name: :func:`~mimo_accel.datasets.fingerprints.relocatable`, and
    its text), JSON-able; and what the dataset would fail to load in it (``problems``, each named)."""

    sample: int
    files: tuple[tuple[str, str], ...]
    text: Optional[str]
    inputs: Any
    problems: tuple[str, ...] = ()


@dataclass(frozen=True)
class Inputs:
    """What a share of a dataset's samples gives its identity: the digest of its files
    (:class:`Contents`), of its texts (None where a source has no texts a manifest could give) and
    of every row's cost inputs. The shares of any split add up (``a + b``) to the whole."""

    contents: Contents
    texts: Optional[SampleDigest]
    rows: SampleDigest

    @classmethod
    def none(cls) -> "Inputs":
        return cls(Contents(), SampleDigest(), SampleDigest())

    def __add__(self, other: "Inputs") -> "Inputs":
        texts = self.texts + other.texts if self.texts is not None and other.texts is not None else None
        return Inputs(self.contents + other.contents, texts, self.rows + other.rows)


@dataclass
class ImageItem:
    sample: int  # position in the chunk
    obj: Any  # what the dataset holds (None when the size is given)
    where: str
    part: Optional[Mapping[str, Any]] = None  # a conversation's image part (qwen_vl_utils resize)
    size: Optional[tuple[int, int]] = None  # (height, width) as the processor receives it
    patches: Optional[int] = None  # when the rule needs no size


def _size_of(im: ImageItem) -> tuple[int, int]:
    """:func:`image_size_of` with its error as a :class:`DeriveError` (a URL's names the ways out)."""
    try:
        return image_size_of(im.obj, im.where)
    except RemoteImageError as exc:
        raise DeriveError(f"{exc} {WAYS_OUT}") from None
    except ImageSizeError as exc:
        raise DeriveError(str(exc)) from None


def read_sizes(images: list[ImageItem], workers: Optional[int]) -> None:
    """Fill ``size`` of every image that needs one; files through a thread pool when many."""
    todo = [im for im in images if im.size is None and im.patches is None]
    files = [im for im in todo if is_local_file(im.obj)]
    for im, size in zip(files, map_reads(_size_of, files, workers, "mimo-accel-probe")):
        im.size = size
    for im in todo:
        if im.size is None:
            im.size = _size_of(im)



def local_path(item: Any) -> Optional[str]:
    """The local file an image or clip cell names (a path, ``file://`` path, or an undecoded HF
    cell with a path and no bytes), else None."""
    if isinstance(item, Mapping):
        return local_path(item.get("path")) if item.get("bytes") is None and item.get("path") else None
    if isinstance(item, os.PathLike):
        item = os.fspath(item)
    if isinstance(item, str) and not item.startswith(("data:", "http://", "https://")):
        return item[len("file://"):] if item.startswith("file://") else item
    return None


def per_sample_patches(n: int, images: list[ImageItem],
                rule: ResizeRule | FixedPatches) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(Σp, Σp², image count) per sample of a chunk, and each image's patches."""
    fixed = np.array([im.patches if im.patches is not None else -1 for im in images], dtype=np.int64)
    need = np.flatnonzero(fixed < 0)
    per_image = fixed.copy()
    if need.size:
        hw = np.array([images[i].size for i in need], dtype=np.int64).reshape(-1, 2)
        try:
            per_image[need] = rule.patches_many(hw[:, 0], hw[:, 1])
        except ValueError:
            for i in need:  # name the image the rule refuses
                try:
                    rule.patches(*images[i].size)
                except ValueError as exc:
                    raise DeriveError(f"{images[i].where}: {exc}") from None
            raise
    return (*per_sample_sums(n, [im.sample for im in images], per_image), per_image)


def token_lengths(tokenizer: Any, texts: list[str], **kwargs: Any) -> list[int]:
    if not texts:
        return []
    out = tokenizer(texts, return_attention_mask=False, **kwargs)
    return [len(ids) for ids in out["input_ids"]]


def fingerprint_of(settings: str, rows: SampleDigest) -> str:
    """A dataset's fingerprint: its settings' (:meth:`SampleSource.settings_fingerprint`) and its
    rows' digest, hashed together."""
    return sha256_hex(json.dumps([settings, rows.digest]))


# ----------------------------------------------------------------------------------------------
# Sources
# ----------------------------------------------------------------------------------------------


class SampleSource:
    """A dataset whose per-sample costs can be probed. ``probe(lo, hi)`` covers base samples
    ``[lo, hi)`` of ``base_length``; dataset sample i is base sample ``i % base_length``.
    ``rules``: each encoder module's rule (what gives its rows), in the dataset's order."""

    kind: str = ""
    length: int = 0
    base_length: int = 0
    rules: dict[str, Any]

    def fingerprint_material(self) -> dict[str, Any]:
        raise NotImplementedError

    def settings_fingerprint(self) -> str:
        """Hex SHA-256 of everything but the rows the derived index depends on: the lengths, the
        rules, the tokenizer, the columns (:meth:`fingerprint_material`)."""
        doc = {"format": PROBE_FORMAT, "kind": self.kind, "length": self.length, "base_length": self.base_length,
               "rules": [[name, rule.to_dict()] for name, rule in self.rules.items()],
               **self.fingerprint_material()}
        return sha256_hex(json.dumps(doc, sort_keys=True, default=str))

    def fingerprint(self, rows: Optional[SampleDigest] = None) -> str:
        """Hex SHA-256 of everything the derived index depends on: the settings and every row's
        cost inputs (``rows``: their digest, :meth:`read_inputs`; None reads them all here)."""
        if rows is None:
            rows = self.rows_digest(0, self.base_length)
        return fingerprint_of(self.settings_fingerprint(), rows)

    def rows_digest(self, lo: int, hi: int) -> SampleDigest:
        """The digest of the cost inputs of base samples ``[lo, hi)`` (no file read)."""
        rows = SampleDigest()
        for row in self.row_inputs(lo, hi):
            rows.add(row.sample, canonical_bytes(row.inputs))
        return rows

    def describe(self) -> str:
        return f"{self.kind} of {self.length:,} samples"

    def row_inputs(self, lo: int, hi: int) -> Iterator[RowInputs]:
        """The :class:`RowInputs` of base samples ``[lo, hi)``, in order."""
        raise NotImplementedError

    def local_files(self, lo: int, hi: int) -> Iterator[tuple[int, str, str]]:
        """The local files the costs of base samples ``[lo, hi)`` are read from, as (base sample,
        path, kind: ``"image"`` or ``"audio"``), in sample order."""
        for row in self.row_inputs(lo, hi):
            for path, kind in row.files:
                yield row.sample, path, kind

    def read_inputs(self, lo: int, hi: int, workers: Optional[int] = None) -> Inputs:
        """The :class:`Inputs` of base samples ``[lo, hi)``: their files' heads read (a thread pool
        unless ``workers`` is 1) and each counted at every dataset position that repeats it (dataset
        sample i is base sample ``i % base_length``), as are the texts; each row's cost inputs once,
        at its base position (the lengths are in :meth:`settings_fingerprint`). A sample the dataset
        would fail to load is a :class:`SampleError` naming it."""
        contents, rows = Contents(), SampleDigest()
        texts: Optional[SampleDigest] = SampleDigest()
        chunk: list[RowInputs] = []

        def add_chunk() -> None:
            nonlocal texts
            stamps = iter(file_stamps([path for row in chunk for path, _ in row.files], workers))
            for row in chunk:
                paths = [path for path, _ in row.files]
                got = [next(stamps) for _ in paths]
                if row.text is None:
                    texts = None
                text = row.text.encode() if texts is not None else b""
                for position in range(row.sample, self.length, max(self.base_length, 1)):
                    contents.add(position, paths, got)
                    if texts is not None:
                        texts.add(position, text)
                rows.add(row.sample, canonical_bytes(row.inputs))
            chunk.clear()

        for row in self.row_inputs(lo, hi):
            if row.problems:  # found before the job, which would stop at this sample
                raise SampleError(row.problems[0])
            chunk.append(row)
            if len(chunk) >= _CONTENTS_CHUNK:
                add_chunk()
        add_chunk()
        return Inputs(contents, texts, rows)

    def probe(self, lo: int, hi: int, *, on_progress: Optional[Callable[[int], None]] = None,
              workers: Optional[int] = None) -> Probed:
        parts = []
        for start in range(lo, hi, CHUNK):
            stop = min(hi, start + CHUNK)
            parts.append(self._probe_chunk(start, stop, workers))
            if on_progress is not None:
                on_progress(stop - start)
        if not parts:
            return Probed(np.zeros(0, np.int64), {name: (np.zeros(0, np.int64),) * 3 for name in self.rules})
        return Probed.concat(parts)

    def _probe_chunk(self, start: int, stop: int, workers: Optional[int]) -> Probed:
        raise NotImplementedError

    def to_index(self, probed: Probed) -> CostIndex:
        return probed.to_index(self.rules, self.length)
