"""A Bridge with its own intra-microbatch reorder: mimo_accel's reorder steps aside.

Megatron-Bridge PR #4608 (``MegatronMIMOFeatureConfig`` in training/config.py at 984a8a538; merged
split: #6306) reorders the samples of each micro-batch across the module DP replicas itself, set on
``ConfigContainer.mimo``: ``intra_microbatch_reorder`` (default True), ``cost_linear_vit``,
``cost_linear_lm``, ``reorder_window_size``. In #4608 it acts only on its own sharded reads
(``mimo.scalable_dp``): the training script wraps the train iterator in a ``ReorderingBuffer`` when
``scalable_dp and intra_microbatch_reorder``. Two reorders on one micro-batch would each move
samples the other placed, so the two never run together: where the config says upstream reorders,
mimo_accel's reorder is turned off for this run and says so once (its sharded reads, packing and
profiler stay as enabled). mimo_accel does not take over, because turning upstream's off means
changing the user's serialized run config, and mimo_accel's planner does not act on #4608's reads
(each rank's sampler already reads a module-local share, not the global micro-batch it plans).

Checked where Bridge hands over its ``ConfigContainer``, before any loader is built:
``setup_megatron_mimo(state, ...)`` (``state.cfg``) and ``build_megatron_mimo_data_loaders(cfg, ...)``.
"""

from __future__ import annotations

from typing import Any, Optional

from mimo_accel.runtime.state import Runtime

STEPPED_ASIDE = "reorder:upstream-reorders"


def upstream_reorder(cfg: Any) -> Optional[str]:
    """What in a ConfigContainer turns upstream's own reorder on (None: it is off or absent).

    ``intra_microbatch_reorder`` counts only with ``scalable_dp`` where the config has that field
    (#4608); a config without it (a later split) is taken at its word.
    """
    features = getattr(cfg, "mimo", None)
    if features is None or not bool(getattr(features, "intra_microbatch_reorder", False)):
        return None
    if hasattr(features, "scalable_dp"):
        if not features.scalable_dp:
            return None
        return "cfg.mimo.intra_microbatch_reorder=True with cfg.mimo.scalable_dp=True"
    return "cfg.mimo.intra_microbatch_reorder=True"


def step_aside_if_upstream_reorders(cfg: Any, runtime: Runtime) -> None:
    """mimo_accel's reorder off for this run, said once, where ``cfg`` says upstream reorders."""
    if not runtime.config.reorder:
        return
    why = upstream_reorder(cfg)
    if why is None:
        return
    runtime.config = runtime.config.replace(reorder=False)
    runtime.say_once(STEPPED_ASIDE, (
        f"mimo_accel reorder steps aside: this Bridge reorders the micro-batches itself ({why}), and two "
        "reorders must not run on one micro-batch. Upstream's reorder balances this run; mimo_accel's "
        "sharded reads, packing and profiler stay as enabled. For mimo_accel's reorder instead, set "
        "cfg.mimo.intra_microbatch_reorder=False."))
