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
    """``planner(global_indices) -> (indices in canonical-group order, predicted spread)``.

    Balances vision cost over the *vision replicas* (``vision_groups``): G canonical groups when
    vision DP is the largest DP (fan-in, 1:1). In fan-out (language DP > vision DP, G > vision
    DP) balancing the G finer groups is a harder constraint that leaves the vision replicas less
    balanced, so each vision replica's block is balanced first and then cut into its G/vision
    language groups by real language tokens (the language model's load). Both modules derive the
    same order, and a vision replica's block is still exactly the groups its language peers own.
    """

    def __init__(self, index: CostIndex, model: CostModel, grid: int, vision_groups: Optional[int] = None):
        self.index = index
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
            from mimo_accel.notices import say_once

            say_once("reorder:equal-costs", "mimo_accel reorder: every sample of a global micro-batch has "
                     "the same vision cost (the cost index sees no images or no size differences), so "
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


SPLIT_FIELD = "{split}"


def cost_index_for(dataset, path: Optional[str], split: str = "train", group=None) -> CostIndex:
    """The cost index of one split's dataset.

    ``path`` with ``{split}`` in it names one file per split (``train``, ``validation``, ``test``);
    a plain path is the train split's index only — an index never describes two datasets. Without
    a file: the index the dataset carries (``mimo_accel_cost_index``), else one derived from the
    dataset's raw examples (:func:`mimo_accel.datasets.derive_cost_index`; every rank of ``group``
    probes its share, cached on disk).
    """
    if path is not None and (SPLIT_FIELD in path or split == "train"):
        index = CostIndex.load(path.replace(SPLIT_FIELD, split))
    else:
        from mimo_accel.datasets import DeriveError, derive_cost_index

        try:
            index = derive_cost_index(dataset, group=group)
        except DeriveError as exc:
            if path is None:
                raise
            raise DeriveError(f"{exc}\nThe configured cost index {path!r} is the train split's; name one "
                              f"file per split with '{SPLIT_FIELD}' in the path (e.g. costs-{SPLIT_FIELD}.npz)"
                              f" to give the {split} split its own.") from exc
    if len(index) < len(dataset):
        raise ValueError(f"mimo_accel reorder: the {split} cost index covers {len(index)} samples but the "
                         f"dataset has {len(dataset)}; rebuild it with `mimo-accel index`")
    return index


def index_digest(index: CostIndex) -> str:
    """What every rank's plan reads from a cost index, hashed (compared across ranks)."""
    import dataclasses
    import hashlib

    everything = np.arange(len(index))
    h = hashlib.sha256(repr(dataclasses.astuple(index.rule)).encode())
    for column in (index.patches(everything), index.sq_patches(everything), index.tokens(everything),
                   index.images(everything)):
        h.update(np.ascontiguousarray(column, dtype=np.int64).tobytes())
    return h.hexdigest()[:16]


def cost_model_for(path: Optional[str]) -> CostModel:
    return CostModel.from_file(path) if path is not None else CostModel()
