"""The profiler's hooks into a real MegatronMIMO run, installed at upstream's sites by
:mod:`mimo_accel.runtime.patches.profiler` only when ``profile`` or online calibration is on.

Each module is timed under its own name (:mod:`mimo_accel.modules`: regions ``<module>_fwd`` /
``<module>_bwd``). The step's first look at the MimoModel names its ``ModalitySubmodules`` and
times the language model (:meth:`Profiling.saw_model`); ``encode`` times and counts each encoder
(:func:`encoder_counts`); the step's batch hook counts samples, real tokens and reads
(:meth:`Profiling.record_batch`); ``MimoOptimizer.step`` closes the step line and hands it to
:mod:`mimo_accel.runtime.measuring.metrics`; ``train_megatron_mimo`` brings Bridge's
``global_state`` and closes the file at the end. Evaluation passes (forward-only under
``torch.no_grad``) are in no step line.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
import weakref
from typing import Any, Optional

import numpy as np

from mimo_accel.modules import LANGUAGE
from mimo_accel.profiler.timers import iter_tensors
from mimo_accel.runtime.state import Runtime


ENV_LABEL = "MIMO_ACCEL_PROFILE_LABEL"

NO_TOKEN_SOURCE = ("mimo_accel profile: a language batch has no length source it can read (a [batch, seq] "
                   "attention_mask, or loss_mask and input_ids): its real tokens are not counted (0 in the step lines)")
UNKNOWN_LENGTHS = ("mimo_accel profile: some samples' real length is not known (no padding marked, no loss_mask "
                   "marking where their tokens end): those samples count as their whole row in tokens")
NO_RUN_TOKEN = ("mimo_accel profile: the job's rendezvous store gave no run token: the profile's run id is the "
                "launcher's alone (or none), so the report cannot tell this run's rank files from another's "
                "started with the same launcher settings; write each run to a directory of its own")
_UNKNOWN = "unknown lengths"  # a pending count that is no counter: the samples of unknown length


def evaluating() -> bool:
    """A forward pass outside training: Bridge's ``evaluate`` runs its forward-only passes under
    ``torch.no_grad`` (a training step's batch fetch and encoder forward run with grad enabled;
    a recomputation inside a backward has a graph task and is not an evaluation)."""
    import torch

    return not torch.is_grad_enabled() and torch._C._current_graph_task_id() == -1


def encoder_counts(inputs: dict, output: Any = None) -> Optional[tuple]:
    """What one encoder forward counts: ``(items, rows, sq_rows)``, or None when its
    inputs hold no tensor. ``rows`` / ``sq_rows`` may be 0-d tensors (read back at the step's end,
    so counting adds no host sync per micro-batch).

    - Patch-packed inputs (a ``grid_thw`` of one ``(t, h, w)`` row per image, as Qwen-VL's vision
      encoder takes them): items = images (rows of ``grid_thw``), rows of an item = its patches
      ``t·h·w`` before merging.
    - Any other inputs (audio features, video clips as a batch, ...): items = the clips in the
      batch (the leading dimension of the first tensor input), and rows of an item =
        1. the encoder's output rows of that item, where the output is ``(items, rows, hidden)``
           (padding included: what the encoder computed; Whisper's 1500 rows per 30 s clip), or
           ``(rows, hidden)`` of a single item;
        2. else, its input's time length: the row sums of a 2-D ``(items, time)`` mask input (a
           key with ``mask`` in its name), or else the longest non-batch dimension of the first
           input of two or more dimensions (``(items, mel bins, frames)`` -> frames).
    - ``sq_rows``: Σ over the items of rows² (the attention term).
    """
    import torch

    grid = None
    for key, value in inputs.items():
        if isinstance(value, torch.Tensor) and (key == "grid_thw" or key.endswith("_grid_thw")):
            grid = value
            break
    if grid is not None:
        if not grid.numel():
            return 0, 0, 0
        per_item = grid.reshape(-1, grid.size(-1)).prod(dim=-1)
        return int(per_item.size(0)), per_item.sum(), (per_item * per_item).sum()
    first = next((v for v in inputs.values() if isinstance(v, torch.Tensor) and v.dim() >= 1), None)
    if first is None:
        return None
    items = int(first.size(0))
    if not items:
        return 0, 0, 0
    out = next(iter_tensors(output, torch.Tensor), None)
    if out is not None and out.dim() == 3 and out.size(0) == items:
        rows = int(out.size(1))
        return items, items * rows, items * rows * rows
    if out is not None and out.dim() == 2 and items == 1:
        rows = int(out.size(0))
        return 1, rows, rows * rows
    for key, value in inputs.items():
        if (isinstance(value, torch.Tensor) and "mask" in key and value.dim() == 2
                and int(value.size(0)) == items):
            per_item = (value != 0).sum(dim=1)
            return items, per_item.sum(), (per_item * per_item).sum()
    shaped = next((v for v in inputs.values() if isinstance(v, torch.Tensor) and v.dim() >= 2), None)
    if shaped is None:
        return items, items, items  # one row per item: (items,) inputs
    rows = int(max(shaped.shape[1:]))
    return items, items * rows, items * rows * rows


def _host_ints(rows: list) -> list:
    """Rows of counts, each an int or a device scalar, as ints: the device scalars read back in one
    copy (one per forward each would cost a host sync apiece at the step's end)."""
    import torch

    on_device = [v for row in rows for v in row if isinstance(v, torch.Tensor)]
    read = iter(torch.stack([v.reshape(()).to(torch.int64) for v in on_device]).tolist() if on_device else [])
    return [[next(read) if isinstance(v, torch.Tensor) else int(v) for v in row] for row in rows]


class Profiling:
    """The profiler's state in one training process: the rank's recorder, its module timers and
    the device-side counts of the current step."""

    def __init__(self, runtime: Runtime):
        self.runtime = runtime
        self._lock = threading.Lock()
        self._recorder = None
        self._noted: set = set()  # notice keys already written into a step line
        self._timers: dict[int, Any] = {}  # id(module) -> its ModuleTimer
        self._hooks: list = []  # the encoders' counting hooks
        # which module each ModalitySubmodules object of this rank's MimoModel is (saw_model)
        self._module_of: "weakref.WeakKeyDictionary[Any, str]" = weakref.WeakKeyDictionary()
        # Device-side counts of the current step, read back once at the step's end (the optimizer
        # step has synchronised by then), so profiling adds no host sync per micro-batch.
        self._pending_counts: list = []
        self._unpacked: list = []  # unpacked batches: counted at the step's end, where the step's role is known
        # each encoder forward's (module, items, rows, sq_rows) this step, in call
        # order (one a micro-batch): the step's counters, and what the online calibration learns a
        # one-replica module's cost from
        self._micro_counts: list = []
        self._plan_wait_s: Optional[float] = None  # this step's wait for its plans (planned batches only)
        # this step's planned load of every replica of each module (summed over its micro-batches),
        # and the per-replica overhead of the model that planned them
        self._planned: dict = {}
        self._planned_overheads: dict = {}
        self.metrics = None  # runtime.metrics.Metrics of the training run under way, if it logs
        self._flops: Optional[dict] = None  # the header's layout["flops"] (runtime.model_flops), from start_run
        # the header's layout["run"]: what the run's checkpoint depends on (runtime.resume), from start_run
        self._run: Optional[dict] = None
        self._build: Optional[dict] = None  # the header's build (measuring.job_build), from start_run

    def recorder(self):
        """This rank's Recorder, created on first use (needs torch.distributed to be initialised)."""
        if self._recorder is not None:
            return self._recorder
        with self._lock:
            if self._recorder is None:
                import torch.distributed as dist

                from mimo_accel.profiler import Recorder, module_counters, module_regions
                from mimo_accel.runtime.measuring.run_id import run_identity

                ctx = self.runtime.shard_context()
                rank = dist.get_rank() if dist.is_initialized() else 0
                world = dist.get_world_size() if dist.is_initialized() else 1
                cfg = self.runtime.config  # as enabled (what acts: runtime.features())
                # no profile file (online calibration alone): no run to name
                run_id, run_id_from = run_identity(str(cfg.profile)) if cfg.profile is not None else (None, None)
                if run_id_from in ("launcher", "none"):
                    self.runtime.say_once("profile:run-id", NO_RUN_TOKEN)
                # this rank's module: its regions (and an encoder's counters) in every step line
                regions = module_regions(ctx.module) if ctx else ()
                counters = module_counters(ctx.module) if ctx and ctx.module != LANGUAGE else ()
                self._recorder = Recorder(
                    cfg.profile, rank=rank, world_size=world,
                    module=ctx.module if ctx else "unknown",
                    dp_rank=ctx.dp_rank if ctx else 0, dp_size=ctx.dp_size if ctx else 1,
                    # pp: each module's stages, for the report's replay of the schedule
                    layout={**({"dp": dict(ctx.dp_sizes), "pp": dict(ctx.stages)} if ctx else {}),
                            **({"flops": self._flops} if self._flops else {}),
                            **({"run": self._run} if self._run else {})},
                    config={"features": self.runtime.features(), "reorder_mode": cfg.reorder_mode,
                            "pad_multiple": cfg.pad_multiple},
                    label=os.environ.get(ENV_LABEL) or ("accelerated" if cfg.sharded_reads or cfg.packing
                                                        else "baseline"),
                    regions=regions, counters=counters, build=self._build, run_id=run_id,
                    run_id_from=run_id_from)
        return self._recorder

    def saw_model(self, mimo_model) -> None:
        """The MimoModel this rank runs, first seen by the step: which of its
        ``ModalitySubmodules`` is which module (``modality_submodules`` maps module name ->
        submodule), and a timer on its language model where this rank holds one (regions
        ``language_fwd`` / ``language_bwd``; evaluation forwards are not timed)."""
        submodules = getattr(mimo_model, "modality_submodules", None)
        if submodules is not None:
            for name, submodule in submodules.items():
                with contextlib.suppress(TypeError):  # not weak-referenceable: named by fallback
                    self._module_of[submodule] = str(name)
        lm = getattr(mimo_model, "language_model", None)
        if lm is not None and hasattr(lm, "register_forward_pre_hook") and id(lm) not in self._timers:
            from mimo_accel.profiler import attach_module_timer

            rec = self.recorder()
            with self._lock:
                if id(lm) not in self._timers:
                    self._timers[id(lm)] = attach_module_timer(lm, rec, name=LANGUAGE, skip=evaluating)

    def module_of(self, submodule) -> str:
        """The module name of a ``ModalitySubmodules`` (what :meth:`saw_model` learnt). One the step
        has not shown: this rank's own module when it is an encoder, else the layout's one encoder
        of the submodule's kind (:func:`submodule_kind`); with neither, said once, the name format 1
        timed every encoder under (the report reads its time as the rank's encoder's)."""
        with contextlib.suppress(TypeError):
            name = self._module_of.get(submodule)
            if name is not None:
                return name
        ctx = self.runtime.shard_context()
        if ctx is not None:
            if ctx.module != LANGUAGE:
                return ctx.module
            encoders = ctx.modules.encoders
            kind = submodule_kind(submodule)
            named = [m.name for m in encoders if len(encoders) == 1 or m.kind == kind]
            if len(named) == 1:
                return named[0]
        from mimo_accel.profiler.recorder import UNNAMED_ENCODER

        self.runtime.say_once(f"profile:unnamed-encoder:{type(submodule).__name__}",
                              f"mimo_accel profile: a {type(submodule).__name__} encoded before the step named its "
                              f"module; its time is recorded as {UNNAMED_ENCODER!r}")
        return UNNAMED_ENCODER

    def close(self) -> None:
        with self._lock:
            for timer in self._timers.values():
                timer.remove()
            self._timers.clear()
            for hook in self._hooks:
                hook.remove()
            self._hooks.clear()
            self._module_of.clear()
            self._pending_counts.clear()
            self._unpacked.clear()
            self._micro_counts.clear()
            self._noted.clear()
            self.metrics = None
            if self._recorder is not None:
                self._recorder.close()
            self._recorder = None

    def start_run(self, global_state, model=None) -> None:
        """Bridge's training loop starts with ``global_state`` and the ``model`` it trains: its figures go
        to Bridge's writers when its logger has any (:meth:`mimo_accel.runtime.measuring.metrics.Metrics.for_run`);
        each module's FLOPs shape is read from its provider for the profile header
        (:mod:`~mimo_accel.runtime.measuring.model_flops`), and how this rank's modules were built from
        the model (:mod:`~mimo_accel.runtime.measuring.job_build`)."""
        from mimo_accel.runtime.measuring.job_build import job_build
        from mimo_accel.runtime.measuring.metrics import Metrics
        from mimo_accel.runtime.measuring.model_flops import flops_layout
        from mimo_accel.runtime.resume import run_record

        self._flops = flops_layout(getattr(getattr(global_state, "cfg", None), "model", None))
        self._run = run_record(getattr(global_state, "cfg", None))
        self._build = job_build(model, global_state) if model is not None else None

        if self.runtime.calibration is not None:  # every rank: what a resumed run learnt before (once)
            self.runtime.calibration.restore()
        self.metrics = (Metrics.for_run(global_state, self.runtime.calibration) if global_state is not None
                        else None)

    def finish(self, failed: bool = False) -> None:
        """Training ended (``failed``: with an exception): close this rank's file (a recorder not
        yet made stays unmade); the run's metrics write their last figures, or, after a failure,
        leave them unwaited."""
        metrics, self.metrics = self.metrics, None
        if metrics is not None and failed:
            metrics.abandon()
        elif metrics is not None:
            metrics.close()
        with self._lock:
            if self._recorder is not None:
                self._recorder.close()

    def record_batch(self, batch: dict, *, read_samples: int, read_bytes: int = 0, tag=None,
                     count_tokens: bool = True) -> None:
        """Called by the step with the local batch of this step. ``read_bytes``: tensor bytes of the
        batch as it reached the step (the whole micro-batch upstream, the share when sharded); on
        language ranks upstream has already dropped the raw images by then. ``tag``: the batch's
        :class:`~mimo_accel.runtime.reading.shard.ShardTag` when sharded reads delivered it. ``count_tokens``:
        False where the batch is packed next (:meth:`record_packed` then counts what the language
        model computes)."""
        rec = self.recorder()
        if rec is None or evaluating():  # an evaluation pass is not part of a training step
            return
        ids = batch.get("input_ids")
        samples = int(ids.size(0)) if ids is not None and ids.dim() == 2 else 0
        rec.add(samples=samples, samples_read=read_samples, bytes_read=read_bytes)
        role = self.runtime.step_role  # this step's, or where it is not known yet the last one's
        if count_tokens and (role is None or role.is_language):
            # the tensors the lengths come from, held (not copied) until the step's end
            self._unpacked.append({k: batch.get(k) for k in ("attention_mask", "loss_mask", "input_ids")})
        if tag is not None and tag.bytes_exchanged:
            rec.add(bytes_exchanged=int(tag.bytes_exchanged))
        share = tag.share if tag is not None else None
        if share is None:
            return
        if share.step_time is not None:  # the step the plan expects (model units)
            rec.set(predicted_step_s=share.step_time)
        if share.loads:  # each replica's planned load: the step's figure is their sum
            for module, row in share.loads.items():
                seen = self._planned.get(module)
                row = np.asarray(row, dtype=np.float64)
                self._planned[module] = row.copy() if seen is None else seen + row
            self._planned_overheads = dict(share.overheads)
            if share.cost_model is not None:  # the cost model the step was planned with (online calibration)
                rec.set(cost_model=share.cost_model)
        else:  # a plan without loads (exchange mode): its micro-batch's figure, the last one's
            if share.spread is not None:
                rec.set(predicted_spread=share.spread)
            if share.spreads:
                rec.set(predicted_spreads=dict(share.spreads))
        if share.planned:
            self._plan_wait_s = (self._plan_wait_s or 0.0) + share.plan_wait_s

    def record_packed(self, packing_kwargs: dict) -> None:
        """A language shard was packed: its real tokens (``tokens`` = Σ L, ``sq_tokens`` = Σ L² over
        its samples, L from ``cu_seqlens_q``, which keeps the real lengths) are what the language
        model computes."""
        rec = self.recorder()
        if rec is None or evaluating():
            return
        lengths = packing_kwargs["cu_seqlens_q"].diff()
        self._pending_counts.extend((("tokens", lengths.sum()), ("sq_tokens", (lengths * lengths).sum())))

    def _attach_new_notes(self, rec) -> None:
        """Notices said since the last step (which length source packing used, nothing to balance,
        ...) go into this step's line, so the report shows them beside the figures they explain."""
        said = self.runtime.notices()
        new = [m for k, m in said.items() if k not in self._noted]
        if new:
            self._noted.update(said)
            rec.set(notes=new)

    def _count_unpacked(self) -> None:
        """The real tokens of the step's batches that are not packed, on the device (read back with
        the step's other counts): upstream's padded batches compute B × S, of which Σ L are real. A
        rank known to run an encoder counts none."""
        batches, self._unpacked = self._unpacked, []
        role = self.runtime.step_role
        if not batches or (role is not None and not role.is_language):
            return
        from mimo_accel.sample_lengths import real_lengths

        for batch in batches:
            try:
                found = real_lengths(batch, tuple(role.placeholder_ids or ()) if role is not None else ())
            except Exception:  # a count the profile can go without: the step must not fail for it
                found = None
            if found is None:
                self.runtime.say_once("profile:tokens:no-source", NO_TOKEN_SOURCE)
                continue
            lengths, unknown = found
            self._pending_counts += [("tokens", lengths.sum()), ("sq_tokens", (lengths * lengths).sum()),
                                     (_UNKNOWN, unknown.sum())]

    def end_step(self) -> None:
        rec = self.recorder()
        if rec is None:
            return
        self._count_unpacked()
        # every count of the step read back at once: the language tokens, then each encoder forward's
        pending, forwards = self._pending_counts, self._micro_counts
        values = _host_ints([[v for _, v in pending]] + [[items, rows, sq] for _, items, rows, sq in forwards])
        for (name, _), value in zip(pending, values[0]):
            if name != _UNKNOWN:
                rec.add(**{name: value})
                rec.add_micro(**{name: value})  # one a batch: a micro-batch's real tokens
            elif value:
                self.runtime.say_once("profile:tokens:unknown", UNKNOWN_LENGTHS)
        for (module, *_), (items, rows, sq_rows) in zip(forwards, values[1:]):
            counts = {f"{module}_items": items, f"{module}_rows": rows, f"{module}_sq_rows": sq_rows}
            rec.add(**counts)
            rec.add_micro(**counts)
        pending.clear()
        forwards.clear()
        if self._plan_wait_s is not None:  # the training thread's wait for this step's plans
            rec.set(plan_wait_s=round(self._plan_wait_s, 6))
            self._plan_wait_s = None
        if self._planned:
            spreads = planned_spreads(self._planned, self._planned_overheads)
            rec.set(predicted_spreads=spreads, predicted_spread=max(spreads.values()))
            self._planned = {}
        calibration = self.runtime.calibration
        if calibration is not None and (refits := calibration.take_refits()):
            rec.set(online_refits=refits)
        self._attach_new_notes(rec)
        record = rec.end_step()
        if self.metrics is not None:
            self.metrics.after_step(rec.header, record)

    def time_encoders(self, submodule, encoders_data_batch) -> None:
        """Attach a timer and a counting hook to each encoder of ``submodule`` on first use, both
        named by the submodule's module (:meth:`module_of`)."""
        from mimo_accel.profiler import attach_module_timer

        encoders = getattr(submodule, "encoders", None) or {}
        new = [e for e in encoders.values() if id(e) not in self._timers]
        if not new:
            return
        rec = self.recorder()
        module = self.module_of(submodule)
        with self._lock:
            for encoder in new:
                if id(encoder) in self._timers:
                    continue
                self._timers[id(encoder)] = attach_module_timer(encoder, rec, name=module)
                self._hooks.append(encoder.register_forward_hook(
                    functools.partial(self._count_encoder, module), with_kwargs=True, always_call=False))

    def _count_encoder(self, module: str, encoder, args, kwargs, output) -> None:
        """Forward hook of an encoder: count what it encoded (:func:`encoder_counts`) into this
        step; not an evaluation, not a recomputation inside a backward."""
        import torch

        if evaluating() or torch._C._current_graph_task_id() != -1:
            return
        inputs = dict(kwargs) if kwargs else {}
        if not inputs and args:
            inputs = {f"arg{i}": a for i, a in enumerate(args)}
        counts = encoder_counts(inputs, output)
        if counts is None:
            return
        self._micro_counts.append((module, *counts))  # read back at the step's end (end_step)

    def paused_timers(self) -> contextlib.ExitStack:
        stack = contextlib.ExitStack()
        for timer in list(self._timers.values()):
            stack.enter_context(timer.paused())
        return stack


def submodule_kind(submodule) -> Optional[str]:
    """The kind of module a megatron-core ``ModalitySubmodules`` encodes, from its class
    (``VisionModalitySubmodules``: image, ``AudioModalitySubmodules``: audio, ...); None unknown."""
    name = type(submodule).__name__.lower()
    return next((kind for word, kind in (("video", "video"), ("audio", "audio"), ("vision", "image"),
                                         ("image", "image")) if word in name), None)


def planned_spreads(loads: dict, overheads: dict) -> dict:
    """Each module's predicted straggler of a step, on the basis of the measured one: max / mean over
    its replicas of their planned load summed over the step's micro-batches, plus the per-replica
    overhead the model in use leaves over (in seconds once the model has been learnt: the same
    unit as its coefficients)."""
    out = {}
    for module, row in loads.items():
        totals = np.asarray(row, dtype=np.float64) + overheads.get(module, 0.0)
        mean = float(totals.mean()) if totals.size else 0.0
        out[module] = float(totals.max()) / mean if mean > 0 else 1.0
    return out
