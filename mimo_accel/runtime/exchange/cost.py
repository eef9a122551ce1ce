"""Cost of a decoded sample: what every module decodes (``grid_thw``, real tokens), so vision and
language ranks compute the same cost."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Optional

import torch

from mimo_accel.costs import CostModel

_GRID_KEYS = ("grid_thw", "image_grid_thw")


def _find_key(obj: Any, keys: Sequence[str], depth: int = 0) -> Any:
    if not isinstance(obj, Mapping) or depth > 4:
        return None
    for k in keys:
        if k in obj:
            return obj[k]
    for v in obj.values():
        found = _find_key(v, keys, depth + 1)
        if found is not None:
            return found
    return None


class DecodedSampleCost:
    """Vision cost of one decoded sample under a :class:`~mimo_accel.costs.CostModel`.

    Image patch counts are the rows' ``t·h·w`` of the sample's ``grid_thw`` (looked up as
    ``grid_thw`` or ``image_grid_thw``, at the top level or inside nested dicts such as
    ``modality_inputs``; a sample without one has no images). Real tokens are the sum of
    ``attention_mask`` when present, else the number of ``input_ids``. Both are what every module
    decodes, so vision and language ranks compute the same cost.
    """

    def __init__(self, model: Optional[CostModel] = None):
        self.model = CostModel() if model is None else model

    def __call__(self, sample: Any) -> float:
        grid = _find_key(sample, _GRID_KEYS)
        p_sum = p_sq = 0
        if grid is not None:
            g = torch.as_tensor(grid)
            if g.numel():
                if g.dim() != 2 or g.size(-1) != 3 or g.is_floating_point() or bool((g < 0).any()):
                    raise ValueError(f"malformed grid_thw {tuple(g.shape)} (want [images, 3] non-negative "
                                     "integers t, h, w per image)")
                for t, h, w in g.tolist():
                    p = t * h * w
                    p_sum += p
                    p_sq += p * p
        mask = sample.get("attention_mask") if isinstance(sample, Mapping) else None
        if isinstance(mask, torch.Tensor):
            tokens = int(mask.sum())
        else:
            ids = sample.get("input_ids") if isinstance(sample, Mapping) else None
            tokens = int(ids.numel()) if isinstance(ids, torch.Tensor) else 0
        # CostModel.costs_from_sums' arithmetic in Python floats (the same float64 result, without
        # numpy's per-call overhead on one sample).
        m = self.model
        cost = m.a * float(p_sum) + m.b * float(p_sq) + m.c * float(tokens)
        if not math.isfinite(cost):
            raise ValueError("the sample cost overflowed to infinity; its counts are implausibly large")
        return cost
