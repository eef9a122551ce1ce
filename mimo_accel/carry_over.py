"""What a MegatronMIMO checkpoint carries to another layout, and what it cannot (pure).

A run moves to another layout by resuming from its checkpoint with other parallel sizes. What
decides whether that works, as megatron-core 0.19 and Megatron-Bridge 0.6 do it:

- **The format.** ``torch_dist`` (megatron-core's dist_checkpointing) and ``fsdp_dtensor`` store
  every tensor by its global shape and reshard on load, across TP, PP and DP. ``torch`` (the
  legacy format) writes one file per TP/PP rank and loads only on the layout that saved it.
  Bridge loads with the format its config names, whatever the checkpoint was saved in.
- **The distributed optimizer's sharding** (``DistributedOptimizer.sharded_state_dict``):
  ``fully_reshardable``, ``fully_sharded_model_space`` and ``fsdp_dtensor`` reshard across TP, PP
  and DP (its ``checkpoint_fully_reshardable_formats``); ``dp_reshardable`` stores the optimizer's
  own buckets and reshards across DP only; ``dp_zero_gather_scatter`` (deprecated) keeps a fixed
  TP x PP structure. Bridge saves ``fully_reshardable`` where ``dist_ckpt_optim_fully_reshardable``
  is set (upstream's Qwen3.5-VL launcher sets it), else ``dp_reshardable``
  (``checkpointing._build_sharded_state_dict_metadata``). For MegatronMIMO Bridge skips its own
  TP/PP check on load, so nothing else stops a load that cannot work.
- **The sample order.** Bridge's samplers restart at ``consumed_train_samples``. ``single`` reads
  the dataset in order, whatever the micro-batch or the DPs. ``cyclic`` permutes each epoch by
  its number over ``(n // mbs)·mbs`` samples (dp 1, as Bridge's MIMO loaders build it), so a
  micro-batch size that leaves another remainder of the dataset's length draws another
  permutation; under #5525's scalable reads each canonical group has its own permutation, so the
  canonical grid G and the micro-batch size decide it. mimo_accel's own sharding cuts upstream's
  global micro-batches on the grid, so the DPs change nothing there; a reorder window must start
  at a step (it tiles one), which a global batch of another size may not.

:class:`RunSettings` is what a run's checkpoint depends on, read from a live config, from the
``run_config.yaml`` Bridge writes beside each checkpoint (:mod:`mimo_accel.runtime.resume`) or from
a profile's header (``mimo-accel layout --from``); :func:`load_barriers` and :func:`order_barriers`
say what stops a resume on ``now``, each a :class:`Barrier` with its fix.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

#: Checkpoint formats that store tensors by their global shape and reshard on load.
RESHARDING_FORMATS = ("torch_dist", "fsdp_dtensor")
#: megatron-core's DistributedOptimizer.checkpoint_fully_reshardable_formats.
FULLY_RESHARDABLE = ("fully_reshardable", "fully_sharded_model_space", "fsdp_dtensor")
#: Optimizer shardings that reshard across DP but keep each module's TP x PP structure.
DP_ONLY = ("dp_reshardable", "dp_zero_gather_scatter")


def optimizer_sharding(distributed: bool, ckpt_format: str, fully_reshardable: bool) -> Optional[str]:
    """How Bridge saves the distributed optimizer's state (None: no distributed optimizer)."""
    if not distributed:
        return None
    if ckpt_format == "fsdp_dtensor":
        return "fsdp_dtensor"
    return "fully_reshardable" if fully_reshardable else "dp_reshardable"


