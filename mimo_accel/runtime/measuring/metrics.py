"""mimo_accel's per-step figures in Megatron Bridge's own TensorBoard and W&B writers.

Bridge's MIMO loop logs through ``GlobalState.tensorboard_logger`` / ``.wandb_logger``, which
exist on the job's last rank only (``cfg.logger.tensorboard_dir`` / ``cfg.logger.wandb_project``
set). With the profiler on, every logged iteration (``iteration % cfg.logger.log_interval == 0``,
the interval of Bridge's own MIMO ``iteration-time`` scalar) adds, under ``mimo_accel/``:

* per module ``m`` (each encoder under its config name, and ``language``):
  ``m/straggler`` (max / mean over the module's DP replicas of their forward + backward time this
  step; a replica's time is the max over its TP/PP ranks), ``m/straggler_planned`` (what the plan
  predicted for it, with ``reorder``: the step line's ``predicted_spreads``, i.e. the plan of the
  step's last micro-batch), ``m/slowest_replica_s`` and ``m/slowest_replica`` (its DP
  rank), ``m/samples_read_per_rank`` and ``m/bytes_read_per_rank`` (mean over the module's ranks);
* ``language/tokens``: a histogram of the real tokens each language replica computed this step
  (packed: its ``cu_seqlens``; else its attention-mask rows), beside the scalars
  ``language/tokens_max``, ``language/tokens_mean`` and ``language/tokens_straggler`` (max / mean):
  no tag's count grows with the data-parallel size;
* per module ``m``, its throughput this step (:func:`mimo_accel.costs.flops.throughput`; the step's
  time: the longest ``step_time_s`` of any rank): ``m/samples_per_s``, ``m/tokens_per_s_per_gpu``
  (the language model's real tokens, an encoder's rows), ``m/tflops_per_gpu`` (its model FLOPs, where
  the writing rank's profile header has the module's FLOPs shape) and ``m/mfu`` (where the device is
  in :data:`~mimo_accel.costs.flops.PEAK_BF16_TFLOPS`); per GPU: over the module's tp·cp·pp·dp ranks;
* per module ``m``, ``m/busy_share``: the step replayed on a device per rank from every rank's
  forward and backward times per micro-batch (:mod:`mimo_accel.balance.replay`, the report's
  replay), the mean over the module's devices (replica × PP stage) of busy time / the replayed
  step; 1 − it is the share its ranks wait. The module whose busiest device is busiest bounds the
  step (the report names it);
* ``reads/samples``, ``reads/bytes``, ``reads/bytes_exchanged``: summed over every rank;
* ``plan_wait_s`` (with ``reorder``): the longest any rank's training thread waited this step for a
  plan made ahead (0 while planning keeps up).

These are the report's definitions (:mod:`mimo_accel.tools.report`), for one step.

How the figures reach the logging rank: every rank reaches the optimizer-step hook once per
iteration (:func:`mimo_accel.runtime.patches.profiler.wrap_optimizer_step`). On a logged iteration each
rank puts its step figures (a few numbers and its micro-batches' times in whole microseconds, as
JSON) under its own key in the job's rendezvous store —
a ``set`` that does not wait for anyone. The writing rank hands the rest to a thread of its own,
over its own connection to the store (a clone), so its training thread never waits there: the
thread waits for the others' keys, reads them with one ``multi_get``, marks the iteration done (one
key), deletes the writing rank's own key and writes the scalars to TensorBoard. One logged
iteration is in flight at a time: the writing rank's next optimizer-step hook (on any iteration)
collects it — by then every rank has long set its key, so it is done — logs its W&B row on the
training thread (W&B drops a row of a step older than its latest, and Bridge logs the next step
right after the hook) and raises its error there, e.g. the ranks that never came, named. So the
writes are in iteration order, and :meth:`Metrics.close` at the end of training collects the last.
Each other rank deletes its own keys once it sees them done, at its next logged iteration or when
training ends, so no rank deletes for the others. No process group is created and no collective
runs, so no rank can be left waiting in one.

Why only with the profiler: the figures are the profiler's (its encoder and language-model timers,
its read counts); without ``profile`` none of them exist and nothing here is installed.
"""

