"""The cost model a job starts from when it is given none: each module's model FLOPs.

A plan only needs each module's costs in proportion, and the proportion that decides it is how
an encoder's attention (Σ rows²) weighs against its per-row work, and the language model's
attention against its per-token work. Both follow from the module's Megatron config
(:class:`~mimo_accel.costs.flops.FlopsShape`): ``b/a`` is ``4q/per_token`` per layer, about
``1/(6h)`` for a plain ViT of hidden ``h``. A fixed pair of coefficients fits one width only
(the defaults, ``b/a`` = 9e-4, mirror an encoder about three times as wide as the rehearsal's
Qwen3-VL vision model, whose measured ``b/a`` its FLOPs give within 10-25 %), so a job that
started from them planned with the wrong attention weight until the online calibration
corrected it. A module's step is its forward and backward (3× forward) when trained, its forward
when frozen, so frozen and trained modules compare in one unit too: GFLOPs, the same on every
rank (the config is the job's), which the online calibration scales to seconds as it learns.

Pure: no torch, no megatron.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Optional

from mimo_accel.costs.flops import FlopsShape, passes
from mimo_accel.costs.model import CostModel, ModuleCost

__all__ = ["UNIT", "flops_prior"]

UNIT = 1e9  # coefficients in GFLOPs per row (token) and per row² (token²)


def flops_prior(shapes: Mapping[str, Optional[FlopsShape]], trained: Mapping[str, bool],
                base: Optional[CostModel] = None) -> tuple[CostModel, tuple[str, ...]]:
    """``(model, unpriced)``: ``base`` (default :class:`CostModel`'s coefficients) with each module
    whose shape is known priced by its step FLOPs, ``a`` per row (token) and ``b`` per row²
    (token²); ``unpriced``: the modules without a shape, left at ``base``'s coefficients."""
    base = base if base is not None else CostModel()
    modules = dict(base.modules)
    unpriced = []
    for name, shape in shapes.items():
        if shape is None:
            unpriced.append(name)
            continue
        steps = passes(trained.get(name, True))
        modules[name] = ModuleCost(a=steps * shape.per_token / UNIT, b=steps * shape.per_sq_token / UNIT)
    fit = {**base.fit, "start": "flops", **({"unpriced": sorted(unpriced)} if unpriced else {})}
    return CostModel(a=base.a, b=base.b, fit=fit, modules=modules), tuple(sorted(unpriced))
