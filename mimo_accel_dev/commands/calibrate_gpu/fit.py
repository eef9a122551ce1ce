"""Each module's cost curve fitted from its measured points (weighted non-negative least squares)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from mimo_accel.costs import CostModel, ModuleCost
from mimo_accel.costs.fit import SingularDesign, fit_costs
from mimo_accel.modules import LANGUAGE
from mimo_accel_dev.commands.calibrate_gpu.points import LanguagePoint, MeasureError, PROG, VISION, VisionPoint

# --------------------------------------------------------------------------------------- fit

# (coefficient, feature, units): the model's terms, then terms fitted but not written (nuisance)
VISION_TERMS = (("a", "rows", "s / row"), ("b", "Σ rows²", "s / row²"), ("k", "items", "s / image"))
LANGUAGE_TERMS = (("a", "tokens", "s / token"), ("b", "Σ tokens²", "s / token²"))
# The measured block's per-sequence work (megatron's unfused THD RoPE splits per sequence; without
# varlen attention, one SDPA call each): a TE job's fused THD kernels have none, and the language
# cost has no per-sample term, so it is fitted to keep it out of a and b, and not written.
LANGUAGE_NUISANCE = (("per_sequence", "sequences", "s / sequence"),)


@dataclass(frozen=True)
class ModuleFit:
    """One module's fitted curve: ``coefficients`` (a, b[, k]) in seconds, what is fitted but not
    in the model (``nuisance``; the per-call ``overhead_s``), and how well it explains the points."""

    module: str
    coefficients: dict[str, float]
    overhead_s: float
    r2: float
    rel_rmse: float
    max_rel_err: float
    n: int
    predicted: tuple[float, ...]
    nuisance: dict[str, float] = dataclasses.field(default_factory=dict)

    def predict(self, features: Sequence[float]) -> float:
        """One call's time (s) at a point's ``features()``, overhead included."""
        w = [*self.coefficients.values(), *self.nuisance.values()]
        return float(np.dot(np.asarray(features, dtype=np.float64)[:len(w)], w) + self.overhead_s)

    def meta(self) -> dict[str, Any]:
        return {"r2": self.r2, "rel_rmse": self.rel_rmse, "max_rel_err": self.max_rel_err, "n": self.n,
                "overhead_s": self.overhead_s, **{f"{k}_s": v for k, v in self.nuisance.items()},
                "units": "seconds", "weights": "1/time"}


def _fit_curve(module: str, x: np.ndarray, y: np.ndarray, terms, nuisance=()) -> ModuleFit:
    """NNLS of ``y ≈ x·w + overhead`` on relative error (rows weighted 1/y); ``x``'s columns are
    ``terms`` then ``nuisance``."""
    names = [t[0] for t in (*terms, *nuisance)]
    n = y.size
    if n < len(names) + 2:
        raise MeasureError(f"{module}: {n} points cannot fit {len(names)} terms and an overhead with a check; "
                           f"need at least {len(names) + 2}")
    if not (np.isfinite(y).all() and (y > 0).all()):
        raise MeasureError(f"{module}: every measured time must be finite and > 0, got {y.tolist()}")
    try:
        fit = fit_costs(x[:, :len(names)], y, relative=True)
    except SingularDesign:
        features = ", ".join(t[1] for t in (*terms, *nuisance))
        raise MeasureError(f"{module}: the points cannot separate {features} and the overhead (a singular design); "
                           "measure points that vary them independently") from None
    w, pred = fit.coefficients, fit.predicted
    rel = (pred - y) / y
    return ModuleFit(module=module, coefficients={t[0]: float(v) for t, v in zip(terms, w)},
                     nuisance={t[0]: float(v) for t, v in zip(nuisance, w[len(terms):])},
                     overhead_s=fit.overhead, r2=fit.r2,
                     rel_rmse=float(np.sqrt((rel ** 2).mean())), max_rel_err=float(np.abs(rel).max()), n=n,
                     predicted=tuple(float(p) for p in pred))


def fit_vision(points: Sequence[VisionPoint], seconds: Sequence[float], module: str = VISION) -> ModuleFit:
    """The encoder's ``a·rows + b·Σrows² + k·items`` (+ overhead) from per-point times (s)."""
    x = np.array([p.features() for p in points], dtype=np.float64).reshape(-1, 3)
    return _fit_curve(module, x, np.asarray(seconds, dtype=np.float64), VISION_TERMS)


def fit_language(points: Sequence[LanguagePoint], seconds: Sequence[float], module: str = LANGUAGE) -> ModuleFit:
    """The language model's ``a·tokens + b·Σtokens²`` (+ a per-sequence term and an overhead, not
    in the model) from per-point times (s)."""
    x = np.array([p.features() for p in points], dtype=np.float64).reshape(-1, 3)
    return _fit_curve(module, x, np.asarray(seconds, dtype=np.float64), LANGUAGE_TERMS, LANGUAGE_NUISANCE)


def model_from_fits(vision: ModuleFit, language: ModuleFit, *, language_scale: float = 1.0,
                    meta: Optional[dict[str, Any]] = None) -> CostModel:
    """The v2 cost model: the vision encoder's (a, b, k) under ``vision.module``, the language
    model's (a, b) × ``language_scale`` (measured layers → the whole decoder) under ``language``;
    the default encoder coefficients (a, b) are the vision encoder's, as ``mimo-accel calibrate``
    writes them."""
    v, lm = vision.coefficients, language.coefficients
    modules = {vision.module: ModuleCost(v["a"], v["b"], v["k"]),
               LANGUAGE: ModuleCost(lm["a"] * language_scale, lm["b"] * language_scale)}
    fit_meta = {"units": "seconds", "source": PROG, **(meta or {}),
                "modules": {vision.module: vision.meta(), LANGUAGE: {**language.meta(), "scale": language_scale}}}
    return CostModel(a=v["a"], b=v["b"], fit=fit_meta, modules=modules)