@dataclass(frozen=True)
class RunSettings:
    """What a run's checkpoint depends on: each module's ``(tp, pp, dp)``, the batch, the checkpoint
    format and the optimizer's sharding, how the sampler orders the data, and each module's shape
    (``"module: part" -> {field: value}``, the configs' sizes)."""

    parallelism: Mapping[str, tuple[int, int, int]]
    global_batch: int
    micro_batch: int
    format: str = "torch_dist"
    optimizer_sharding: Optional[str] = None
    dataloader_type: str = "single"
    data_sharding: bool = True
    canonical_reads: bool = False  # #5525's scalable reads: upstream's sampler per canonical group
    shapes: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    save: Optional[str] = None
    load: Optional[str] = None
    train_iters: Optional[int] = None
    save_rng: bool = True  # each rank's RNG state in the checkpoint (checkpoint.save_rng)
    rng_per_dp: bool = False  # kept per DP rank too (rng.data_parallel_random_init)

    @property
    def grid(self) -> int:
        return math.lcm(*(dp for _, _, dp in self.parallelism.values()))

    def layout(self) -> str:
        return " ".join(f"{m} tp{tp} pp{pp} dp{dp}" for m, (tp, pp, dp) in self.parallelism.items())

    def to_doc(self) -> dict:
        return {"parallelism": {m: list(s) for m, s in self.parallelism.items()}, "global_batch": self.global_batch,
                "micro_batch": self.micro_batch, "format": self.format, "optimizer_sharding": self.optimizer_sharding,
                "dataloader_type": self.dataloader_type, "data_sharding": self.data_sharding,
                "canonical_reads": self.canonical_reads, "save": self.save, "load": self.load,
                "train_iters": self.train_iters, "save_rng": self.save_rng, "rng_per_dp": self.rng_per_dp}

    @classmethod
    def from_doc(cls, doc: Mapping[str, Any]) -> "RunSettings":
        return cls({str(m): tuple(int(x) for x in s) for m, s in doc["parallelism"].items()},
                   int(doc["global_batch"]), int(doc["micro_batch"]), str(doc.get("format") or "torch_dist"),
                   doc.get("optimizer_sharding"), str(doc.get("dataloader_type") or "single"),
                   bool(doc.get("data_sharding", True)), bool(doc.get("canonical_reads", False)), {},
                   doc.get("save"), doc.get("load"), doc.get("train_iters"), bool(doc.get("save_rng", True)),
                   bool(doc.get("rng_per_dp", False)))


@dataclass(frozen=True)
class Barrier:
    """One thing a checkpoint cannot carry to a layout: ``what`` (the format, the optimizer state,
    the model, the sample order, the global batch), why, and the setting that makes it carry over."""

    what: str
    why: str
    fix: str

    def line(self) -> str:
        return f"{self.why}; {self.fix}"


def model_parallel_changes(saved: RunSettings, now: RunSettings) -> dict[str, str]:
    """Module -> "tp2 pp2 -> tp1 pp2" for each module whose TP or PP differs."""
    out = {}
    for m, (tp, pp, _) in now.parallelism.items():
        if m in saved.parallelism and saved.parallelism[m][:2] != (tp, pp):
            old = saved.parallelism[m]
            out[m] = f"tp{old[0]} pp{old[1]} -> tp{tp} pp{pp}"
    return out


def _model(saved: RunSettings, now: RunSettings) -> list[Barrier]:
    fix = "resume from a checkpoint of this model, or start it from its weights (checkpoint.pretrained_checkpoint)"
    if set(saved.parallelism) != set(now.parallelism):
        return [Barrier("model", f"the checkpoint is of another model: modules {' + '.join(saved.parallelism)} there, "
                                 f"{' + '.join(now.parallelism)} here", fix)]
    for part in [p for p in now.shapes if p in saved.shapes]:
        differ = [k for k in now.shapes[part] if k in saved.shapes[part] and saved.shapes[part][k] != now.shapes[part][k]]
        if differ:
            sizes = ", ".join(f"{k} {saved.shapes[part][k]} there, {now.shapes[part][k]} here" for k in differ)
            return [Barrier("model", f"the checkpoint is of another model: {part} {sizes}", fix)]
    missing = sorted(set(saved.shapes) ^ set(now.shapes)) if saved.shapes and now.shapes else []
    if missing:
        return [Barrier("model", f"the checkpoint is of another model: {', '.join(missing)} on one side only", fix)]
    return []


