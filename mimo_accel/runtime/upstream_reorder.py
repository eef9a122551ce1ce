"""A Bridge with its own intra-microbatch reorder: never two reorders on one micro-batch.

Upstream's reorder is Megatron-Bridge PR #4608's (not on Bridge main 067f987, in no release). It has
had two shapes, and mimo_accel does one thing for each, said in one line at setup
(``mimo_accel.status()["notes"]`` keeps it):

- **#4608's reorder buffer** with its settings on the dataset config (``reorder_buffer.py`` and
  ``docs/training/mimo-intra-microbatch-reorder.md`` as the search index holds them, commit ce55b79f):
  settings on the dataset config
  (``DirectHFSFTDatasetConfig``), ``megatron_mimo_intra_microbatch_reorder`` acting on upstream's
  scalable reads (``megatron_mimo_scalable_dp``); the training script (the Qwen3.5-VL example's
  ``_build_data_iterators``) wraps the train iterator in a ``ReorderingBuffer`` when both are on,
  reading them from ``cfg.dataset`` when it builds its iterators. It plans each micro-batch alone
  and moves samples between replicas *after* they are read.

  * mimo_accel's reorder on: **mimo_accel's reorder replaces it.** ``setup_megatron_mimo`` turns
    ``cfg.dataset.megatron_mimo_intra_microbatch_reorder`` off before the script's
    ``build_data_iterators`` runs (so no buffer is built), and says so, naming the flag and how to
    keep upstream's instead. Should the iterators come back wrapped in a ``ReorderingBuffer`` all
    the same (a script that decides from its own flags), setup refuses before the first batch.
  * mimo_accel's reorder off: upstream's reorder runs. mimo_accel's batch tag could not describe
    a batch whose samples the buffer exchanged (upstream keeps one sample's non-tensor fields), so
    the canonical loader is left untagged (:mod:`mimo_accel.runtime.patches.loaders`): packing works as
    enabled; the step's replica check and the profiler's per-sample counts are off, said once.

- **#4608 at its head 984a8a53** (``MegatronMIMOFeatureConfig`` on ``ConfigContainer.mimo``,
  training/config.py: ``intra_microbatch_reorder`` acting on ``mimo.scalable_dp``): mimo_accel's reorder
  **steps aside** (its planner does not act on #4608's reads: each rank's sampler already reads a
  module-local share, not the global micro-batch it plans); sharded reads, packing and the
  profiler stay as enabled.

Checked where Bridge hands over its ``ConfigContainer``, before any loader is built:
``setup_megatron_mimo(state, ...)`` (``state.cfg``) and ``build_megatron_mimo_data_loaders(cfg, ...)``.
"""

from __future__ import annotations

from typing import Any, Optional

from mimo_accel.runtime.state import Runtime

STEPPED_ASIDE = "reorder:upstream-reorders"
REPLACED_BUFFER = "reorder:replaces-bridge-reorder"
BUFFER_REORDERS = "reorder:bridge-reorders-after-read"

BUFFER_FLAG = "megatron_mimo_intra_microbatch_reorder"
BUFFER_SCALABLE_FLAG = "megatron_mimo_scalable_dp"
BUFFER_CLASS = "ReorderingBuffer"
BUFFER_MODULE = "megatron.bridge.data.megatron_mimo.reorder_buffer"


def upstream_reorder(cfg: Any) -> Optional[str]:
    """What in a ConfigContainer turns #4608's reorder on (None: it is off or absent).

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


def buffer_reorder(cfg: Any) -> Optional[str]:
    """What in a ConfigContainer turns #4608's reorder buffer on (None: off or absent).

    Upstream's buffer acts only on its scalable reads, so the flag counts only with
    ``megatron_mimo_scalable_dp`` on.
    """
    data = getattr(cfg, "dataset", None)
    if not (bool(getattr(data, BUFFER_FLAG, False)) and bool(getattr(data, BUFFER_SCALABLE_FLAG, False))):
        return None
    return f"cfg.dataset.{BUFFER_FLAG}=True with cfg.dataset.{BUFFER_SCALABLE_FLAG}=True"


def settle_upstream_reorder(cfg: Any, runtime: Runtime) -> None:
    """One reorder for this run, decided from ``cfg`` as the module docstring says, and said once."""
    if cfg is None:
        return
    buffer = buffer_reorder(cfg)
    if buffer is not None:
        if runtime.reorders:
            setattr(cfg.dataset, BUFFER_FLAG, False)
            runtime.say_once(REPLACED_BUFFER, (
                f"mimo_accel reorder replaces PR #4608's reorder buffer ({buffer}): cfg.dataset.{BUFFER_FLAG} is "
                "set False for this run, so the script builds no ReorderingBuffer, and mimo_accel plans every "
                "module's replicas before reading. To keep #4608's reorder instead, enable mimo_accel without reorder "
                "(reorder=False, or leave 'reorder' out of MIMO_ACCEL)."))
        else:
            runtime.upstream_moves_samples = buffer
            runtime.say_once(BUFFER_REORDERS, (
                f"PR #4608's reorder buffer reorders this run ({buffer}), moving samples between replicas after "
                "they are read: mimo_accel leaves the train loader untagged, so the step's replica check and the "
                "profiler's per-sample counts are off there; packing stays as enabled. For mimo_accel's "
                f"reorder instead, enable it (reorder=True): it then sets cfg.dataset.{BUFFER_FLAG}=False."))
        return
    _step_aside_if_4608_reorders(cfg, runtime)


def _step_aside_if_4608_reorders(cfg: Any, runtime: Runtime) -> None:
    if not runtime.reorders:
        return
    why = upstream_reorder(cfg)
    if why is None:
        return
    runtime.reorder_stepped_aside = why
    runtime.say_once(STEPPED_ASIDE, (
        f"mimo_accel reorder steps aside: this Bridge (PR #4608's branch) reorders the micro-batches itself "
        f"({why}), and two reorders must not run on one micro-batch. #4608's reorder balances this run; "
        "mimo_accel's sharded reads, packing and profiler stay as enabled. For mimo_accel's reorder instead, set "
        "cfg.mimo.intra_microbatch_reorder=False."))


def is_reordering_buffer(iterator: Any) -> bool:
    """Whether ``iterator`` is (or wraps, one level down) upstream's ``ReorderingBuffer``.

    By class name and module, not by import: only PR #4608's branch has that module.
    """
    for obj in (iterator, getattr(iterator, "__wrapped__", None)):
        kind = type(obj)
        if kind.__name__ == BUFFER_CLASS and kind.__module__ == BUFFER_MODULE:
            return True
    return False


def refuse_second_reorder(iterators: Any, runtime: Runtime) -> None:
    """Setup's last check: with mimo_accel reordering, no iterator the script built may be upstream's
    buffer (it would re-plan and exchange what mimo_accel planned)."""
    if not runtime.reorders:
        return
    found = iterators if isinstance(iterators, (tuple, list)) else (iterators,)
    if any(is_reordering_buffer(it) for it in found):
        raise RuntimeError(
            f"mimo_accel: the training script wrapped its data iterator in PR #4608's {BUFFER_CLASS} while "
            f"mimo_accel's reorder is on; two reorders must not run on one micro-batch. Turn one off: "
            f"cfg.dataset.{BUFFER_FLAG}=False (the script's --intra-microbatch-reorder), or mimo_accel's "
            "reorder (reorder=False).")
