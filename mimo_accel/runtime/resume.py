"""The checkpoint a run resumes from, checked against the run before Bridge loads it.

Bridge writes its whole config beside every checkpoint (``iter_NNNNNNN/run_config.yaml``, what its
own load reads for the TP/PP check it skips for MegatronMIMO). At ``setup_megatron_mimo``, before
the load, every rank reads that file and the run's own config into one
:class:`~mimo_accel.carry_over.RunSettings` each (one reader for both: the YAML holds the config's
fields under the same names) and stops on what cannot load on this layout
(:func:`~mimo_accel.carry_over.load_barriers`); where the train loader is built, it stops on an
order that would not read on from the next sample (:func:`~mimo_accel.carry_over.order_barriers`).
Each stop is one line (:class:`ResumeRefused`), raised alike on every rank (the same files, the
same config), before the first step.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Optional

from mimo_accel.carry_over import RunSettings, batch_barrier, load_barriers, optimizer_sharding, order_barriers

# Bridge's names (megatron/bridge/training/utils/checkpoint_utils.py): the Megatron-LM tracker it
# writes beside latest_train_state.pt, each iteration's directory and its config.
TRACKER = "latest_checkpointed_iteration.txt"
RUN_CONFIG = "run_config.yaml"
_ITERATION_MARKERS = (RUN_CONFIG, "metadata.json", ".metadata")  # is_checkpoint_iteration_directory's
#: The sizes of a module's config that decide its weights' shapes.
SHAPE_FIELDS = ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups",
                "kv_channels")


class ResumeRefused(ValueError):
    """A resume that cannot read on from the next sample, or cannot load on this layout."""


@dataclass(frozen=True)
class Resumed:
    """The checkpoint this run resumes from: its directory, iteration, and the settings of the run
    that saved it beside this run's."""

    directory: Path
    iteration: Optional[int]
    saved: RunSettings
    now: RunSettings

    def tp_changed(self) -> dict[str, tuple[int, int]]:
        """Module -> (saved TP, this run's TP) where they differ."""
        return {m: (self.saved.parallelism[m][0], tp) for m, (tp, _, _) in self.now.parallelism.items()
                if m in self.saved.parallelism and self.saved.parallelism[m][0] != tp}


def _get(obj: Any, name: str, default: Any = None) -> Any:
    if isinstance(obj, Mapping):
        return obj.get(name, default)
    return getattr(obj, name, default)


def _configs(spec: Any):
    """(param name, config) of a module spec's params that hold a transformer config."""
    for key, value in (_get(spec, "params") or {}).items():
        if _get(value, "num_layers") is not None and _get(value, "hidden_size") is not None:
            yield key, value


def _shape(config: Any) -> dict:
    return {k: _get(config, k) for k in SHAPE_FIELDS}


def shapes_of(model: Any) -> dict[str, dict]:
    """Each module's config sizes from a ``MegatronMIMOProvider`` or its YAML: the language model's
    spec, its vocabulary, each modality's encoders."""
    out: dict[str, dict] = {}
    language = _get(model, "language_model_spec")
    if language is not None:
        for key, config in _configs(language):
            out["the language model" + ("" if key == "config" else f" ({key})")] = _shape(config)
        vocab = (_get(language, "params") or {}).get("vocab_size")
        if vocab is not None:
            out["the language model's vocabulary"] = {"vocab_size": int(vocab)}
    for name, spec in (_get(model, "modality_submodules_spec") or {}).items():
        for encoder, encoder_spec in ((_get(spec, "submodules") or {}).get("encoders") or {}).items():
            for key, config in _configs(encoder_spec):
                out[f"{name}'s encoder {encoder}" + ("" if key == "config" else f" ({key})")] = _shape(config)
    return out


def settings_of(cfg: Any) -> Optional[RunSettings]:
    """The :class:`RunSettings` of Bridge's ``ConfigContainer``, or of the ``run_config.yaml`` it
    writes (a dict); None where the model is not a MegatronMIMO one."""
    model = _get(cfg, "model")
    groups = _get(_get(model, "megatron_mimo_parallelism_config"), "module_parallelisms")
    if not groups:
        return None
    parallelism = {str(name): (int(_get(p, "tensor_model_parallel_size") or 1),
                               int(_get(p, "pipeline_model_parallel_size") or 1),
                               int(_get(p, "data_parallel_size") or 1)) for name, p in groups.items()}
    train, checkpoint, data = _get(cfg, "train"), _get(cfg, "checkpoint"), _get(cfg, "dataset")
    fmt = str(_get(checkpoint, "ckpt_format") or "torch_dist")
    sharding = optimizer_sharding(bool(_get(_get(cfg, "optimizer"), "use_distributed_optimizer", False)), fmt,
                                  bool(_get(checkpoint, "dist_ckpt_optim_fully_reshardable", False)))
    return RunSettings(parallelism, int(_get(train, "global_batch_size") or 0), int(_get(train, "micro_batch_size") or 0),
                       fmt, sharding, str(_get(data, "dataloader_type") or "single"),
                       bool(_get(data, "data_sharding", True)), bool(_get(data, "megatron_mimo_scalable_dp", False)),
                       shapes_of(model), _get(checkpoint, "save"), _get(checkpoint, "load"), _get(train, "train_iters"),
                       bool(_get(checkpoint, "save_rng", True)),
                       bool(_get(_get(cfg, "rng"), "data_parallel_random_init", False)))


