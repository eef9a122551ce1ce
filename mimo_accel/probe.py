"""Per-sample cost ingredients read from a dataset's raw examples, with no pixel decoded.

For each sample: how many images (0, 1 or N), each image's size from its file or bytes header (or
a PIL image's ``.size``), the vision processor's own resize rule, and the real language tokens —
what :class:`mimo_accel.costs.CostIndex` holds. The dataset shapes understood here:

- Bridge's ``MegatronMIMODataset`` (0.6.2): ``examples`` is an HF ``datasets.Dataset`` (image
  columns read from the arrow table, undecoded) or a list of dicts; an image is a path, bytes, a
  PIL image, an undecoded HF ``{"bytes", "path"}`` cell, or a list of those. Qwen2-VL / Qwen3-VL
  image processors give a :class:`ResizeRule`; a fixed-resolution processor (CLIP, SigLIP) gives
  ``encoder_seq_lengths[modality]`` rows per image (:class:`FixedPatches`). Tokens are the
  dataset's ``num_real_tokens``: the placeholders plus the truncated text tokens.
- Bridge's direct HF SFT dataset (``DirectSFTDataset``, what ``DirectHFSFTDatasetBuilder`` builds
  for the Qwen3.5-VL MegatronMIMO example): conversation examples whose ``{"type": "image"}``
  parts hold a path, ``file://`` path, ``data:image`` URI, bytes or PIL image. The Qwen collate's
  two resizes are reproduced: qwen_vl_utils' ``fetch_image`` (factor 28) and then the processor
  with the collate's ``min_pixels``/``max_pixels``. Tokens are the chat template's tokens with each
  image token expanded to its ``patches / merge²`` rows.

Anything else raises :class:`DeriveError` naming the three ways out. Pure: no torch.distributed;
transformers, datasets and Pillow are only touched through the objects the dataset already holds.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import inspect
import json
import math
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional, Sequence

import numpy as np

from mimo_accel.costs import (
    CostIndex,
    FixedPatches,
    ResizeRule,
    image_size_from_bytes,
    image_size_from_header,
)

__all__ = [
    "PROBE_FORMAT",
    "DeriveError",
    "Probed",
    "QwenFetchResize",
    "SampleSource",
    "image_size_of",
    "qwen_resize_rule",
    "source_for",
    "tokenizer_fingerprint",
]

PROBE_FORMAT = "mimo-accel-probe/1"
WAYS_OUT = (
    "Three ways out: (1) an index file: build it with `mimo-accel index` (from a JSONL manifest, or "
    "--dataset MODULE:FACTORY) and pass enable(cost_index=PATH) / MIMO_ACCEL_COST_INDEX; (2) give the "
    "dataset a `mimo_accel_cost_index` attribute (a mimo_accel.costs.CostIndex); (3) exchange mode, "
    "enable(reorder_mode='exchange') / MIMO_ACCEL_REORDER_MODE=exchange, which costs samples after "
    "they are decoded and needs no index."
)
CHUNK = 512  # samples read, tokenized and reported per step
_THREADS_FROM = 64  # image files per chunk from which header reads go to a thread pool
_SAMPLED_ROWS = 4096  # rows hashed into a list dataset's fingerprint


class DeriveError(ValueError):
    """Per-sample costs cannot be derived from this dataset or sample; the message names the fix."""


# ----------------------------------------------------------------------------------------------
# Image sizes
# ----------------------------------------------------------------------------------------------


def _is_pil(obj: Any) -> bool:
    return type(obj).__module__.startswith("PIL.") and isinstance(getattr(obj, "size", None), tuple)


def image_size_of(image: Any, where: str = "image") -> tuple[int, int]:
    """``(height, width)`` of one image as a dataset holds it, reading at most its header.

    Accepts a path (``str``/``PathLike``, ``file://`` prefix allowed), a ``data:image/...;base64,``
    URI, encoded bytes, an undecoded HF image cell ``{"bytes": ..., "path": ...}``, a PIL image
    (its ``.size``; nothing is decoded that was not already), or an array of shape ``(H, W)``,
    ``(H, W, C)`` or ``(C, H, W)`` with C in 1, 3, 4. URLs are refused: probing them would
    download them. Raises :class:`DeriveError` naming ``where``.
    """
    try:
        if _is_pil(image):
            width, height = image.size
            return int(height), int(width)
        if isinstance(image, (bytes, bytearray, memoryview)):
            return image_size_from_bytes(image, where)
        if isinstance(image, Mapping):
            data, path = image.get("bytes"), image.get("path")
            if data is not None:
                return image_size_from_bytes(data, where)
            if path:
                return image_size_of(path, where)
            raise DeriveError(f"{where}: an image cell with neither bytes nor a path")
        if isinstance(image, os.PathLike):
            image = os.fspath(image)
        if isinstance(image, str):
            if image.startswith(("http://", "https://")):
                raise DeriveError(f"{where}: image {image!r} is a URL; its size cannot be read without "
                                  "downloading it. Store the images locally, or use another way. " + WAYS_OUT)
            if image.startswith("data:image"):
                if "base64," not in image:
                    raise DeriveError(f"{where}: a data:image URI without base64 data")
                return image_size_from_bytes(base64.b64decode(image.split("base64,", 1)[1]), where)
            if image.startswith("file://"):
                image = image[len("file://"):]
            return image_size_from_header(image)
        shape = getattr(image, "shape", None)
        if shape is not None:
            return _array_size(tuple(int(s) for s in shape), where)
    except FileNotFoundError:
        raise DeriveError(f"{where}: image file not found: {image}") from None
    except DeriveError:
        raise
    except (OSError, ValueError) as exc:
        raise DeriveError(f"{where}: cannot read the image size: {exc}") from None
    raise DeriveError(f"{where}: cannot read the size of an image given as {type(image).__name__}; "
                      "give a path, bytes, a PIL image or an HF Image cell")


def _array_size(shape: tuple[int, ...], where: str) -> tuple[int, int]:
    if len(shape) == 2:
        h, w = shape
    elif len(shape) == 3 and shape[-1] in (1, 3, 4):
        h, w = shape[0], shape[1]
    elif len(shape) == 3 and shape[0] in (1, 3, 4):
        h, w = shape[1], shape[2]
    else:
        raise DeriveError(f"{where}: an image array of shape {shape} is neither (H, W), (H, W, C) nor (C, H, W)")
    if h < 1 or w < 1:
        raise DeriveError(f"{where}: an image array of shape {shape} is empty")
    return h, w


def _is_local_file(image: Any) -> bool:
    """Whether reading the size means opening a file (worth a thread pool)."""
    if isinstance(image, Mapping):
        return image.get("bytes") is None and bool(image.get("path"))
    return isinstance(image, (str, os.PathLike)) and not str(image).startswith("data:")


def _images_in(value: Any) -> list[Any]:
    """The images a modality cell holds: None -> none, a list -> each, anything else -> one."""
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return [v for v in value if v is not None]
    return [value]


# ----------------------------------------------------------------------------------------------
# Resize rules of processors
# ----------------------------------------------------------------------------------------------


def _field(obj: Any, name: str) -> Any:
    """``obj.name`` or ``obj[name]`` (transformers' SizeDict is both; older releases use dicts)."""
    if obj is None:
        return None
    value = getattr(obj, name, None)
    if value is None and isinstance(obj, Mapping):
        value = obj.get(name)
    return value


def _image_processor(processor: Any) -> Any:
    return getattr(processor, "image_processor", None) or processor


def _side(value: Any, what: str, owner: str) -> int:
    if isinstance(value, Mapping) or hasattr(value, "height"):
        h, w = _field(value, "height"), _field(value, "width")
        if h != w:
            raise DeriveError(f"{owner}: non-square {what} {h}x{w} is not supported")
        value = h
    return int(value)


def qwen_resize_rule(processor: Any, *, min_pixels: Optional[int] = None,
                     max_pixels: Optional[int] = None) -> Optional[ResizeRule]:
    """The :class:`ResizeRule` of a Qwen2-VL-style image processor (Qwen2/2.5/3/3.5-VL: it has
    ``patch_size`` and ``merge_size``), or None for any other processor.

    ``processor`` may be the image processor or a processor holding one (``.image_processor``).
    min/max pixels: the arguments when given (a collate's overrides), else the processor's
    ``size`` (``shortest_edge``/``longest_edge``), else its ``min_pixels``/``max_pixels``.
    """
    ip = _image_processor(processor)
    patch, merge = getattr(ip, "patch_size", None), getattr(ip, "merge_size", None)
    if patch is None or merge is None:
        return None
    owner = type(ip).__name__
    size = getattr(ip, "size", None)
    lo = min_pixels if min_pixels is not None else (_field(size, "shortest_edge") or getattr(ip, "min_pixels", None))
    hi = max_pixels if max_pixels is not None else (_field(size, "longest_edge") or getattr(ip, "max_pixels", None))
    if lo is None or hi is None:
        raise DeriveError(f"{owner}: no min/max pixels (size.shortest_edge/longest_edge) to resize by")
    try:
        return ResizeRule(patch_size=_side(patch, "patch_size", owner), merge_size=int(merge),
                          temporal_patch_size=int(getattr(ip, "temporal_patch_size", None) or 2),
                          min_pixels=int(lo), max_pixels=int(hi))
    except ValueError as exc:
        raise DeriveError(f"{owner}: {exc}") from None


def _is_audio(processor: Any) -> bool:
    ip = _image_processor(processor)
    fe = getattr(processor, "feature_extractor", None)
    return (getattr(ip, "sampling_rate", None) is not None or getattr(fe, "sampling_rate", None) is not None
            or getattr(ip, "feature_size", None) is not None)


def _is_fixed_resolution(processor: Any) -> bool:
    """A processor that resizes/crops every image to one size (CLIP, SigLIP, ViT)."""
    ip = _image_processor(processor)
    crop, size = getattr(ip, "crop_size", None), getattr(ip, "size", None)
    if getattr(ip, "do_center_crop", False) and _field(crop, "height") and _field(crop, "width"):
        return True
    return bool(getattr(ip, "do_resize", True) and _field(size, "height") and _field(size, "width"))


@dataclass(frozen=True)
class QwenFetchResize:
    """qwen_vl_utils' ``fetch_image`` resize, which Bridge's Qwen collate applies (through
    ``process_vision_info``) before the processor resizes again: factor ``patch_size * merge``
    (28 at the default ``image_patch_size=14``), pixels in ``[min_tokens, max_tokens] * factor²``
    unless an image part sets ``min_pixels``/``max_pixels``, or ``resized_height``/``resized_width``.

    Its rounding differs from transformers' in two corners (sides never round below one factor;
    the downscale branch has no floor at one factor), so it has its own function.
    """

    patch_size: int = 14
    merge_size: int = 2
    min_tokens: int = 4
    max_tokens: int = 16384
    max_ratio: int = 200

    @property
    def factor(self) -> int:
        return self.patch_size * self.merge_size

    def needs_header(self, part: Mapping[str, Any]) -> bool:
        return not ("resized_height" in part and "resized_width" in part)

    def size(self, height: int, width: int, part: Mapping[str, Any]) -> tuple[int, int]:
        f = self.factor
        if not self.needs_header(part):
            return self._resize(int(part["resized_height"]), int(part["resized_width"]),
                                self.min_tokens * f * f, self.max_tokens * f * f)
        return self._resize(height, width, int(part.get("min_pixels", self.min_tokens * f * f)),
                            int(part.get("max_pixels", self.max_tokens * f * f)))

    def _resize(self, height: int, width: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
        f = self.factor
        if max_pixels < min_pixels:
            raise ValueError(f"max_pixels ({max_pixels}) is below min_pixels ({min_pixels})")
        if height < 1 or width < 1 or max(height, width) / min(height, width) > self.max_ratio:
            raise ValueError(f"image of {height}x{width} px has an aspect ratio above {self.max_ratio}; "
                             "qwen_vl_utils rejects it, so drop or crop the image")
        h_bar = max(f, round(height / f) * f)
        w_bar = max(f, round(width / f) * f)
        if h_bar * w_bar > max_pixels:
            beta = math.sqrt(height * width / max_pixels)
            h_bar = math.floor(height / beta / f) * f
            w_bar = math.floor(width / beta / f) * f
        elif h_bar * w_bar < min_pixels:
            beta = math.sqrt(min_pixels / (height * width))
            h_bar = math.ceil(height * beta / f) * f
            w_bar = math.ceil(width * beta / f) * f
        if h_bar < 1 or w_bar < 1:
            raise ValueError(f"image of {height}x{width} px resizes to {h_bar}x{w_bar}")
        return h_bar, w_bar

    def to_dict(self) -> dict[str, int]:
        return {"patch_size": self.patch_size, "merge_size": self.merge_size,
                "min_tokens": self.min_tokens, "max_tokens": self.max_tokens}


# ----------------------------------------------------------------------------------------------
# Fingerprints
# ----------------------------------------------------------------------------------------------


def _sha(data: Any) -> str:
    if isinstance(data, str):
        data = data.encode()
    return hashlib.sha256(data).hexdigest()


def tokenizer_fingerprint(tokenizer: Any) -> dict[str, Any]:
    """What decides a tokenizer's token counts: its full serialisation for fast tokenizers (vocab,
    merges, normaliser, special tokens, post-processor), else its class, name and vocabulary."""
    fp: dict[str, Any] = {"class": type(tokenizer).__name__}
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and hasattr(backend, "to_str"):
        doc = json.loads(backend.to_str())
        # Truncation and padding are call state (HF sets them per call), not the tokenizer.
        doc.pop("truncation", None)
        doc.pop("padding", None)
        fp["backend"] = _sha(json.dumps(doc, sort_keys=True))
    else:
        fp["name"] = str(getattr(tokenizer, "name_or_path", ""))
        get_vocab = getattr(tokenizer, "get_vocab", None)
        if callable(get_vocab):
            fp["vocab"] = _sha(json.dumps(sorted(get_vocab().items())))
    for attr in ("add_bos_token", "add_eos_token"):
        if isinstance(getattr(tokenizer, attr, None), bool):
            fp[attr] = getattr(tokenizer, attr)
    return fp


def _canon(obj: Any, depth: int = 0) -> Any:
    """A deterministic, JSON-able stand-in for a raw example (never a memory address)."""
    if depth > 8:
        return "..."
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, (bytes, bytearray, memoryview)):
        return ["bytes", len(obj), _sha(bytes(obj))[:16]]
    if isinstance(obj, Mapping):
        return [[str(k), _canon(v, depth + 1)] for k, v in sorted(obj.items(), key=lambda kv: str(kv[0]))]
    if isinstance(obj, (list, tuple)):
        return [_canon(v, depth + 1) for v in obj]
    if isinstance(obj, os.PathLike):
        return os.fspath(obj)
    if _is_pil(obj):
        return ["PIL", list(obj.size), obj.mode, str(getattr(obj, "filename", "") or "")]
    shape = getattr(obj, "shape", None)
    if shape is not None:
        return ["array", [int(s) for s in shape], str(getattr(obj, "dtype", ""))]
    return ["object", type(obj).__module__, type(obj).__qualname__]


def _sampled_rows(n: int) -> list[int]:
    if n <= _SAMPLED_ROWS:
        return list(range(n))
    return sorted(set(np.linspace(0, n - 1, _SAMPLED_ROWS).round().astype(np.int64).tolist()))


def _is_hf_dataset(obj: Any) -> bool:
    return (type(obj).__module__.startswith("datasets.") and hasattr(obj, "_fingerprint")
            and hasattr(obj, "with_format"))


def examples_fingerprint(examples: Any, length: int) -> dict[str, Any]:
    """An HF dataset's own ``_fingerprint`` (content and transform history); for a list, a hash of
    up to 4096 evenly spaced rows and the length. (An edit to a row outside the sample goes
    unnoticed: pass ``refresh=True`` to rebuild.)"""
    if _is_hf_dataset(examples):
        return {"hf_fingerprint": str(examples._fingerprint), "rows": len(examples)}
    h = hashlib.sha256()
    for i in _sampled_rows(length):
        h.update(json.dumps(_canon(examples[i]), sort_keys=True, default=str).encode())
        h.update(b"\n")
    return {"sampled_rows": h.hexdigest(), "rows": length}


def _callable_name(fn: Any) -> Optional[str]:
    if fn is None:
        return None
    if isinstance(fn, functools.partial):
        return f"partial({_callable_name(fn.func)}, {sorted(fn.keywords)})"
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', type(fn).__qualname__)}"


# ----------------------------------------------------------------------------------------------
# What a probe returns
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Probed:
    """Cost ingredients of consecutive samples (int64 arrays of one length)."""

    patches: np.ndarray
    sq_patches: np.ndarray
    tokens: np.ndarray
    images: np.ndarray

    def __len__(self) -> int:
        return int(self.patches.size)

    @classmethod
    def concat(cls, parts: Sequence[Probed]) -> Probed:
        def cat(name: str) -> np.ndarray:
            arrays = [getattr(p, name) for p in parts]
            return np.concatenate(arrays).astype(np.int64) if arrays else np.zeros(0, np.int64)

        return cls(cat("patches"), cat("sq_patches"), cat("tokens"), cat("images"))

    def to_index(self, rule: ResizeRule | FixedPatches, length: int) -> CostIndex:
        """The index of a dataset of ``length`` samples, sample i being probed sample i % len."""
        if length == len(self):
            take = slice(None)
        else:
            take = np.arange(length) % max(len(self), 1)
        return CostIndex(self.patches[take], self.sq_patches[take], self.tokens[take],
                         self.images[take], rule)


@dataclass
class _Image:
    sample: int  # position in the chunk
    obj: Any  # what the dataset holds (None when the size is given)
    where: str
    part: Optional[Mapping[str, Any]] = None  # a conversation's image part (qwen_vl_utils resize)
    size: Optional[tuple[int, int]] = None  # (height, width) as the processor receives it
    patches: Optional[int] = None  # when the rule needs no size


def _read_sizes(images: list[_Image], workers: Optional[int]) -> None:
    """Fill ``size`` of every image that needs one; files through a thread pool when many."""
    todo = [im for im in images if im.size is None and im.patches is None]
    files = [im for im in todo if _is_local_file(im.obj)]
    if len(files) >= _THREADS_FROM and workers != 1:
        with ThreadPoolExecutor(max_workers=workers or min(8, (os.cpu_count() or 1) + 4),
                                thread_name_prefix="mimo-accel-probe") as pool:
            # map() yields in order: the error raised is the earliest image's.
            for im, size in zip(files, pool.map(lambda im: image_size_of(im.obj, im.where), files)):
                im.size = size
    for im in todo:
        if im.size is None:
            im.size = image_size_of(im.obj, im.where)


def _per_sample(n: int, images: list[_Image], rule: ResizeRule | FixedPatches,
                pre: Optional[QwenFetchResize] = None) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(Σp, Σp², image count) per sample of a chunk, and each image's patches."""
    if pre is not None:
        for im in images:
            if im.patches is None:
                h, w = im.size if im.size is not None else (1, 1)
                try:
                    im.size = pre.size(h, w, im.part or {})
                except ValueError as exc:
                    raise DeriveError(f"{im.where}: {exc}") from None
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
    owner = np.array([im.sample for im in images], dtype=np.int64)
    patches = np.zeros(n, np.int64)
    sq = np.zeros(n, np.int64)
    count = np.zeros(n, np.int64)
    np.add.at(patches, owner, per_image)
    np.add.at(sq, owner, per_image * per_image)
    np.add.at(count, owner, 1)
    return patches, sq, count, per_image


def _token_lengths(tokenizer: Any, texts: list[str], **kwargs: Any) -> list[int]:
    if not texts:
        return []
    out = tokenizer(texts, return_attention_mask=False, **kwargs)
    return [len(ids) for ids in out["input_ids"]]


# ----------------------------------------------------------------------------------------------
# Sources
# ----------------------------------------------------------------------------------------------


class SampleSource:
    """A dataset whose per-sample costs can be probed. ``probe(lo, hi)`` covers base samples
    ``[lo, hi)`` of ``base_length``; dataset sample i is base sample ``i % base_length``."""

    kind: str = ""
    length: int = 0
    base_length: int = 0
    rule: ResizeRule | FixedPatches

    def fingerprint_material(self) -> dict[str, Any]:
        raise NotImplementedError

    def fingerprint(self) -> str:
        """Hex SHA-256 of everything the derived index depends on (the cache key)."""
        doc = {"format": PROBE_FORMAT, "kind": self.kind, "length": self.length,
               "base_length": self.base_length, "rule": self.rule.to_dict(), **self.fingerprint_material()}
        return _sha(json.dumps(doc, sort_keys=True, default=str))

    def describe(self) -> str:
        return f"{self.kind} of {self.length:,} samples"

    def probe(self, lo: int, hi: int, *, on_progress: Optional[Callable[[int], None]] = None,
              workers: Optional[int] = None) -> Probed:
        parts = []
        for start in range(lo, hi, CHUNK):
            stop = min(hi, start + CHUNK)
            parts.append(self._probe_chunk(start, stop, workers))
            if on_progress is not None:
                on_progress(stop - start)
        return Probed.concat(parts)

    def _probe_chunk(self, start: int, stop: int, workers: Optional[int]) -> Probed:
        raise NotImplementedError

    def to_index(self, probed: Probed) -> CostIndex:
        return probed.to_index(self.rule, self.length)


class MimoDatasetSource(SampleSource):
    """Bridge's ``MegatronMIMODataset``: one modality column per encoder, placeholders first."""

    kind = "MegatronMIMODataset"

    def __init__(self, dataset: Any):
        self.dataset = dataset
        self.examples = dataset.examples
        self.tokenizer = dataset.tokenizer
        self.seq_length = int(dataset.seq_length)
        self.text_column = getattr(dataset, "text_column", "text")
        self.preprocess_fn = getattr(dataset, "preprocess_fn", None)
        self.special = dict(getattr(dataset, "special_token_ids", None) or {})
        self.enc_lengths = dict(getattr(dataset, "encoder_seq_lengths", None) or {})
        self.length = self.base_length = len(dataset)
        processors = dict(getattr(dataset, "processors", None) or {})
        # Modalities the dataset processes (it skips those without a processor), in its order.
        self.modalities: dict[str, str] = {m: c for m, c in dict(dataset.modality_columns).items()
                                           if processors.get(m) is not None}
        self.image_rules: dict[str, ResizeRule | FixedPatches] = {}
        for modality in self.modalities:
            proc = processors[modality]
            rule = qwen_resize_rule(proc)
            if rule is None and not _is_audio(proc) and _is_fixed_resolution(proc):
                rows = self.enc_lengths.get(modality)
                if rows is None:
                    raise DeriveError(
                        f"MegatronMIMODataset modality {modality!r}: a fixed-resolution {type(proc).__name__} "
                        "but no encoder_seq_lengths entry to say how many rows an image becomes. " + WAYS_OUT)
                rule = FixedPatches(rows)
            if rule is not None:
                self.image_rules[modality] = rule
            elif not _is_audio(proc):
                raise DeriveError(
                    f"MegatronMIMODataset modality {modality!r}: cannot tell how many encoder rows an image "
                    f"becomes with a {type(proc).__name__} (neither a Qwen-VL resize rule nor a fixed "
                    "resolution). " + WAYS_OUT)
        if not self.image_rules:
            raise DeriveError(
                f"MegatronMIMODataset with modalities {sorted(self.modalities)} has no image modality: "
                "there is no vision cost to balance. " + WAYS_OUT)
        rules = set(self.image_rules.values())
        if len(rules) > 1:
            raise DeriveError(
                f"MegatronMIMODataset image modalities resize differently ({self.image_rules}); one cost "
                "index holds one rule. " + WAYS_OUT)
        self.rule = rules.pop()

    def fingerprint_material(self) -> dict[str, Any]:
        return {
            "examples": examples_fingerprint(self.examples, self.length),
            "text_column": self.text_column,
            "modality_columns": sorted(self.modalities.items()),
            "image_rules": {m: r.to_dict() for m, r in sorted(self.image_rules.items())},
            "seq_length": self.seq_length,
            "special_token_ids": sorted(self.special.items()),
            "encoder_seq_lengths": sorted(self.enc_lengths.items()),
            "tokenizer": tokenizer_fingerprint(self.tokenizer),
            "preprocess_fn": _callable_name(self.preprocess_fn),
        }

    def _rows(self, start: int, stop: int) -> list[Mapping[str, Any]]:
        ex = self.examples
        if self.preprocess_fn is None and _is_hf_dataset(ex):
            # The arrow table: image cells stay {"bytes", "path"}, nothing is decoded.
            wanted = [c for c in dict.fromkeys([*self.modalities.values(), self.text_column])
                      if c in ex.column_names]
            if getattr(self, "_arrow_view", None) is None:
                self._arrow_view = ex.select_columns(wanted).with_format("arrow")
            table = self._arrow_view[start:stop]
            columns = {c: table.column(c).to_pylist() for c in wanted}
            return [{c: columns[c][j] for c in wanted} for j in range(stop - start)]
        rows = []
        for i in range(start, stop):
            row = ex[i]
            if self.preprocess_fn is not None:
                row = self.preprocess_fn(row)
            rows.append(row)
        return rows

    def _probe_chunk(self, start: int, stop: int, workers: Optional[int]) -> Probed:
        rows = self._rows(start, stop)
        images: list[_Image] = []
        prefix = np.zeros(len(rows), np.int64)
        texts = []
        for j, row in enumerate(rows):
            i = start + j
            for modality, column in self.modalities.items():
                if column not in row or row[column] is None:
                    continue
                if modality in self.special:
                    prefix[j] += self.enc_lengths.get(modality, 1)
                rule = self.image_rules.get(modality)
                if rule is None:
                    continue
                for k, obj in enumerate(_images_in(row[column])):
                    where = f"sample {i}, column {column!r}" + (f" image {k}" if isinstance(row[column], (list, tuple)) else "")
                    fixed = rule.patches_per_image if isinstance(rule, FixedPatches) else None
                    images.append(_Image(j, obj, where, patches=fixed))
            text = row.get(self.text_column, "") if hasattr(row, "get") else ""
            if not isinstance(text, str):
                raise DeriveError(f"sample {i}: column {self.text_column!r} holds a {type(text).__name__}, "
                                  "not a string; MegatronMIMODataset tokenizes one string per sample")
            texts.append(text)
        _read_sizes(images, workers)
        patches, sq, count, _ = _per_sample(len(rows), images, self.rule)
        lengths = np.asarray(_token_lengths(self.tokenizer, texts, truncation=True, max_length=self.seq_length),
                             dtype=np.int64).reshape(-1)
        return Probed(patches, sq, _mimo_real_tokens(lengths, prefix, self.seq_length), count)


def _mimo_real_tokens(text: np.ndarray, prefix: np.ndarray, seq: int) -> np.ndarray:
    """``num_real_tokens`` of MegatronMIMODataset: text (already truncated to seq) cut to make room
    for the placeholders — ``ids[:seq - P]``, a Python slice, negative stops included — then
    the placeholders, all capped at seq."""
    room = seq - prefix
    kept = np.where(room >= 0, np.minimum(text, room), np.maximum(text + room, 0))
    return np.minimum(np.where(prefix > 0, kept + prefix, text), seq)


def _collate_of(dataset: Any) -> Any:
    """The collate function a Bridge DirectSFTDataset binds (a closure over it), or None."""
    fn = getattr(dataset, "collate_fn", None)
    try:
        free = inspect.getclosurevars(fn).nonlocals if fn is not None else {}
    except TypeError:
        free = {}
    for name in ("collate_impl", "collator"):
        impl = free.get(name)
        if impl is not None:
            return getattr(impl, "collate_fn", impl)
    try:  # Bridge resolves it by processor class name when none was given
        import sys

        registry = sys.modules.get("megatron.bridge.data.collators.registry")
        resolve = getattr(registry, "resolve_model_collate", None)
        return resolve(type(dataset._processor).__name__) if resolve else None
    except Exception:
        return None


def _pixel_bounds(collate: Any) -> tuple[bool, Optional[int], Optional[int]]:
    """(takes min/max pixels, min_pixels, max_pixels) of a collate: its defaults, then a partial's
    keywords."""
    keywords: dict[str, Any] = {}
    while isinstance(collate, functools.partial):
        keywords = {**collate.keywords, **keywords}
        collate = collate.func
    try:
        params = inspect.signature(collate).parameters
    except (TypeError, ValueError):
        return False, None, None
    if "min_pixels" not in params and "max_pixels" not in params:
        return False, None, None

    def value(name: str) -> Optional[int]:
        if name in keywords:
            return keywords[name]
        p = params.get(name)
        return None if p is None or p.default is inspect.Parameter.empty else p.default

    return True, value("min_pixels"), value("max_pixels")


class ConversationSource(SampleSource):
    """Bridge's direct HF SFT dataset (``DirectSFTDataset``): conversation examples, repeated to
    the target length, collated by the model's collate (Qwen: ``qwen2_5_collate_fn``)."""

    kind = "DirectSFTDataset"

    def __init__(self, dataset: Any):
        self.examples = dataset._base_examples
        self.base_length = len(self.examples)
        self.length = len(dataset)
        self.processor = dataset._processor
        self.tokenizer = getattr(self.processor, "tokenizer", None) or self.processor
        self.collate = _collate_of(dataset)
        takes_pixels, lo, hi = _pixel_bounds(self.collate)
        ip = getattr(self.processor, "image_processor", None)
        self.has_image_processor = ip is not None
        rule = qwen_resize_rule(ip, min_pixels=lo, max_pixels=hi) if ip is not None else None
        if ip is not None and rule is None:
            raise DeriveError(
                f"DirectSFTDataset with a {type(ip).__name__}: only Qwen-VL image processors (patch_size, "
                "merge_size) are understood. " + WAYS_OUT)
        # A Qwen collate resizes twice: qwen_vl_utils first, then the processor.
        self.pre = QwenFetchResize() if rule is not None and takes_pixels else None
        self.rule = rule if rule is not None else ResizeRule()
        self.merge = rule.merge_size if rule is not None else 1
        self.image_token = getattr(self.processor, "image_token", None) if rule is not None else None
        self.template = getattr(self.processor, "apply_chat_template", None)
        if not callable(self.template):
            raise DeriveError(f"DirectSFTDataset: its processor {type(self.processor).__name__} has no "
                              "apply_chat_template. " + WAYS_OUT)

    def fingerprint_material(self) -> dict[str, Any]:
        template = getattr(self.processor, "chat_template", None) or getattr(self.tokenizer, "chat_template", None)
        return {
            "examples": examples_fingerprint(self.examples, self.base_length),
            "pre_resize": self.pre.to_dict() if self.pre else None,
            "image_token": self.image_token,
            "chat_template": _sha(json.dumps(template, sort_keys=True, default=str)),
            "tokenizer": tokenizer_fingerprint(self.tokenizer),
            "processor": type(self.processor).__name__,
            "collate": _callable_name(self.collate),
        }

    def describe(self) -> str:
        return f"{self.kind} of {self.length:,} samples ({self.base_length:,} distinct)"

    def _probe_chunk(self, start: int, stop: int, workers: Optional[int]) -> Probed:
        images: list[_Image] = []
        texts = []
        for j in range(stop - start):
            i = start + j
            example = self.examples[i]
            conversation = example.get("conversation") if isinstance(example, Mapping) else None
            if not isinstance(conversation, list):
                raise DeriveError(f"example {i}: no \"conversation\" list; only conversation examples are "
                                  "understood. " + WAYS_OUT)
            for k, part in enumerate(_vision_parts(conversation, i)):
                where = f"example {i}, image {k}"
                if "video" in part and "image" not in part and "image_url" not in part:
                    raise DeriveError(f"{where}: video parts are not supported. " + WAYS_OUT)
                if not self.has_image_processor:
                    raise DeriveError(f"{where}: an image, but the processor {type(self.processor).__name__} "
                                      "has no image processor. " + WAYS_OUT)
                obj = part["image"] if "image" in part else part.get("image_url")
                im = _Image(j, obj, where, part=part)
                if self.pre is not None and not self.pre.needs_header(part):
                    im.size = (1, 1)  # replaced by the part's resized_height/width
                images.append(im)
            kwargs = {"tools": example["tools"]} if example.get("tools") is not None else {}
            try:
                texts.append(self.template(conversation, tokenize=False, **kwargs))
            except Exception as exc:
                raise DeriveError(f"example {i}: the chat template failed ({type(exc).__name__}: {exc})") from None
        _read_sizes(images, workers)
        n = stop - start
        patches, sq, count, per_image = _per_sample(n, images, self.rule, self.pre)
        tokens = np.asarray(_token_lengths(self.tokenizer, texts), dtype=np.int64).reshape(-1)
        if self.image_token:
            # The processor replaces each image token by the image's merged rows.
            rows = np.zeros(n, np.int64)
            owner = np.array([im.sample for im in images], dtype=np.int64)
            np.add.at(rows, owner, per_image // (self.merge ** 2) - 1)
            tokens = tokens + rows
        return Probed(patches, sq, tokens, count)


def _vision_parts(conversation: list, i: int) -> list[Mapping[str, Any]]:
    """The image/video parts of a conversation, as qwen_vl_utils finds them."""
    parts = []
    for turn in conversation:
        content = turn.get("content") if isinstance(turn, Mapping) else None
        if isinstance(content, Mapping):
            content = [content]
        if not isinstance(content, list):
            continue
        for part in content:
            if not isinstance(part, Mapping):
                continue
            if ("image" in part or "image_url" in part or "video" in part
                    or part.get("type", "text") in ("image", "image_url", "video")):
                if not any(k in part for k in ("image", "image_url", "video")):
                    raise DeriveError(f"example {i}: a {part.get('type')!r} part without an \"image\" or "
                                      "\"image_url\" value")
                parts.append(part)
    return parts


def _looks_like_mimo_dataset(dataset: Any) -> bool:
    return all(hasattr(dataset, a) for a in ("examples", "processors", "tokenizer", "modality_columns",
                                             "seq_length", "encoder_seq_lengths"))


def _looks_like_direct_sft(dataset: Any) -> bool:
    return isinstance(getattr(dataset, "_base_examples", None), list) and hasattr(dataset, "_processor")


def source_for(dataset: Any) -> SampleSource:
    """The probe for ``dataset``; a :class:`DeriveError` naming the three ways out for anything else."""
    if _looks_like_mimo_dataset(dataset):
        return MimoDatasetSource(dataset)
    if _looks_like_direct_sft(dataset):
        return ConversationSource(dataset)
    raise DeriveError(
        f"mimo_accel cannot derive per-sample costs from a {type(dataset).__module__}.{type(dataset).__qualname__}: "
        "it understands Bridge's MegatronMIMODataset and DirectSFTDataset (HF SFT conversations), and "
        "datasets carrying a `mimo_accel_cost_index`. " + WAYS_OUT)
