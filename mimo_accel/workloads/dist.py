"""The distributions a workload profile draws its samples from (integers, or fixed ``(h, w)`` pairs)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Dist:
    """A distribution of non-negative integers (or of fixed ``(h, w)`` pairs for ``size``).

    ``kind`` is ``fixed``, ``uniform``, ``lognormal`` or ``choice``; ``values``/``p`` hold a
    choice's values and probabilities (a fixed value is a one-value choice).
    """

    kind: str
    values: tuple[Any, ...] = ()
    p: tuple[float, ...] = ()
    low: int = 0
    high: int = 0
    median: float = 0.0
    sigma: float = 0.0

    @property
    def min(self) -> Any:
        return min(self.values) if self.kind in ("fixed", "choice") else self.low

    @property
    def max(self) -> Any:
        return max(self.values) if self.kind in ("fixed", "choice") else self.high

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """``n`` draws: int64 of shape (n,), or (n, 2) for pair values."""
        if self.kind in ("fixed", "choice"):
            values = np.asarray(self.values, dtype=np.int64)
            if len(self.values) == 1:
                return np.repeat(values[:1], n, axis=0)
            return values[rng.choice(len(self.values), size=n, p=np.asarray(self.p))]
        if self.kind == "uniform":
            return rng.integers(self.low, self.high, size=n, endpoint=True, dtype=np.int64)
        x = np.exp(math.log(self.median) + self.sigma * rng.standard_normal(n))
        return np.clip(np.rint(x), self.low, self.high).astype(np.int64)

    def mean(self) -> float:
        """The (approximate, unclamped for lognormal) mean, for summaries."""
        if self.kind in ("fixed", "choice"):
            return float(np.dot(np.asarray(self.values, dtype=np.float64).reshape(len(self.values), -1).prod(1),
                                self.p or (1.0,)))
        if self.kind == "uniform":
            return (self.low + self.high) / 2
        return self.median * math.exp(self.sigma**2 / 2)
