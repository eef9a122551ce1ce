"""How the job was built, as every rank's profile header records it (``header["build"]``): for each
module this rank holds, what its built ``TransformerConfig`` says of the pipeline split, sequence
parallelism, recompute and precision, and Bridge's optimizer config of the distributed optimizer.

Read off the model ``train_megatron_mimo`` trains (Bridge deep-copies the provider's specs into it),
so the header says how the job ran, not how its provider was written. A rank holds its own module
only (non-colocated), so each module's record is in the headers of its ranks;
``mimo-accel layout --from`` gathers them (:mod:`mimo_accel.tools.layout.profiled`).

``stage_layers``: the layers each PP stage of the module builds, by megatron-core's own
``get_num_layers_to_build`` (``num_layers_in_{first,last}_pipeline_stage``,
``account_for_{embedding,loss}_in_pipeline_split``) or its ``pipeline_model_parallel_layout``.
"""

from __future__ import annotations

from typing import Any, Optional

from mimo_accel.modules import LANGUAGE

#: The split settings of megatron-core's TransformerConfig, recorded where set.
SPLIT_FIELDS = ("num_layers_in_first_pipeline_stage", "num_layers_in_last_pipeline_stage",
                "account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split")


def _unwrapped(module: Any) -> Any:
    while hasattr(module, "module") and not hasattr(module, "language_model"):
        module = module.module
    return module


def _configs(mimo: Any) -> dict[str, Any]:
    """Module name -> the TransformerConfig of each module this rank holds: the language model's, and
    each encoder module's (its DDP wrapper's, which Bridge takes from its first encoder)."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    held = {}
    lm = getattr(mimo, "language_model", None)
    if lm is not None:
        held[LANGUAGE] = getattr(lm, "config", None)
    for name, sub in (getattr(mimo, "modality_submodules", None) or {}).items():
        if sub is None:
            continue
        config = getattr(sub, "config", None)
        encoders = getattr(_unwrapped(sub), "encoders", None) or {}
        if config is None and encoders:
            config = getattr(next(iter(encoders.values())), "config", None)
        held[str(name)] = config
    return {name: c for name, c in held.items() if isinstance(c, TransformerConfig)}


def stage_layers(config: Any) -> Optional[list[int]]:
    """The layers each PP stage builds (virtual stages summed), as megatron-core counts them."""
    from megatron.core.transformer.enums import LayerType
    from megatron.core.transformer.transformer_block import get_num_layers_to_build

    layout = getattr(config, "pipeline_model_parallel_layout", None)
    if layout is not None:
        return [sum(chunk.count(LayerType.decoder) for chunk in stage) for stage in layout.layout]
    pp, vp = config.pipeline_model_parallel_size, config.virtual_pipeline_model_parallel_size or 1
    return [get_num_layers_to_build(config, vp_stage=0 if vp > 1 else None, pp_rank=r) * vp for r in range(pp)]


def settings_of(config: Any, optimizer: Any) -> dict[str, Any]:
    """One module's record (module docstring) from its ``config`` and Bridge's ``optimizer`` config."""
    split = {k: getattr(config, k) for k in SPLIT_FIELDS if getattr(config, k, None) not in (None, False)}
    layout = getattr(config, "pipeline_model_parallel_layout", None)
    if layout is not None:
        split["pipeline_model_parallel_layout"] = repr(layout)
    return {
        "num_layers": config.num_layers, "pipeline_model_parallel_size": config.pipeline_model_parallel_size,
        "virtual_pipeline_model_parallel_size": config.virtual_pipeline_model_parallel_size,
        "pipeline_split": split or None, "stage_layers": stage_layers(config),
        "sequence_parallel": bool(config.sequence_parallel),
        "recompute_granularity": config.recompute_granularity, "recompute_method": config.recompute_method,
        "recompute_num_layers": config.recompute_num_layers,
        "precision": "bf16" if config.bf16 else "fp16" if config.fp16 else "fp32",
        "distributed_optimizer": (bool(optimizer.use_distributed_optimizer)
                                  if hasattr(optimizer, "use_distributed_optimizer") else None),
    }


def job_build(model: Any, global_state: Any) -> dict[str, dict]:
    """Module -> its record, for the modules of ``model`` (what ``train_megatron_mimo`` trains on this
    rank); Bridge's optimizer config from ``global_state.cfg.optimizer``."""
    optimizer = getattr(getattr(global_state, "cfg", None), "optimizer", None)
    chunks = model if isinstance(model, (list, tuple)) else [model]
    out = {}
    for chunk in chunks:
        for name, config in _configs(_unwrapped(chunk)).items():
            out.setdefault(name, settings_of(config, optimizer))
    return out