from __future__ import annotations

import datetime
import json
import logging
import queue
import threading
import time
from typing import Any, Optional

import numpy as np

from mimo_accel.runtime.measuring.step_figures import model_scalars, rank_figures, step_histograms, step_scalars
from mimo_accel.runtime.store import next_round, store_key

logger = logging.getLogger("mimo_accel")

# The metrics thread waits in the store this long at a time, so a failed run's stop is seen that
# soon (a thread still in a store call when the interpreter exits can abort the process); each
# wait that times out (a rank over a second late) logs a c10d socket warning.
_POLL_S = 1.0

# ---------------------------------------------------------------------------------- in training


def _store():
    from mimo_accel.runtime.store import default_store

    return default_store()


class Metrics:
    """One training run's figures into Bridge's writers (made at the train entry; see the module
    docstring). ``store``: where the figures meet (default: the job's rendezvous store)."""

    def __init__(self, global_state: Any, *, rank: int, world: int, store: Any = None, calibration: Any = None,
                 writes: bool = True, lead: int = 1):
        logger_cfg = global_state.cfg.logger
        self.state = global_state
        self.interval = max(1, int(getattr(logger_cfg, "log_interval", 1) or 1))
        self.rank, self.world = rank, world
        # online calibration (runtime.calibration): every step's figures reach the writing rank,
        # which learns from them and announces refits ``lead`` iterations ahead of its own
        self.calibration = calibration
        if calibration is not None:  # every rank: the fitting rank learns from this run's figures
            calibration.gathers = True
        self.writes = writes  # whether the logged iterations go to Bridge's writers
        self.writer_rank = world - 1  # GlobalState makes its writers on rank N-1 only
        self.run = next_round("metrics")  # a train entry: two runs' keys in one job never meet
        self._store = store
        self._pending: list[int] = []  # logged iterations whose key this rank set and has not deleted
        self._worker: Optional[_Worker] = None  # the writing rank's metrics thread
        self._job: Optional[_Job] = None  # the writing rank's logged iteration in flight
        self.written = 0  # logged steps this rank wrote (the writing rank only)
        self.lead = lead
        if calibration is not None and rank == self.writer_rank:  # the fitting rank keeps the schedule
            calibration.save()
        self._histograms: dict = {}  # the last logged iteration's distributions (the writing rank)
        self._flops: Optional[dict] = None  # the writing rank's profile header's layout["flops"]

    @classmethod
    def for_run(cls, global_state: Any, calibration: Any = None) -> Optional["Metrics"]:
        """Metrics for the run of ``global_state``, or None when nothing reads them: Bridge's logger
        writes nowhere (neither ``tensorboard_dir`` nor ``wandb_project``; or
        ``skip_train_metrics_log``) and no online ``calibration`` learns from them. Every rank
        decides alike: the logger config and the options are the job's."""
        import torch.distributed as dist

        logger_cfg = getattr(getattr(global_state, "cfg", None), "logger", None)
        writes = logger_cfg is not None and not getattr(logger_cfg, "skip_train_metrics_log", False) and bool(
            getattr(logger_cfg, "tensorboard_dir", None) or getattr(logger_cfg, "wandb_project", None))
        if logger_cfg is None or not dist.is_initialized() or not (writes or calibration is not None):
            return None
        lead = calibration.lead if calibration is not None else 1
        return cls(global_state, rank=dist.get_rank(), world=dist.get_world_size(), calibration=calibration,
                   writes=writes, lead=lead)

    def iteration_logged(self) -> Optional[int]:
        """The iteration the optimizer step now ending belongs to (Bridge counts it after the
        step), when it is one Bridge logs; else None."""
        iteration = int(self.state.train_state.step) + 1
        return iteration if self.writes and iteration % self.interval == 0 else None

    def iteration_gathered(self) -> tuple[Optional[int], bool]:
        """The iteration now ending when its figures are gathered (every one while calibrating, else
        the logged ones), and whether it is logged."""
        iteration = int(self.state.train_state.step) + 1
        logged = self.iteration_logged() is not None
        return (iteration if logged or self.calibration is not None else None), logged

    def after_step(self, header: dict, record: dict) -> None:
        """Called on every rank at the end of each optimizer step with its step line."""
        if self._job is not None:  # the writing rank: the previous gathered iteration is collected first
            self._collect()
        iteration, logged = self.iteration_gathered()
        if iteration is None:
            return
        if self._flops is None:  # every module's FLOPs shape, for the throughput scalars
            self._flops = (header.get("layout") or {}).get("flops") or {}
        store = self.store()
        micro = self.calibration is not None and self.calibration.language_per_micro_batch
        store.set(self._key(iteration, self.rank),
                  json.dumps(rank_figures(header, record, times=logged, language_micro=micro)))
        if self.rank == self.writer_rank:
            if self._worker is None:  # its own connection: a wait there holds up no other call
                self._worker = _Worker(self, store.clone())
            # Bridge makes its writer on first use: here, on the training thread, never on two at once
            self._job = self._worker.submit(iteration, self.state.tensorboard_logger if logged else None, logged)
            if self.calibration is not None and self._checkpointed(iteration):
                # what this iteration taught is announced (and written beside the checkpoints) before
                # Bridge saves it, so a run resumed from it plans as this one goes on to
                self._collect()
        else:
            self._pending.append(iteration)
            self._delete_consumed(store)

    def _checkpointed(self, iteration: int) -> bool:
        """Whether Bridge saves a checkpoint after ``iteration`` (its save interval, or the last one)."""
        cfg = getattr(self.state, "cfg", None)
        checkpoint, train = getattr(cfg, "checkpoint", None), getattr(cfg, "train", None)
        if not getattr(checkpoint, "save", None):
            return False
        interval = getattr(checkpoint, "save_interval", None)
        return bool(interval and iteration % interval == 0) or iteration == getattr(train, "train_iters", None)

    def close(self) -> None:
        """Training ended: the writing rank collects its last logged iteration (writes it, or raises
        its error) and ends its metrics thread; every other rank deletes its keys the writing rank
        has read."""
        try:
            if self._job is not None:
                self._collect()
        finally:
            self._end_worker()
        if self._pending:
            self._delete_consumed(self.store())

    def abandon(self) -> None:
        """Training failed: end the metrics thread without the logged iteration in flight, if any
        (the ranks it waits for may never come; it gives up within a short wait of the store)."""
        self._job = None
        if self._worker is not None:
            self._worker.stop.set()
        self._end_worker()

    def _end_worker(self) -> None:
        worker, self._worker = self._worker, None
        if worker is not None:
            worker.shutdown()

    def store(self):
        return self._store if self._store is not None else _store()

    def _key(self, iteration: int, rank: int) -> str:
        return store_key("metrics", self.run, iteration, rank)

    def _done_key(self) -> str:
        return store_key("metrics", self.run, "done")

    def _delete_consumed(self, store) -> None:
        """Delete this rank's keys of the iterations the writing rank has read (no waiting)."""
        if not store.check([self._done_key()]):
            return
        done = int(store.get(self._done_key()))
        for iteration in [i for i in self._pending if i <= done]:
            store.delete_key(self._key(iteration, self.rank))
            self._pending.remove(iteration)

    def _collect(self) -> None:
        """The logged iteration in flight, finished (waited for if it is not): its W&B row logged on
        this thread, or its error raised here."""
        job, self._job = self._job, None
        job.done.wait()
        if job.error is not None:
            raise job.error
        if not job.logged:
            return
        wandb = self.state.wandb_logger
        if wandb is not None:
            row = dict(job.scalars)
            histogram = getattr(wandb, "Histogram", None)  # Bridge's W&B writer is the wandb module
            if histogram is not None:
                row.update({name: histogram(values) for name, values in self._histograms.items()})
            wandb.log(row, job.iteration)
        if wandb is not None or job.tensorboard is not None:
            self.written += 1

    def gather(self, store, iteration: int, tensorboard: Any = None,
               stop: Optional[threading.Event] = None, logged: bool = True) -> Optional[dict[str, float]]:
        """The writing rank's part of gathered iteration ``iteration`` (on its metrics thread): wait
        for every rank's figures, read them, mark the iteration done, delete its own key; the online
        calibration learns from them; a logged iteration's scalars go to ``tensorboard`` (Bridge's
        SummaryWriter, or None) and are returned (None: not logged, or ``stop`` was set while it
        waited)."""
        keys = [self._key(iteration, r) for r in range(self.world)]
        if not self._wait(store, keys, iteration, stop):
            return None
        values = store.multi_get(keys)
        store.set(self._done_key(), str(iteration))
        store.delete_key(keys[self.rank])
        # one parse of every rank's figures: half the GIL time of one parse per rank
        figures = json.loads(b"[" + b",".join(values) + b"]")
        if self.calibration is not None:
            self.calibration.observe(iteration, figures, store, int(self.state.train_state.step), self.lead)
        if not logged:
            return None
        scalars = step_scalars(figures, self._flops)
        if self.calibration is not None:
            scalars.update(model_scalars(self.calibration.schedule.model_for(iteration), figures))
        histograms = step_histograms(figures)
        if tensorboard is not None:
            for name, value in scalars.items():
                tensorboard.add_scalar(name, value, iteration)
            for name, values in histograms.items():
                tensorboard.add_histogram(name, np.asarray(values, dtype=np.float64), iteration)
        self._histograms = histograms  # for the W&B row, on the training thread
        return scalars

    def _wait(self, store, keys: list[str], iteration: int, stop: Optional[threading.Event]) -> bool:
        """Wait for ``keys`` up to the store's own timeout, in short waits so that a ``stop`` is seen
        (False); a timeout names the ranks that never came."""
        import torch.distributed as dist

        deadline = time.monotonic() + store.timeout.total_seconds()
        while True:
            try:
                store.wait(keys, datetime.timedelta(seconds=max(0.001, min(_POLL_S, deadline - time.monotonic()))))
                return True
            except dist.DistStoreError as exc:  # this short wait's timeout
                if stop is not None and stop.is_set():
                    return False
                if time.monotonic() < deadline:
                    continue
                missing = [r for r, k in enumerate(keys) if not store.check([k])]
                raise RuntimeError(f"mimo_accel metrics: ranks {missing} never reached the end of iteration "
                                   f"{iteration} (rank {self.rank} waited for their figures): {exc}") from exc