def load_barriers(saved: RunSettings, now: RunSettings, *, load_optim: bool = True, load_rng: bool = True,
                  auto_format: bool = False) -> list[Barrier]:
    """What stops ``now`` loading the checkpoint ``saved`` wrote: another model, another format, a
    format, an optimizer sharding or RNG states that do not reshard to ``now``'s TP/PP. ``load_optim``
    / ``load_rng``: the optimizer's state / the RNG states are loaded (Bridge's
    ``checkpoint.load_optim`` / ``load_rng``, not ``finetune``); ``auto_format``: Bridge detects the
    format itself (``checkpoint.auto_detect_ckpt_format``)."""
    out = _model(saved, now)
    if out:
        return out
    moved = model_parallel_changes(saved, now)
    where = "; ".join(f"{m} {c}" for m, c in moved.items())
    if saved.format != now.format and not auto_format:
        out.append(Barrier("format", f"the checkpoint was saved as {saved.format!r} and this run loads "
                                     f"{now.format!r}", f"set checkpoint.ckpt_format={saved.format!r} to load it"))
    if moved and saved.format not in RESHARDING_FORMATS:
        out.append(Barrier("format", f"the checkpoint was saved as {saved.format!r} (one file per TP/PP rank), which "
                                     f"loads only on the TP/PP that saved it, and {where}",
                           "save it as 'torch_dist' (checkpoint.ckpt_format), which reshards across TP, PP and DP, "
                           "or keep each module's TP and PP"))
    sharding = saved.optimizer_sharding
    if moved and load_optim and sharding in DP_ONLY:
        out.append(Barrier("optimizer", f"the distributed optimizer's state was saved {sharding!r} "
                                        "(checkpoint.dist_ckpt_optim_fully_reshardable=False), which reshards across DP "
                                        f"only, and {where}",
                           "save with checkpoint.dist_ckpt_optim_fully_reshardable=True (upstream's Qwen3.5-VL launcher "
                           "sets it) and resume from that checkpoint, keep each module's TP and PP, or set "
                           "checkpoint.load_optim=False to start the optimizer's state afresh"))
    dp_moved = saved.rng_per_dp and any(saved.parallelism[m][2] != s[2] for m, s in now.parallelism.items())
    if (moved or dp_moved) and saved.save_rng and load_rng:
        keyed = "TP/PP/DP" if saved.rng_per_dp else "TP/PP"
        out.append(Barrier("rng", f"the checkpoint holds each rank's RNG state (checkpoint.save_rng=True) by its {keyed} "
                                  f"rank, and {where or 'the DP sizes change'}: Bridge skips its TP/PP check for "
                                  "MegatronMIMO, so its load would stop on a missing rng_state key",
                           "set checkpoint.load_rng=False (the new ranks draw from the seed, as Megatron does on a "
                           "TP/PP change; upstream's Qwen3.5-VL launcher saves none: save_rng=False)"))
    return out


