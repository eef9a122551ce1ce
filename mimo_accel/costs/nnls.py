"""Exact non-negative least squares for the few columns a cost model has (pure numpy).

Used by every fit of a cost model: ``mimo-accel calibrate`` (profiler logs), ``mimo-accel
calibrate-gpu`` (measured points) and the online calibration (:mod:`mimo_accel.costs.online`).
"""

from __future__ import annotations

import itertools

import numpy as np

__all__ = ["nnls"]

MAX_COLUMNS = 6  # 2**6 supports: exact and still instant


def nnls(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Exact non-negative least squares for a few columns: ``argmin ||x·w - y||, w >= 0``.

    The optimum is the unconstrained least-squares solution on its own support, so trying every
    support (2^k for k columns, k <= 6 here) and keeping the best feasible one is exact. The
    supports are tried in a fixed order, so the same input gives bit-identical output.
    """
    n, k = x.shape
    if k > MAX_COLUMNS:
        raise ValueError(f"nnls: at most {MAX_COLUMNS} columns")
    best_w, best_rss = np.zeros(k), float(y @ y)
    for size in range(1, k + 1):
        for cols in itertools.combinations(range(k), size):
            sub = x[:, cols]
            w, *_ = np.linalg.lstsq(sub, y, rcond=None)
            if (w < 0).any():
                continue
            r = y - sub @ w
            rss = float(r @ r)
            if rss < best_rss * (1 - 1e-12):
                best_rss = rss
                best_w = np.zeros(k)
                best_w[list(cols)] = w
    return best_w