def run_record(cfg: Any) -> Optional[dict]:
    """What a profile's header records of the run (``layout["run"]``: ``mimo-accel layout --from``
    prints how to continue it): its settings without the model's sizes (the header has them)."""
    settings = settings_of(cfg) if cfg is not None else None
    return settings.to_doc() if settings is not None else None


def iteration_directory(checkpoint: Any) -> Optional[tuple[Path, Optional[int]]]:
    """The iteration directory Bridge will load for ``checkpoint.load`` (as its
    ``_resolve_checkpoint_iteration`` picks it: the directory itself, ``ckpt_step``, else the
    tracker), and its iteration; None where there is nothing to resume from."""
    load = _get(checkpoint, "load")
    if not load:
        return None
    root = Path(load)
    if any((root / marker).exists() for marker in _ITERATION_MARKERS):
        return root, None
    step = _get(checkpoint, "ckpt_step")
    if step is None:
        tracker = root / TRACKER
        if not tracker.is_file():
            return None
        text = tracker.read_text(encoding="utf-8").strip()
        if text == "release":
            return root / "release", None
        step = int(text)
    return root / f"iter_{int(step):07d}", int(step)


def read_run_config(path: Path) -> dict:
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    with open(path, encoding="utf-8") as f:
        return yaml.load(f, Loader=loader) or {}


def _refusal(directory: Path, now: RunSettings, barriers) -> ResumeRefused:
    return ResumeRefused(f"mimo_accel: cannot resume from {directory} on this layout ({now.layout()}): "
                         + "; and ".join(b.line() for b in barriers))


def check_before_load(cfg: Any, notify: Callable[[str, str], object]) -> Optional[Resumed]:
    """Before Bridge loads ``cfg.checkpoint.load``: the checkpoint it will load and the run that saved
    it, or None (nothing to resume from, or not a MegatronMIMO run). ResumeRefused where it cannot
    load on this layout; what changes is said once."""
    checkpoint = _get(cfg, "checkpoint")
    found = iteration_directory(checkpoint)
    now = settings_of(cfg)
    if found is None or now is None:
        return None
    directory, iteration = found
    if not (directory / RUN_CONFIG).is_file():
        notify("resume:unchecked", f"mimo_accel: {directory} has no {RUN_CONFIG}, so the layout, format and model it "
                                   "was saved with are not checked before Bridge loads it")
        return None
    saved = settings_of(read_run_config(directory / RUN_CONFIG))
    if saved is None:
        raise ResumeRefused(f"mimo_accel: cannot resume from {directory}: it is not a MegatronMIMO checkpoint (its "
                            f"{RUN_CONFIG} has no megatron_mimo_parallelism_config); start from its weights "
                            "(checkpoint.pretrained_checkpoint) instead")
    restart = not _get(checkpoint, "finetune", False)  # finetune loads the weights alone
    barriers = load_barriers(saved, now, load_optim=restart and bool(_get(checkpoint, "load_optim", True)),
                             load_rng=restart and bool(_get(checkpoint, "load_rng", True)),
                             auto_format=bool(_get(checkpoint, "auto_detect_ckpt_format", False)))
    if barriers:
        raise _refusal(directory, now, barriers)
    if saved.parallelism != now.parallelism:
        notify("resume:layout", f"mimo_accel: resuming {directory} ({saved.layout()}) on {now.layout()}")
    batch = batch_barrier(saved, now)
    if batch is not None:
        notify("resume:global-batch", f"mimo_accel: {batch.why}")
    return Resumed(directory, iteration, saved, now)


def check_order(resumed: Optional[Resumed], *, samples: int, consumed: int, window: int, canonical: bool) -> None:
    """Where the train loader is built: ResumeRefused where it would not read on from sample
    ``consumed`` of the global order the checkpoint's run read (a dataset of ``samples``; a reorder
    window of ``window`` micro-batches; ``canonical``: upstream's scalable reads build the loader)."""
    if resumed is None or consumed <= 0:
        return
    now = dataclasses.replace(resumed.now, canonical_reads=canonical)
    barriers = order_barriers(resumed.saved, now, samples=samples, consumed=consumed, window=window)
    if barriers:
        raise _refusal(resumed.directory, now, barriers)