class _Job:
    """One logged iteration handed to the metrics thread (and the TensorBoard writer it writes to):
    its scalars or its error, once done."""

    def __init__(self, iteration: int, tensorboard: Any, logged: bool = True):
        self.iteration, self.tensorboard, self.logged = iteration, tensorboard, logged
        self.scalars: Optional[dict[str, float]] = None
        self.error: Optional[BaseException] = None
        self.done = threading.Event()


class _Worker:
    """The writing rank's metrics thread: runs :meth:`Metrics.gather` for each logged iteration
    handed to it, in order, over its own store connection, until :meth:`shutdown`."""

    def __init__(self, metrics: Metrics, store: Any):
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self.stop = threading.Event()  # a failed run: the gather in flight gives up
        self.thread = threading.Thread(target=self._run, args=(metrics, store), daemon=True, name="mimo-accel-metrics")
        self.thread.start()

    def submit(self, iteration: int, tensorboard: Any, logged: bool = True) -> _Job:
        job = _Job(iteration, tensorboard, logged)
        self._jobs.put(job)  # no wait: the thread takes it when it next holds the GIL
        return job

    def shutdown(self) -> None:
        self._jobs.put(None)
        self.thread.join()

    def _run(self, metrics: Metrics, store: Any) -> None:
        while (job := self._jobs.get()) is not None:
            try:
                job.scalars = metrics.gather(store, job.iteration, job.tensorboard, self.stop, job.logged)
            except BaseException as exc:  # raised on the training thread when collected
                job.error = exc
            finally:
                job.done.set()
