"""A Bridge with its own intra-microbatch reorder: never two reorders on one micro-batch.

Decided where Bridge hands over its ``ConfigContainer``, before any loader is built
(``setup_megatron_mimo``, ``build_megatron_mimo_data_loaders``), and said once. Upstream's reorder
is Megatron-Bridge PR #4608's (not on Bridge main 067f987, in no release), in two shapes:

- **#4608's reorder buffer** (``reorder_buffer.py``, commit ce55b79f:
  ``cfg.dataset.megatron_mimo_intra_microbatch_reorder`` with ``megatron_mimo_scalable_dp``; the
  script wraps its train iterator in a ``ReorderingBuffer``, which moves samples between replicas
  after they are read). With mimo_accel's reorder on, it **replaces** it: setup turns the flag off
  before the script builds its iterators, and refuses an iterator wrapped all the same. With it off,
  upstream's reorder runs and the canonical loader is left untagged (the tag cannot describe samples
  the buffer moved): the step's replica check and the profiler's per-sample counts are off, packing
  stays.
- **#4608 at its head 984a8a53** (``cfg.mimo.intra_microbatch_reorder`` with ``scalable_dp``):
  mimo_accel's reorder **steps aside** (each rank's sampler there already reads a module-local
  share, not the global micro-batch it plans); sharded reads, packing and the profiler stay as
  enabled.
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
    why = upstream_reorder(cfg) if runtime.reorders else None
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
