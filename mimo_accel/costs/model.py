"""What a sample costs each module of the layout (a fitted model, and its JSON file).

An encoder: ``a·rows + b·sq_rows + k·items`` over the sample's items of that modality (``rows``
before merging, ``sq_rows`` Σ rows² over the items: its attention). The language model:
``a·tokens + b·tokens² + k`` over the real tokens, default a = 1, b = 1/8192, k = 0; ``k`` is what
a sample costs whatever its length (its share of a micro-batch's fixed work). An encoder without
an entry of its own is priced by the default encoder coefficients ``a``, ``b`` (k = 0).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mimo_accel.costs.files import atomic_write
from mimo_accel.modules import LANGUAGE

__all__ = ["CostModel", "ModuleCost"]

COST_MODEL_FORMAT = "mimo-accel-cost-model/3"
LANGUAGE_A, LANGUAGE_B = 1.0, 1.0 / 8192  # the language model's L + L²/8192


def _check_coefficient(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ValueError(f"CostModel.{name} must be a number, got {value!r}")
    value = float(value)
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"CostModel.{name} must be finite and >= 0, got {value!r}")
    return value


@dataclass(frozen=True)
class ModuleCost:
    """One module's coefficients: an encoder's ``a·rows + b·sq_rows + k·items``, the language
    model's ``a·tokens + b·tokens² + k`` (k per sample)."""

    a: float
    b: float
    k: float = 0.0

    def __post_init__(self) -> None:
        for name in ("a", "b", "k"):
            object.__setattr__(self, name, _check_coefficient(name, getattr(self, name)))

    def encoder_costs(self, rows: Any, sq_rows: Any, items: Any) -> np.ndarray:
        """Per-sample costs from the samples' rows, Σ rows² and item counts (all >= 0)."""
        r, q, n = (np.asarray(x, dtype=np.float64) for x in (rows, sq_rows, items))
        if (r < 0).any() or (q < 0).any() or (n < 0).any():
            raise ValueError("row, squared-row and item counts must be >= 0")
        with np.errstate(over="ignore"):
            out = self.a * r + self.b * q + self.k * n
        return _finite(out)

    def language_costs(self, tokens: Any) -> np.ndarray:
        """Per-sample costs from the samples' real tokens (>= 0)."""
        t = np.asarray(tokens, dtype=np.float64)
        if (t < 0).any():
            raise ValueError("token counts must be >= 0")
        with np.errstate(over="ignore"):
            out = self.a * t + self.b * t * t + self.k
        return _finite(out)

    def to_dict(self) -> dict[str, float]:
        return {"a": self.a, "b": self.b, "k": self.k}


def _finite(out: np.ndarray) -> np.ndarray:
    if not np.isfinite(out).all():
        raise ValueError("a sample cost overflowed to infinity; the counts are implausibly large")
    return out


def _module_table(modules: Any) -> dict[str, ModuleCost]:
    if not isinstance(modules, Mapping):
        raise ValueError(f"CostModel.modules must map module names to ModuleCost, got {type(modules).__name__}")
    out = {}
    for name, cost in modules.items():
        if not isinstance(name, str) or not name:
            raise ValueError(f"CostModel.modules: module names must be non-empty strings, got {name!r}")
        if isinstance(cost, Mapping):
            unknown = sorted(set(cost) - {"a", "b", "k"})
            if unknown or not {"a", "b"} <= set(cost):
                raise ValueError(f"CostModel.modules[{name!r}] needs a and b (and optionally k), got keys "
                                 f"{sorted(cost)}")
            cost = ModuleCost(**cost)
        if not isinstance(cost, ModuleCost):
            raise ValueError(f"CostModel.modules[{name!r}] must be a ModuleCost, got {type(cost).__name__}")
        out[name] = cost
    return out


@dataclass(frozen=True)
class CostModel:
    """What a sample costs each module: ``modules`` maps module names to their :class:`ModuleCost`;
    an encoder without an entry is priced ``a·rows + b·sq_rows`` (the default encoder), the
    language model without one ``tokens + tokens²/8192`` (:meth:`of`).

    For an encoder's items of ``p_i`` rows (patches), the linear term is its MLP and projection
    work, the quadratic term its full attention over each item. The default ``a``, ``b`` mirror a
    CPU measurement of a vision encoder, t ≈ 6.6e-5·N + 6.1e-8·Σp_i² s, i.e. b/a ≈ 9.2e-4, in units
    of ``a``. ``fit`` carries optional fit-quality metadata (e.g. ``r2``, ``n``) from calibration.
    """

    a: float = 1.0
    b: float = 0.0009
    fit: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)
    modules: Mapping[str, ModuleCost] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        for name in ("a", "b"):
            object.__setattr__(self, name, _check_coefficient(name, getattr(self, name)))
        if not isinstance(self.fit, Mapping):
            raise ValueError(f"CostModel.fit must be a mapping, got {type(self.fit).__name__}")
        object.__setattr__(self, "fit", dict(self.fit))  # a private copy; stays picklable
        object.__setattr__(self, "modules", _module_table(self.modules))

    def of(self, module: str) -> ModuleCost:
        """The coefficients that price ``module``: its own entry, else the default encoder's
        (``a``, ``b``) or the language model's (1, 1/8192)."""
        if module in self.modules:
            return self.modules[module]
        if module == LANGUAGE:
            return ModuleCost(LANGUAGE_A, LANGUAGE_B)
        return ModuleCost(self.a, self.b)

    def encoder_costs(self, module: str, rows: Any, sq_rows: Any, items: Any) -> np.ndarray:
        """Encoder ``module``'s per-sample costs."""
        return self.of(module).encoder_costs(rows, sq_rows, items)

    def language_costs(self, tokens: Any, module: str = LANGUAGE) -> np.ndarray:
        """The language model's per-sample costs from real tokens."""
        return self.of(module).language_costs(tokens)

    def to_doc(self) -> dict[str, Any]:
        """The model as the JSON object :meth:`to_file` writes."""
        doc: dict[str, Any] = {"format": COST_MODEL_FORMAT, "a": self.a, "b": self.b,
                               "modules": {name: cost.to_dict() for name, cost in sorted(self.modules.items())}}
        if self.fit:
            doc["fit"] = dict(self.fit)
        return doc

    def to_file(self, path: str | os.PathLike[str]) -> None:
        """Write the model as JSON (format ``mimo-accel-cost-model/3``: a, b, the ``modules`` table,
        the ``fit`` metadata)."""
        atomic_write(Path(path), (json.dumps(self.to_doc(), indent=2, sort_keys=True) + "\n").encode())

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> CostModel:
        """Read a model written by :meth:`to_file`; a malformed file, or one of another format,
        raises ValueError naming the command that recreates it."""
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
        unknown = sorted(set(doc) - {"format", "a", "b", "fit", "modules"})
        if unknown:
            raise ValueError(
                f"{path}: unknown keys {unknown}; a cost model has a, b, a \"modules\" table and an optional "
                "\"fit\" object for metadata"
            )
        missing = [k for k in ("a", "b") if k not in doc]
        if missing:
            raise ValueError(f"{path}: missing coefficients {missing}")
        try:
            return cls.from_doc(doc)
        except (ValueError, TypeError) as exc:
            raise ValueError(f"{path}: {exc}") from None

    @classmethod
    def from_doc(cls, doc: dict[str, Any]) -> CostModel:
        """The model of a JSON object :meth:`to_doc` made (its coefficients checked, not its keys)."""
        return cls(a=doc["a"], b=doc["b"], fit=doc.get("fit", {}), modules=doc.get("modules", {}))
