"""Plan-before-read reordering: the canonical-group order of a global micro-batch, from costs that
every rank can compute without decoding a sample (a per-sample cost index).

Every rank of every module derives the same plan from the same global indices and the same
index, so vision replica r and the language replica(s) it feeds read the same samples in the same
order, and no sample byte moves between ranks. Pure: numpy only.
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from mimo_accel.balance import balanced_order, spread
from mimo_accel.costs import CostIndex, CostModel


class CostIndexPlanner:
    """``planner(global_indices) -> (indices in canonical-group order, predicted spread)``."""

    def __init__(self, index: CostIndex, model: CostModel, grid: int):
        self.index = index
        self.model = model
        self.grid = grid

    def costs(self, indices: Sequence[int]) -> np.ndarray:
        costs = self.index.costs(np.asarray(indices, dtype=np.int64), self.model)
        if not np.all(np.isfinite(costs)) or np.any(costs < 0):
            raise ValueError("mimo_accel reorder: the cost index produced NaN/negative/inf costs; "
                             "rebuild it with `mimo-accel index`")
        return costs

    def __call__(self, indices: Sequence[int]) -> tuple[list[int], Optional[float]]:
        costs = self.costs(indices)
        order = balanced_order(costs, self.grid)
        return [indices[p] for p in order], float(spread(costs, order, self.grid))


def cost_index_for(dataset, path: Optional[str]) -> CostIndex:
    """The cost index of ``dataset``: the configured file, or the one the dataset carries."""
    if path is not None:
        index = CostIndex.load(path)
    else:
        index = getattr(dataset, "mimo_accel_cost_index", None)
        if index is None:
            raise ValueError(
                "mimo_accel reorder (plan mode) needs per-sample costs before reading: build a cost "
                "index with `mimo-accel index` and pass enable(cost_index=PATH) / MIMO_ACCEL_COST_INDEX, "
                f"or give the dataset ({type(dataset).__name__}) a `mimo_accel_cost_index` attribute.")
    if len(index) < len(dataset):
        raise ValueError(f"mimo_accel reorder: the cost index covers {len(index)} samples but the dataset "
                         f"has {len(dataset)}; rebuild it with `mimo-accel index`")
    return index


def cost_model_for(path: Optional[str]) -> CostModel:
    return CostModel.from_file(path) if path is not None else CostModel()
