"""The ``TransformerConfig`` of every module a ``MegatronMIMOProvider`` builds, read off its specs.

Read by the checks before training (:mod:`mimo_accel.runtime.preflight`) and by the profiler's
FLOPs shapes (:mod:`mimo_accel.runtime.measuring.model_flops`); it holds no runtime state, so neither
reaches the other through it.
"""

from __future__ import annotations

from typing import Any, Iterator

from mimo_accel.modules import LANGUAGE


def _spec_configs(spec: Any) -> Iterator[tuple[str, Any]]:
    """(param name, TransformerConfig) of a ModuleSpec's params."""
    try:
        from megatron.core.transformer.transformer_config import TransformerConfig
    except ImportError:  # pragma: no cover - megatron is what is being patched
        return
    params = getattr(spec, "params", None) or {}
    for key, value in params.items():
        if isinstance(value, TransformerConfig):
            yield key, value


def module_configs(provider: Any) -> Iterator[tuple[str, str, str, Any]]:
    """(module, what, param name, TransformerConfig) of every module a provider builds: the language
    model's spec and each modality's encoders."""
    language = getattr(provider, "language_model_spec", None)
    if language is not None:
        for key, config in _spec_configs(language):
            yield LANGUAGE, "the language model", key, config
    for name, spec in (getattr(provider, "modality_submodules_spec", None) or {}).items():
        encoders = (getattr(spec, "submodules", None) or {}).get("encoders") or {}
        for encoder, encoder_spec in encoders.items():
            for key, config in _spec_configs(encoder_spec):
                yield name, f"encoder {encoder!r}", key, config
