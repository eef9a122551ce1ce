"""Cost of a decoded sample for every module: from what every module decodes (each encoder's
``grid_thw``, the real tokens), so encoder and language ranks compute the same costs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Optional

import torch

from mimo_accel.costs import CostModel
from mimo_accel.modules import LANGUAGE

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


def _rows(grid) -> tuple[int, int, int]:
    """(rows, Σ rows², items) of a ``grid_thw`` ([items, 3]: t, h, w per image)."""
    if grid is None:
        return 0, 0, 0
    g = torch.as_tensor(grid)
    if not g.numel():
        return 0, 0, 0
    if g.dim() != 2 or g.size(-1) != 3 or g.is_floating_point() or bool((g < 0).any()):
        raise ValueError(f"malformed grid_thw {tuple(g.shape)} (want [images, 3] non-negative "
                         "integers t, h, w per image)")
    rows = [t * h * w for t, h, w in g.tolist()]
    return sum(rows), sum(r * r for r in rows), len(rows)


def _real_tokens(sample: Any) -> int:
    mask = sample.get("attention_mask") if isinstance(sample, Mapping) else None
    if isinstance(mask, torch.Tensor):
        return int(mask.sum())
    ids = sample.get("input_ids") if isinstance(sample, Mapping) else None
    return int(ids.numel()) if isinstance(ids, torch.Tensor) else 0


class DecodedModuleCosts:
    """Every module's cost of one decoded sample under a :class:`~mimo_accel.costs.CostModel`,
    as plan-before-read prices it from a cost index: an encoder ``a·rows + b·Σ rows² + k·items``
    from its own ``grid_thw`` (looked up under ``modality_inputs[<module>]``, or, with one encoder
    in the layout, anywhere in the sample as ``grid_thw`` / ``image_grid_thw``), the language model
    ``a·tokens + b·tokens²`` from the real tokens (the attention mask's sum, else the input ids).
    ``self(sample)`` -> module name -> cost."""

    def __init__(self, modules: Sequence[str], model: Optional[CostModel] = None):
        self.modules = tuple(modules)
        self.model = CostModel() if model is None else model
        self._encoders = [m for m in self.modules if m != LANGUAGE]

    def _grid(self, sample: Any, module: str):
        inputs = sample.get("modality_inputs") if isinstance(sample, Mapping) else None
        if isinstance(inputs, Mapping) and module in inputs:
            return _find_key(inputs[module], _GRID_KEYS)
        return _find_key(sample, _GRID_KEYS) if len(self._encoders) == 1 else None

    def __call__(self, sample: Any) -> dict[str, float]:
        out = {}
        for m in self.modules:
            if m == LANGUAGE:
                out[m] = float(self.model.language_costs([_real_tokens(sample)])[0])
            else:
                rows, sq_rows, items = _rows(self._grid(sample, m))
                out[m] = float(self.model.encoder_costs(m, [rows], [sq_rows], [items])[0])
        return out

