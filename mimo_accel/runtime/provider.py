"""What mimo_accel reads off Bridge's ``MegatronMIMOProvider`` (``cfg.model``) before it trains:
the encoders it freezes, its configs checked (:mod:`mimo_accel.runtime.preflight`) and the cost
model plans start from. Called where the provider is handed over: at ``setup_megatron_mimo``
(:mod:`mimo_accel.runtime.patches.setup`) and at the MIMO loader builder
(:mod:`mimo_accel.runtime.patches.loader_scope`)."""

from __future__ import annotations

from typing import Any

from mimo_accel.runtime import preflight
from mimo_accel.runtime.state import Runtime


def frozen_encoders(provider) -> tuple:
    """The encoders a ``MegatronMIMOProvider`` freezes (``freeze_modality_encoders``: modality name ->
    bool), in name order; none for any other provider."""
    frozen = getattr(provider, "freeze_modality_encoders", None)
    return tuple(sorted(name for name, on in frozen.items() if on)) if isinstance(frozen, dict) else ()


def read_provider(provider: Any, runtime: Runtime) -> None:
    """The provider's configs checked against the layout, and the cost model plans start from."""
    preflight.check_provider(provider, runtime)
    start_model(provider, runtime)


def start_model(provider: Any, runtime: Runtime) -> None:
    """With reorder on: the cost model plans start from, a configured file, else each module's FLOPs
    from ``provider`` (the same at setup and at the loaders' build: the same provider)."""
    if runtime.reorders:
        from mimo_accel.runtime.measuring.model_flops import start_cost_model

        runtime.start_model = start_cost_model(runtime.config.cost_model, provider, runtime.say_once)


def start_calibration(state: Any, runtime: Runtime) -> None:
    """With online calibration on: this run's cost model, learnt while it trains (from Bridge's
    ``GlobalState``: its checkpoint, its writers)."""
    if runtime.calibrates_online:
        from mimo_accel.runtime.measuring.calibration import Calibration

        moved = runtime.resumed.tp_changed() if runtime.resumed is not None else {}
        relearn = ("the checkpoint's run priced " + ", ".join(f"{m} at tp{a}" for m, (a, _) in moved.items())
                   + ", this run " + ", ".join(f"tp{b}" for _, b in moved.values())) if moved else None
        runtime.calibration = Calibration.for_setup(state, runtime.config, runtime.say_once, runtime.start_model,
                                                    relearn)
