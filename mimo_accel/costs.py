"""Per-sample vision cost: the Qwen-VL resize rule, a cost model, and a cost index.

Everything here is pure and deterministic, so every rank computes the same cost for the same
sample without talking to any other rank. The cost index ("plan before read") is built once from
dataset metadata or image headers and stored beside the dataset: a planner can then cost any
sample without decoding it.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import struct
import tempfile
import zipfile
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "CostIndex",
    "CostModel",
    "FixedPatches",
    "ResizeRule",
    "SampleShape",
    "image_size_from_bytes",
    "image_size_from_header",
    "rule_from_dict",
]

COST_MODEL_FORMAT = "mimo-accel-cost-model/1"
COST_INDEX_FORMAT = "mimo-accel-cost-index/1"
_MAX_ASPECT = 200
_REBUILD_HINT = "rebuild it with `mimo-accel index`"


def _positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


# --------------------------------------------------------------------------------------------
# Resize rule
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ResizeRule:
    """Qwen2-VL's image resize rule (``smart_resize``), expressed in patches.

    An image is resized so both sides are multiples of ``patch_size * merge_size`` and its area
    lies in ``[min_pixels, max_pixels]``; the encoder then sees ``(h / patch_size) *
    (w / patch_size)`` patches. A still image is one temporal patch (t = 1).

    Follows the transformers releases this project pins (5.8 - 5.12): an aspect ratio above 200
    is refused; a side shorter than the factor is not (older releases refused that too).
    """

    patch_size: int = 14
    merge_size: int = 2
    temporal_patch_size: int = 2
    min_pixels: int = 3136
    max_pixels: int = 1003520

    def __post_init__(self) -> None:
        for name in ("patch_size", "merge_size", "temporal_patch_size", "min_pixels", "max_pixels"):
            _positive_int(f"ResizeRule.{name}", getattr(self, name))
        if self.min_pixels > self.max_pixels:
            raise ValueError(
                f"ResizeRule.min_pixels ({self.min_pixels}) exceeds max_pixels ({self.max_pixels});"
                " swap them or fix the processor config"
            )

    @property
    def factor(self) -> int:
        """Side lengths after resizing are multiples of this many pixels."""
        return self.patch_size * self.merge_size

    def resized(self, height: int, width: int) -> tuple[int, int]:
        """Resized (height, width) in pixels, as Qwen2-VL's ``smart_resize`` computes them."""
        height = _positive_int("height", height)
        width = _positive_int("width", width)
        factor = self.factor
        if max(height, width) / min(height, width) > _MAX_ASPECT:
            raise ValueError(
                f"image of {height}x{width} px has an aspect ratio above {_MAX_ASPECT}; the Qwen-VL"
                " processor rejects it, so drop or crop the image"
            )
        h_bar = round(height / factor) * factor
        w_bar = round(width / factor) * factor
        if h_bar * w_bar > self.max_pixels:
            beta = math.sqrt(height * width / self.max_pixels)
            # max(factor, ...) as current transformers does; it only matters for tiny max_pixels.
            h_bar = max(factor, math.floor(height / beta / factor) * factor)
            w_bar = max(factor, math.floor(width / beta / factor) * factor)
        elif h_bar * w_bar < self.min_pixels:
            beta = math.sqrt(self.min_pixels / (height * width))
            h_bar = math.ceil(height * beta / factor) * factor
            w_bar = math.ceil(width * beta / factor) * factor
        return h_bar, w_bar

    def grid_thw(self, height: int, width: int) -> tuple[int, int, int]:
        """The encoder's ``grid_thw`` for one image of ``height`` x ``width`` pixels."""
        h_bar, w_bar = self.resized(height, width)
        return 1, h_bar // self.patch_size, w_bar // self.patch_size

    def patches(self, height: int, width: int) -> int:
        """Number of vision patches (encoder rows before merging) for one image."""
        t, h, w = self.grid_thw(height, width)
        return t * h * w

    def patches_many(self, heights: Sequence[int] | np.ndarray, widths: Sequence[int] | np.ndarray) -> np.ndarray:
        """:meth:`patches` for many images at once (int64), bit-identical to the scalar rule.

        numpy's ``rint`` rounds half to even like Python's ``round``, and ``sqrt``/division are
        IEEE-exact in both, so the vectorised path cannot drift from the scalar one.
        """
        h = np.asarray(heights, dtype=np.int64)
        w = np.asarray(widths, dtype=np.int64)
        if h.shape != w.shape or h.ndim != 1:
            raise ValueError("heights and widths must be 1-D sequences of the same length")
        if h.size == 0:
            return np.zeros(0, dtype=np.int64)
        factor = self.factor
        hf, wf = h.astype(np.float64), w.astype(np.float64)
        bad = (h < 1) | (w < 1)
        if not bad.any():  # the same test as the scalar rule, once no side is zero
            bad = np.maximum(hf, wf) / np.minimum(hf, wf) > _MAX_ASPECT
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            self.resized(int(h[i]), int(w[i]))  # raises the scalar rule's message
        h_bar = np.rint(hf / factor).astype(np.int64) * factor
        w_bar = np.rint(wf / factor).astype(np.int64) * factor
        area = hf * wf
        big = h_bar * w_bar > self.max_pixels
        if big.any():
            beta = np.sqrt(area[big] / self.max_pixels)
            h_bar[big] = np.maximum(factor, np.floor(hf[big] / beta / factor).astype(np.int64) * factor)
            w_bar[big] = np.maximum(factor, np.floor(wf[big] / beta / factor).astype(np.int64) * factor)
        small = ~big & (h_bar * w_bar < self.min_pixels)
        if small.any():
            beta = np.sqrt(self.min_pixels / area[small])
            h_bar[small] = np.ceil(hf[small] * beta / factor).astype(np.int64) * factor
            w_bar[small] = np.ceil(wf[small] * beta / factor).astype(np.int64) * factor
        return (h_bar // self.patch_size) * (w_bar // self.patch_size)

    def to_dict(self) -> dict[str, int]:
        return {
            "patch_size": self.patch_size,
            "merge_size": self.merge_size,
            "temporal_patch_size": self.temporal_patch_size,
            "min_pixels": self.min_pixels,
            "max_pixels": self.max_pixels,
        }


@dataclass(frozen=True)
class FixedPatches:
    """A fixed-resolution vision processor (CLIP, SigLIP): every image becomes ``patches`` encoder
    rows whatever its size, because the processor resizes and crops it to one resolution.

    The same methods as :class:`ResizeRule` where a cost index needs them, so either can be an
    index's ``rule``.
    """

    patches_per_image: int

    def __post_init__(self) -> None:
        _positive_int("FixedPatches.patches_per_image", self.patches_per_image)
        object.__setattr__(self, "patches_per_image", int(self.patches_per_image))

    def patches(self, height: int, width: int) -> int:
        """Encoder rows of one image (its size does not matter)."""
        _positive_int("height", height)
        _positive_int("width", width)
        return self.patches_per_image

    def patches_many(self, heights: Sequence[int] | np.ndarray, widths: Sequence[int] | np.ndarray) -> np.ndarray:
        h = np.asarray(heights, dtype=np.int64)
        w = np.asarray(widths, dtype=np.int64)
        if h.shape != w.shape or h.ndim != 1:
            raise ValueError("heights and widths must be 1-D sequences of the same length")
        return np.full(h.shape, self.patches_per_image, dtype=np.int64)

    def to_dict(self) -> dict[str, int]:
        return {"fixed_patches": self.patches_per_image}


def rule_from_dict(doc: Mapping[str, Any]) -> ResizeRule | FixedPatches:
    """The rule a ``to_dict()`` describes (:class:`ResizeRule` or :class:`FixedPatches`)."""
    if not isinstance(doc, Mapping):
        raise ValueError(f"a resize rule must be a mapping, got {type(doc).__name__}")
    if "fixed_patches" in doc:
        if set(doc) != {"fixed_patches"}:
            raise ValueError(f"a fixed-patches rule has only \"fixed_patches\", got keys {sorted(doc)}")
        return FixedPatches(doc["fixed_patches"])
    return ResizeRule(**doc)


# --------------------------------------------------------------------------------------------
# Cost model
# --------------------------------------------------------------------------------------------


def _check_coefficient(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ValueError(f"CostModel.{name} must be a number, got {value!r}")
    value = float(value)
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"CostModel.{name} must be finite and >= 0, got {value!r}")
    return value


@dataclass(frozen=True)
class CostModel:
    """Vision cost of one sample: ``a * sum(p_i) + b * sum(p_i**2) + c * tokens``.

    ``p_i`` are the patch counts of the sample's images: the linear term is the encoder's MLP and
    projection work, the quadratic term its full attention over each image. The defaults mirror a
    CPU measurement, t ≈ 6.6e-5·N + 6.1e-8·Σp_i² s, i.e. b/a ≈ 9.2e-4, in units of ``a``.
    ``fit`` carries optional fit-quality metadata (e.g. ``r2``, ``n``) from calibration.
    """

    a: float = 1.0
    b: float = 0.0009
    c: float = 0.0
    fit: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        for name in ("a", "b", "c"):
            object.__setattr__(self, name, _check_coefficient(name, getattr(self, name)))
        if not isinstance(self.fit, Mapping):
            raise ValueError(f"CostModel.fit must be a mapping, got {type(self.fit).__name__}")
        object.__setattr__(self, "fit", dict(self.fit))  # a private copy; stays picklable

    def sample_cost(self, image_patches: Sequence[int], tokens: int) -> float:
        """Cost of one sample with images of ``image_patches`` patches and ``tokens`` tokens."""
        p = np.asarray(image_patches, dtype=np.int64).reshape(-1)
        return float(self.costs_from_sums(p.sum(), (p * p).sum(), tokens))

    def costs(self, samples: Iterable[tuple[Sequence[int], int]]) -> np.ndarray:
        """Costs of many ``(image_patches, tokens)`` samples as a float64 array."""
        sums, squares, tokens = [], [], []
        for image_patches, n_tokens in samples:
            p = np.asarray(image_patches, dtype=np.int64).reshape(-1)
            sums.append(p.sum())
            squares.append((p * p).sum())
            tokens.append(n_tokens)
        return self.costs_from_sums(sums, squares, tokens)

    def costs_from_sums(self, patches: Any, sq_patches: Any, tokens: Any) -> np.ndarray:
        """Vectorised core: costs from per-sample Σp, Σp² and token counts (all >= 0)."""
        p = np.asarray(patches, dtype=np.float64)
        q = np.asarray(sq_patches, dtype=np.float64)
        t = np.asarray(tokens, dtype=np.float64)
        if (p < 0).any() or (q < 0).any() or (t < 0).any():
            raise ValueError("patch, squared-patch and token counts must be >= 0")
        with np.errstate(over="ignore"):
            out = self.a * p + self.b * q + self.c * t
        if not np.isfinite(out).all():
            raise ValueError("a sample cost overflowed to infinity; the counts are implausibly large")
        return out

    def to_file(self, path: str | os.PathLike[str]) -> None:
        """Write the model as JSON (format ``mimo-accel-cost-model/1``)."""
        doc: dict[str, Any] = {"format": COST_MODEL_FORMAT, "a": self.a, "b": self.b, "c": self.c}
        if self.fit:
            doc["fit"] = dict(self.fit)
        _atomic_write(Path(path), (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode())

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> CostModel:
        """Read a model written by :meth:`to_file`; a malformed file raises ValueError."""
        path = Path(path)
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise ValueError(
                f"{path}: not a JSON cost model ({exc}); recreate it with `mimo-accel calibrate`"
            ) from None
        if not isinstance(doc, dict) or doc.get("format") != COST_MODEL_FORMAT:
            found = doc.get("format") if isinstance(doc, dict) else type(doc).__name__
            raise ValueError(
                f"{path}: expected \"format\": \"{COST_MODEL_FORMAT}\", found {found!r};"
                " recreate it with `mimo-accel calibrate`"
            )
        unknown = sorted(set(doc) - {"format", "a", "b", "c", "fit"})
        if unknown:
            raise ValueError(
                f"{path}: unknown keys {unknown}; a cost model has a, b, c and an optional"
                " \"fit\" object for metadata"
            )
        missing = [k for k in ("a", "b", "c") if k not in doc]
        if missing:
            raise ValueError(f"{path}: missing coefficients {missing}")
        try:
            return cls(a=doc["a"], b=doc["b"], c=doc["c"], fit=doc.get("fit", {}))
        except ValueError as exc:
            raise ValueError(f"{path}: {exc}") from None


# --------------------------------------------------------------------------------------------
# Cost index
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SampleShape:
    """What the cost of a sample depends on: its images' (height, width) and its real tokens."""

    image_sizes: tuple[tuple[int, int], ...]
    tokens: int

    def __post_init__(self) -> None:
        sizes = []
        for given in self.image_sizes:
            try:
                h, w = (int(x) for x in given)
                ok = h >= 1 and w >= 1 and (h, w) == tuple(given)
            except (TypeError, ValueError):
                ok = False
            if not ok:
                raise ValueError(f"image size must be two positive integers (height, width), got {given!r}")
            sizes.append((h, w))
        tokens = self.tokens
        if isinstance(tokens, bool) or not isinstance(tokens, (int, np.integer)) or tokens < 0:
            raise ValueError(f"tokens must be a non-negative integer, got {tokens!r}")
        object.__setattr__(self, "image_sizes", tuple(sizes))
        object.__setattr__(self, "tokens", int(tokens))


class CostIndex:
    """Per-sample cost ingredients of a whole dataset, for costing without decoding.

    Holds, per sample: total patches Σp_i, Σp_i², real tokens and image count, plus the
    :class:`ResizeRule` they were computed with. Costs are a :class:`CostModel` away, so a new
    calibration needs no rebuild.
    """

    __slots__ = ("_patches", "_sq_patches", "_tokens", "_images", "rule")

    def __init__(
        self,
        patches: Any,
        sq_patches: Any,
        tokens: Any,
        images: Any,
        rule: ResizeRule | FixedPatches,
    ) -> None:
        arrays = {}
        for name, values in (("patches", patches), ("sq_patches", sq_patches), ("tokens", tokens), ("images", images)):
            a = np.asarray(values)
            if a.ndim != 1 or (a.size and a.dtype.kind not in "iu"):
                raise ValueError(f"cost index: {name} must be a 1-D integer array; {_REBUILD_HINT}")
            a = a.astype(np.int64)
            if (a < 0).any():
                raise ValueError(f"cost index: {name} has negative entries; {_REBUILD_HINT}")
            a.setflags(write=False)
            arrays[name] = a
        lengths = {name: a.size for name, a in arrays.items()}
        if len(set(lengths.values())) > 1:
            raise ValueError(f"cost index: arrays differ in length {lengths}; {_REBUILD_HINT}")
        p, q, n = arrays["patches"], arrays["sq_patches"], arrays["images"]
        # Σp² >= Σp for positive patch counts, and patches exist iff images do.
        if (q < p).any() or ((p > 0) != (n > 0)).any():
            raise ValueError(f"cost index: inconsistent patch/image counts; {_REBUILD_HINT}")
        if not isinstance(rule, (ResizeRule, FixedPatches)):
            raise ValueError(f"cost index: rule must be a ResizeRule or FixedPatches, got {type(rule).__name__}")
        self._patches, self._sq_patches = p, q
        self._tokens, self._images = arrays["tokens"], n
        self.rule = rule

    @classmethod
    def from_shapes(cls, shapes: Sequence[SampleShape], rule: ResizeRule | FixedPatches | None = None) -> CostIndex:
        """Build the index from per-sample shapes (e.g. read with :func:`image_size_from_header`)."""
        rule = ResizeRule() if rule is None else rule
        counts = np.fromiter((len(s.image_sizes) for s in shapes), dtype=np.int64, count=len(shapes))
        tokens = np.fromiter((s.tokens for s in shapes), dtype=np.int64, count=len(shapes))
        hw = np.array([size for s in shapes for size in s.image_sizes], dtype=np.int64).reshape(-1, 2)
        per_image = rule.patches_many(hw[:, 0], hw[:, 1])
        owner = np.repeat(np.arange(len(shapes)), counts)
        patches = np.zeros(len(shapes), dtype=np.int64)
        sq_patches = np.zeros(len(shapes), dtype=np.int64)
        np.add.at(patches, owner, per_image)
        np.add.at(sq_patches, owner, per_image * per_image)
        return cls(patches, sq_patches, tokens, counts, rule)

    def __len__(self) -> int:
        return int(self._patches.size)

    def _lookup(self, indices: Any) -> np.ndarray:
        idx = np.asarray(indices)
        if idx.size == 0:
            return idx.astype(np.int64)
        if idx.dtype.kind not in "iu":
            raise TypeError(f"sample indices must be integers, got dtype {idx.dtype}")
        bad = (idx < 0) | (idx >= len(self))
        if bad.any():
            first = int(idx[bad].flat[0])
            raise IndexError(
                f"sample index {first} is out of range for a cost index of {len(self)} samples;"
                f" the dataset no longer matches the index, {_REBUILD_HINT}"
            )
        return idx

    def costs(self, indices: Any, model: CostModel) -> np.ndarray:
        """Costs of the samples at ``indices`` under ``model`` (float64, finite, >= 0)."""
        i = self._lookup(indices)
        return model.costs_from_sums(self._patches[i], self._sq_patches[i], self._tokens[i])

    def patches(self, indices: Any) -> np.ndarray:
        """Total vision patches of each sample."""
        return self._patches[self._lookup(indices)]

    def sq_patches(self, indices: Any) -> np.ndarray:
        """Sum of squared per-image patch counts of each sample (the attention term)."""
        return self._sq_patches[self._lookup(indices)]

    def images(self, indices: Any) -> np.ndarray:
        """Number of images of each sample."""
        return self._images[self._lookup(indices)]

    def tokens(self, indices: Any) -> np.ndarray:
        """Real language tokens of each sample."""
        return self._tokens[self._lookup(indices)]

    def digest(self) -> str:
        """A hex SHA-256 of the rule and every array: equal digests, equal indexes (and plans)."""
        h = hashlib.sha256(json.dumps(self.rule.to_dict(), sort_keys=True).encode())
        for a in (self._patches, self._sq_patches, self._tokens, self._images):
            h.update(np.ascontiguousarray(a, dtype="<i8").tobytes())
        return h.hexdigest()

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the index as one ``.npz`` file at exactly ``path`` (atomically replaced)."""
        header = {"format": COST_INDEX_FORMAT, "length": len(self), "rule": self.rule.to_dict()}
        path = Path(path)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                np.savez(
                    f,
                    header=np.array(json.dumps(header, sort_keys=True)),
                    patches=self._patches,
                    sq_patches=self._sq_patches,
                    tokens=self._tokens,
                    images=self._images,
                )
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> CostIndex:
        """Read an index written by :meth:`save`; anything malformed raises ValueError."""
        path = Path(path)
        names = ("header", "patches", "sq_patches", "tokens", "images")
        try:
            data = np.load(path, allow_pickle=False)
            if not isinstance(data, np.lib.npyio.NpzFile):
                raise ValueError("a bare .npy array")
            with data:
                missing = [k for k in names if k not in data.files]
                arrays = {k: data[k] for k in names if k not in missing}
        except (ValueError, EOFError, zipfile.BadZipFile, zlib.error) as exc:
            # Not an .npz, a damaged one, or pickled objects that are never executed.
            raise ValueError(f"{path}: not a cost index ({exc}); {_REBUILD_HINT}") from None
        if missing:
            raise ValueError(f"{path}: cost index lacks arrays {missing}; {_REBUILD_HINT}")
        try:
            header = json.loads(str(arrays.pop("header")))
            fmt, length, rule = header["format"], header["length"], header["rule"]
        except (json.JSONDecodeError, KeyError, TypeError):
            raise ValueError(f"{path}: cost index header is malformed; {_REBUILD_HINT}") from None
        if fmt != COST_INDEX_FORMAT:
            raise ValueError(f"{path}: expected format {COST_INDEX_FORMAT!r}, found {fmt!r}; {_REBUILD_HINT}")
        try:
            index = cls(**arrays, rule=rule_from_dict(rule))
        except (ValueError, TypeError) as exc:
            raise ValueError(f"{path}: {exc}") from None
        if len(index) != length:
            raise ValueError(f"{path}: header says {length} samples, arrays hold {len(index)}; {_REBUILD_HINT}")
        return index


def _atomic_write(path: Path, data: bytes) -> None:
    # Other ranks may read the file while it is rewritten: never expose a half-written one.
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


# --------------------------------------------------------------------------------------------
# Image headers
# --------------------------------------------------------------------------------------------


def image_size_from_header(path: str | os.PathLike[str]) -> tuple[int, int]:
    """``(height, width)`` of a PNG, JPEG, GIF, BMP or WebP file, read from its header only.

    The built-in parser is used first so results do not depend on whether Pillow is installed;
    Pillow (lazy ``Image.open``, no decode) is only a fallback for other formats. EXIF rotation is
    not applied: it swaps height and width but leaves the patch count unchanged.
    """
    path = Path(path)
    with open(path, "rb") as f:
        head = f.read(64)
        try:
            size = _parse_header(f, head)
        except (struct.error, IndexError):
            raise ValueError(f"{path}: image header is truncated") from None
        except ValueError as exc:
            raise ValueError(f"{path}: {exc}") from None
    if size is not None:
        return size
    try:
        from PIL import Image
    except ImportError:
        raise ValueError(
            f"{path}: not a PNG, JPEG, GIF, BMP or WebP file; install Pillow to read other formats"
        ) from None
    try:
        with Image.open(path) as im:
            width, height = im.size
    except Exception as exc:  # Pillow raises many types for unreadable files
        raise ValueError(f"{path}: cannot read image size ({exc})") from None
    return int(height), int(width)


def image_size_from_bytes(data: bytes | bytearray | memoryview, where: str = "image bytes") -> tuple[int, int]:
    """``(height, width)`` of an encoded image held in memory (e.g. an undecoded HF ``Image``
    cell), from its header only; the same formats and fallback as :func:`image_size_from_header`.
    ``where`` names the image in error messages."""
    f = io.BytesIO(data)
    head = f.read(64)
    try:
        size = _parse_header(f, head)
    except (struct.error, IndexError):
        raise ValueError(f"{where}: image header is truncated") from None
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None
    if size is not None:
        return size
    try:
        from PIL import Image
    except ImportError:
        raise ValueError(
            f"{where}: not a PNG, JPEG, GIF, BMP or WebP image; install Pillow to read other formats"
        ) from None
    try:
        f.seek(0)
        with Image.open(f) as im:
            width, height = im.size
    except Exception as exc:  # Pillow raises many types for unreadable data
        raise ValueError(f"{where}: cannot read image size ({exc})") from None
    return int(height), int(width)


def _parse_header(f: Any, head: bytes) -> tuple[int, int] | None:
    """Dimensions from the first bytes (and, for JPEG, the marker chain); None if unknown format."""
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        if head[12:16] != b"IHDR":
            raise ValueError("PNG without IHDR chunk (corrupt file)")
        width, height = struct.unpack(">II", head[16:24])
        return _checked(height, width)
    if head[:6] in (b"GIF87a", b"GIF89a"):
        width, height = struct.unpack("<HH", head[6:10])
        return _checked(height, width)
    if head.startswith(b"BM") and len(head) >= 26:
        (dib_size,) = struct.unpack("<I", head[14:18])
        if dib_size == 12:  # BITMAPCOREHEADER: 16-bit sides
            width, height = struct.unpack("<hh", head[18:22])
        else:
            width, height = struct.unpack("<ii", head[18:26])
        return _checked(abs(height), abs(width))  # negative height = top-down rows
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return _webp_size(head)
    if head[:2] == b"\xff\xd8":
        return _jpeg_size(f)
    return None


def _webp_size(head: bytes) -> tuple[int, int]:
    chunk = head[12:16]
    if chunk == b"VP8 ":  # lossy: 14-bit sides after the 3-byte frame tag and start code
        if head[23:26] != b"\x9d\x01\x2a":
            raise ValueError("WebP VP8 frame without start code (corrupt file)")
        width, height = struct.unpack("<HH", head[26:30])
        return _checked(height & 0x3FFF, width & 0x3FFF)
    if chunk == b"VP8L":  # lossless: signature byte, then 14-bit (side - 1) fields
        if head[20] != 0x2F:
            raise ValueError("WebP VP8L chunk without signature (corrupt file)")
        (bits,) = struct.unpack("<I", head[21:25])
        return _checked(((bits >> 14) & 0x3FFF) + 1, (bits & 0x3FFF) + 1)
    if chunk == b"VP8X":  # extended: 24-bit (side - 1) canvas fields
        width = int.from_bytes(head[24:27], "little") + 1
        height = int.from_bytes(head[27:30], "little") + 1
        return _checked(height, width)
    raise ValueError(f"WebP with unknown first chunk {chunk!r}")


# SOFn markers carry the frame size; C4 (DHT), C8 (JPG) and CC (DAC) share the range but do not.
_JPEG_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
# Markers without a length field.
_JPEG_STANDALONE = frozenset({0x01, *range(0xD0, 0xD9)})


def _jpeg_size(f: Any) -> tuple[int, int]:
    f.seek(2)
    while True:
        byte = f.read(1)
        if not byte:
            raise ValueError("JPEG ended before its frame header (truncated file)")
        if byte != b"\xff":
            raise ValueError("JPEG marker chain is broken (corrupt file)")
        marker = f.read(1)
        while marker == b"\xff":  # fill bytes
            marker = f.read(1)
        if not marker:
            raise ValueError("JPEG ended before its frame header (truncated file)")
        code = marker[0]
        if code in _JPEG_STANDALONE:
            continue
        raw = f.read(2)
        if len(raw) < 2:
            raise ValueError("JPEG ended inside a segment (truncated file)")
        (length,) = struct.unpack(">H", raw)
        if code in _JPEG_SOF:
            body = f.read(5)
            if len(body) < 5:
                raise ValueError("JPEG frame header is truncated")
            _, height, width = struct.unpack(">BHH", body)
            return _checked(height, width)
        if code == 0xDA:  # start of scan before any frame header
            raise ValueError("JPEG has no frame header before its scan data (corrupt file)")
        f.seek(length - 2, os.SEEK_CUR)


def _checked(height: int, width: int) -> tuple[int, int]:
    if height < 1 or width < 1:
        raise ValueError(f"image header gives a zero size ({height}x{width}); the file is corrupt")
    return int(height), int(width)
