"""Plan-before-read reordering: the canonical-group order of a global micro-batch, from costs that
every rank can compute without decoding a sample (a per-sample cost index).

Every rank of every module derives the same plan from the same global indices and the same
index, so vision replica r and the language replica(s) it feeds read the same samples in the same
order, and no sample byte moves between ranks. Pure: numpy only.
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import numpy as np

from mimo_accel.balance import balanced_order, spread
from mimo_accel.costs import CostIndex, CostModel


class CostIndexPlanner:
    """``planner(global_indices) -> (indices in canonical-group order, predicted spread)``.

    Balances vision cost over the *vision replicas* (``vision_groups``): G canonical groups when
    vision DP is the largest DP (fan-in, 1:1). In fan-out (language DP > vision DP, G > vision
    DP) balancing the G finer groups is a harder constraint that leaves the vision replicas less
    balanced, so each vision replica's block is balanced first and then cut into its G/vision
    language groups by real language tokens (the language model's load). Both modules derive the
    same order, and a vision replica's block is still exactly the groups its language peers own.
    """

    def __init__(self, index: CostIndex, model: CostModel, grid: int, vision_groups: Optional[int] = None,
                 notify: Optional[Callable[[str, str], object]] = None):
        self.index = index
        self.notify = notify  # say_once(key, message): what the plan could not act on, said once
        self.model = model
        self.grid = grid
        self.vision_groups = vision_groups or grid
        if grid % self.vision_groups:
            raise ValueError(f"vision DP {self.vision_groups} must divide the canonical grid {grid}")

    def costs(self, indices: Sequence[int]) -> np.ndarray:
        costs = self.index.costs(np.asarray(indices, dtype=np.int64), self.model)
        if not np.all(np.isfinite(costs)) or np.any(costs < 0):
            raise ValueError("mimo_accel reorder: the cost index produced NaN/negative/inf costs; "
                             "rebuild it with `mimo-accel index`")
        return costs

    def __call__(self, indices: Sequence[int], micro_batches: int = 1) -> tuple[list[int], Optional[float]]:
        """Plan ``micro_batches`` consecutive global micro-batches together (a window): the
        result's j-th block of len/micro_batches samples is micro-batch j, cut into G groups."""
        costs = self.costs(indices)
        if costs.size and np.all(costs == costs[0]):
            if self.notify is not None:
                self.notify("reorder:equal-costs", "mimo_accel reorder: every sample of a global micro-batch "
                            "has the same vision cost (the cost index sees no images or no size differences), so "
                            "there is nothing to balance: keeping the contiguous split where that happens")
            return list(indices), 1.0
        v = self.vision_groups * micro_batches
        order = balanced_order(costs, v)
        if self.grid > self.vision_groups:
            per, k = len(order) // v, self.grid // self.vision_groups
            tokens = self.index.tokens(np.asarray(indices, dtype=np.int64)).astype(np.float64)
            refined = []
            for b in range(v):
                block = order[b * per:(b + 1) * per]
                refined += [block[i] for i in balanced_order(tokens[block], k)]
            order = refined
        return [indices[p] for p in order], float(spread(costs, order, v))


def cost_model_for(path: Optional[str]) -> CostModel:
    return CostModel.from_file(path) if path is not None else CostModel()
