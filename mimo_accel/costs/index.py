"""The cost index ("plan before read"): per-sample cost ingredients of a whole dataset.

It is built once from dataset metadata or image headers and stored beside the dataset: a planner can
then cost any sample without decoding it.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import zipfile
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mimo_accel.costs._files import file_mode
from mimo_accel.costs.model import CostModel
from mimo_accel.costs.resize import FixedPatches, ResizeRule, rule_from_dict

__all__ = ["CostIndex", "SampleShape"]

COST_INDEX_FORMAT = "mimo-accel-cost-index/1"
_REBUILD_HINT = "rebuild it with `mimo-accel index`"


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
            os.chmod(tmp, file_mode())  # mkstemp's 0600 would hide the file from other accounts
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
