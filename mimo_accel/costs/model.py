"""What a sample costs to encode, from its images' patch counts and its tokens (a fitted model, and
its JSON file)."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mimo_accel.costs._files import atomic_write

__all__ = ["CostModel"]

COST_MODEL_FORMAT = "mimo-accel-cost-model/1"


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
        atomic_write(Path(path), (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode())

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
