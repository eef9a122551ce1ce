"""What the model's and the layout's configs must agree on before mimo_accel trains with them.

Run where Bridge hands over its ``MegatronMIMOProvider``: before the model is built
(``setup_megatron_mimo``) and when the MIMO loaders are built; configs only, nothing collective.
A module's ``TransformerConfig`` TP/PP size must be its grid's (megatron-core builds layers from
the config's sizes and process groups from the grid: every stage would build every layer, and a
torch_dist resume would load the wrong weights; an encoder's ``transformer_config`` gets its TP
from Bridge itself, so only its PP is checked). Packing under context parallelism needs
``pad_multiple`` a multiple of ``2·cp``. A reorder under per-replica loss normalisation
(``calculate_per_token_loss=False``) changes the gradient: said once, refused with
``strict_gradients``.
"""

from __future__ import annotations

from typing import Any, Optional

from mimo_accel.modules import LANGUAGE
from mimo_accel.runtime.module_configs import module_configs
from mimo_accel.runtime.state import Runtime

PER_REPLICA_LOSS = "reorder:per-replica-loss"


def per_replica_loss_message(strict: bool = False) -> str:
    head = ("the language model's TransformerConfig has calculate_per_token_loss=False, so each language "
            "replica's loss is the mean over its own tokens (per micro-batch) and the replicas' gradients are "
            "averaged: moving a sample to another language replica or micro-batch changes its weight in the "
            "gradient, not only who computes it (reordering keeps the gradient only with the per-token loss).")
    if strict:
        return (f"mimo_accel reorder with strict_gradients: {head} Set calculate_per_token_loss=True on the "
                "language model's TransformerConfig (the per-token loss), or turn reorder off.")
    return (f"mimo_accel reorder: {head} Set calculate_per_token_loss=True on the language model's "
            "TransformerConfig for upstream-identical gradients; strict_gradients=True "
            "(MIMO_ACCEL_STRICT_GRADIENTS=1) makes this an error.")


def language_config(provider: Any) -> Optional[Any]:
    """The language model's TransformerConfig (the spec's, else a standard provider's own)."""
    for module, _, _, config in module_configs(provider):
        if module == LANGUAGE:
            return config
    standard = getattr(provider, "standard_provider", None)
    return standard if standard is not None and hasattr(standard, "calculate_per_token_loss") else None


def size_mismatches(provider: Any) -> list[str]:
    """One line per module config whose TP/PP size differs from the module's grid."""
    parallelism = getattr(provider, "megatron_mimo_parallelism_config", None)
    grids = getattr(parallelism, "module_parallelisms", None) or {}
    out = []
    for module, what, key, config in module_configs(provider):
        grid = grids.get(module)
        if grid is None:
            continue
        sizes = ["pipeline_model_parallel_size"]
        if not (module != LANGUAGE and key == "transformer_config"):  # Bridge sets this one's TP
            sizes.insert(0, "tensor_model_parallel_size")
        for size in sizes:
            mine, theirs = getattr(config, size, None), getattr(grid, size, None)
            if mine is not None and theirs is not None and int(mine) != int(theirs):
                out.append(f"module {module!r} ({what}, spec param {key!r}): TransformerConfig.{size} = {mine}, "
                           f"but MegatronMIMOParallelismConfig.module_parallelisms[{module!r}].{size} = {theirs}")
    return out


def check_sizes(provider: Any) -> None:
    differ = size_mismatches(provider)
    if differ:
        raise ValueError(
            "mimo_accel: a module's TransformerConfig disagrees with its grid. megatron-core builds the "
            "module's layers from the config's sizes but its process groups from the grid (with another "
            "PP size every stage builds every layer, and a torch_dist checkpoint stores two stages' layers "
            "under the same keys, so a resume loads the wrong weights). Set the config's sizes to the "
            "grid's:\n  " + "\n  ".join(differ))


def _language_grid(provider: Any) -> Optional[Any]:
    """The language model's ``ModuleParallelismConfig`` in the provider's MIMO parallelism config."""
    parallelism = getattr(provider, "megatron_mimo_parallelism_config", None)
    return (getattr(parallelism, "module_parallelisms", None) or {}).get(LANGUAGE)


def language_cp(provider: Any) -> int:
    return int(getattr(_language_grid(provider), "context_parallel_size", 1) or 1)


def check_loss_normalisation(provider: Any, runtime: Runtime) -> None:
    """Say once (or, with strict_gradients, refuse) that reorder changes the gradient when the
    language loss is normalised per replica."""
    cfg = runtime.config
    if not runtime.reorders:
        return
    config = language_config(provider)
    if config is None or getattr(config, "calculate_per_token_loss", True):
        return
    if getattr(_language_grid(provider), "data_parallel_size", None) == 1 and cfg.reorder_window == 1:
        return  # one language replica, one micro-batch: its samples and their weights stay the same
    if cfg.strict_gradients:
        raise ValueError(per_replica_loss_message(strict=True))
    runtime.say_once(PER_REPLICA_LOSS, per_replica_loss_message())


def check_provider(provider: Any, runtime: Runtime) -> None:
    """Every check above, for the config features that are on (a provider that is not a MIMO one
    is left to upstream, which refuses it)."""
    cfg = runtime.config
    if provider is None or getattr(provider, "megatron_mimo_parallelism_config", None) is None:
        return
    if cfg.any_feature:
        check_sizes(provider)
    if cfg.packing:
        from mimo_accel.packing import check_alignment

        check_alignment(cfg.pad_multiple, language_cp(provider))
    check_loss_normalisation(provider, runtime)