def read_order(s: RunSettings, samples: int) -> tuple:
    """What decides the global order Bridge's sampler reads from a ``consumed_samples`` on, over a
    dataset of ``samples``: ``single`` nothing; ``cyclic`` the samples its epoch permutes (and, per
    canonical group under #5525's scalable reads, the grid and the micro-batch)."""
    if s.dataloader_type != "cyclic":
        return (s.dataloader_type,)
    if s.canonical_reads:
        return ("cyclic", "canonical", s.grid, s.micro_batch, samples // s.micro_batch * s.micro_batch, s.data_sharding)
    return ("cyclic", samples - samples % s.micro_batch)


def order_barriers(saved: RunSettings, now: RunSettings, *, samples: int, consumed: int,
                   window: int = 1) -> list[Barrier]:
    """What stops ``now`` reading on from sample ``consumed`` of the global order ``saved`` read
    (a dataset of ``samples``), each sample once: another sampler, another cyclic permutation, a
    reorder window of ``window`` micro-batches that would not start at a step."""
    out = []
    if saved.dataloader_type != now.dataloader_type:
        out.append(Barrier("order", f"the checkpoint's run read its data in {saved.dataloader_type!r} order and this run "
                                    f"in {now.dataloader_type!r}, so it would read other samples next",
                           f"set the dataset's dataloader_type={saved.dataloader_type!r}"))
    elif read_order(saved, samples) != read_order(now, samples):
        if saved.canonical_reads or now.canonical_reads:
            why = (f"under scalable reads each of the G={saved.grid} canonical groups of the checkpoint's run drew its "
                   f"own permutation of {saved.micro_batch}-sample micro-batches, and this run's G={now.grid}, "
                   f"{now.micro_batch}-sample micro-batches draw others")
            fix = ("keep the lcm of the module DPs and the micro-batch size, or read with dataloader_type='single', "
                   "or switch at an epoch's end")
        else:
            keep = [m for m in range(1, 4 * max(saved.micro_batch, now.micro_batch) + 1)
                    if samples % m == samples % saved.micro_batch and now.global_batch % m == 0
                    and all(m % dp == 0 for _, _, dp in now.parallelism.values())][:4]
            why = (f"the cyclic sampler permutes each epoch over the dataset's samples less its remainder by the "
                   f"micro-batch ({samples} % {saved.micro_batch} = {samples % saved.micro_batch} in the checkpoint's "
                   f"run, {samples} % {now.micro_batch} = {samples % now.micro_batch} here), so a micro-batch of "
                   f"{now.micro_batch} draws another permutation")
            fix = (f"use a micro-batch size that leaves the same remainder ({', '.join(map(str, keep))})" if keep
                   else f"keep micro-batches of {saved.micro_batch}") + " or read with dataloader_type='single'"
        out.append(Barrier("order", f"{why} and would repeat and skip samples", fix))
    if window > 1 and (consumed // now.micro_batch) % window:
        batch = (f"the checkpoint's run trained global batches of {saved.global_batch} and this run "
                 f"{now.global_batch}, so " if saved.global_batch != now.global_batch else "")
        out.append(Barrier("order", f"{batch}consumed_samples={consumed} is not the start of a {window}-micro-batch "
                                    "reorder window, which would take samples across the switch",
                           f"resume with global batches of {saved.global_batch}, or set reorder_window=1"))
    return out


def batch_barrier(saved: RunSettings, now: RunSettings) -> Optional[Barrier]:
    """A global batch of another size: the same samples in other steps, a learning-rate schedule
    per iteration that no longer fits them (not a continuation of the run)."""
    if saved.global_batch == now.global_batch:
        return None
    return Barrier("global batch", f"the run trains global batches of {saved.global_batch} and this layout "
                                   f"{now.global_batch}: every step after the switch would take other samples, and the "
                                   "learning-rate schedule counts steps",
                   f"keep the global batch at {saved.global_batch} (--gbs {saved.global_batch})")


def carried(saved: RunSettings, now: RunSettings, barriers: tuple = ()) -> list[str]:
    """What the checkpoint carries to ``now``, one line each: all but what ``barriers`` stop."""
    blocked = {b.what for b in barriers}
    out = []
    if not blocked & {"model", "format"}:
        out.append(f"the weights ({saved.format}: " + ("reshards across TP, PP and DP)" if saved.format in RESHARDING_FORMATS
                                                        else "each module's TP and PP kept)"))
    if not blocked & {"model", "format", "optimizer"}:
        sharding = saved.optimizer_sharding
        out.append("the optimizer's state (" + (
            "no distributed optimizer: each parameter's state by its global shape)" if sharding is None
            else f"{sharding} reshards across TP, PP and DP)" if sharding in FULLY_RESHARDABLE
            else f"{sharding} reshards across DP; each module's TP and PP stay)"))
    if "order" not in blocked:
        order = "in order" if saved.dataloader_type == "single" else f"in {saved.dataloader_type} order"
        out.append(f"the data position: Bridge restarts its sampler at consumed_train_samples ({order}); mimo_accel "
                   f"cuts each global micro-batch on the new canonical grid (G={now.grid}) and reads on from the next "
                   "sample, or stops before the first step, naming why")
    return out
