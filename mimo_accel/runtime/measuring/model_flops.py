"""What the profiler records once, in every rank's profile header (``layout["flops"]``), for the
throughput figures (:mod:`mimo_accel.costs.flops`): each module's FLOPs shape, read from Bridge's
``MegatronMIMOProvider`` when training starts (its ``TransformerConfig`` per module, the language
spec's ``vocab_size``), its ranks (tp·cp·pp·dp of its grid), whether it trains (the provider's
``freeze_language_model`` / ``freeze_modality_encoders``), and the device's name. So the report
computes FLOPs from the profile alone, and the TensorBoard figures from the writing rank's header.

A module whose encoders are built from different configs, or whose layers the count leaves out
(:func:`mimo_accel.costs.flops.shape_of`), has no shape and the reason beside it: its FLOPs are
null; its samples and tokens per second are still figures.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

from mimo_accel.costs.flops import shape_of
from mimo_accel.modules import LANGUAGE
from mimo_accel.runtime.module_configs import module_configs

if TYPE_CHECKING:
    from mimo_accel.costs import CostModel


def device_name() -> Optional[str]:
    """``torch.cuda.get_device_name()`` of this rank's device; None on CPU."""
    import torch

    return torch.cuda.get_device_name() if torch.cuda.is_available() else None


def _ranks(grid: Any) -> Optional[int]:
    sizes = [getattr(grid, f"{n}_parallel_size", 1) for n in ("tensor_model", "context", "pipeline_model", "data")]
    return None if any(s is None for s in sizes) else int(sizes[0] * sizes[1] * sizes[2] * sizes[3])


def _module(configs: list, vocab: int, causal: bool, grid: Any, trained: bool) -> dict:
    shape, why = None, None
    distinct = {id(c): c for c in configs}
    if not distinct:
        why = "no TransformerConfig in its spec"
    elif len(distinct) > 1:
        why = f"{len(distinct)} encoders of different configs"
    else:
        shape, why = shape_of(next(iter(distinct.values())), vocab=vocab, causal=causal)
    return {"ranks": _ranks(grid) if grid is not None else None, "trained": trained,
            "shape": shape.to_dict() if shape is not None else None, **({"why": why} if why else {})}


def flops_layout(provider: Any) -> Optional[dict]:
    """``{"device_name": ..., "modules": {module: {"ranks", "trained", "shape", ["why"]}}}`` of a
    ``MegatronMIMOProvider`` (None for anything else). How the job was built (its split, sequence
    parallelism, recompute, precision) is read off the built model: :mod:`~mimo_accel.runtime.measuring.job_build`."""
    parallelism = getattr(provider, "megatron_mimo_parallelism_config", None)
    if parallelism is None:
        return None
    grids = getattr(parallelism, "module_parallelisms", None) or {}
    configs: dict[str, list] = {name: [] for name in grids}
    for module, _, _, config in module_configs(provider):
        configs.setdefault(module, []).append(config)
    params = getattr(getattr(provider, "language_model_spec", None), "params", None) or {}
    frozen = getattr(provider, "freeze_modality_encoders", None) or {}
    modules = {}
    for name, found in configs.items():
        language = name == LANGUAGE
        vocab = int(params.get("vocab_size") or 0) if language else 0
        trained = not (getattr(provider, "freeze_language_model", False) if language else frozen.get(name, False))
        modules[name] = _module(found, vocab, language, grids.get(name), bool(trained))
    return {"device_name": device_name(), "modules": modules}


def start_cost_model(path: Optional[str], provider: Any, notify) -> "CostModel":
    """The cost model a run plans with before it learns (the same on every rank): the file at
    ``path`` when one is configured; else each module's step FLOPs from ``provider``'s configs
    (:mod:`mimo_accel.costs.prior`), a module whose FLOPs are not counted at the default
    coefficients (said once); the defaults where there is no MegatronMIMO provider."""
    from mimo_accel.costs import CostModel
    from mimo_accel.costs.flops import FlopsShape
    from mimo_accel.costs.prior import flops_prior

    if path is not None:
        return CostModel.from_file(path)
    layout = flops_layout(provider)
    if layout is None:
        return CostModel()
    modules = layout["modules"]
    shapes = {m: FlopsShape.from_dict(v["shape"]) if v["shape"] else None for m, v in modules.items()}
    model, unpriced = flops_prior(shapes, {m: v["trained"] for m, v in modules.items()})
    if unpriced:
        why = "; ".join(f"{m}: {modules[m].get('why', 'no FLOPs shape')}" for m in unpriced)
        notify("cost-model:unpriced", f"mimo_accel reorder: {', '.join(unpriced)} start(s) from the default cost "
               f"coefficients, not from FLOPs ({why}); the online calibration learns them while training, or pass "
               "a measured model (cost_model=..., `mimo-accel calibrate`)")
    return model
