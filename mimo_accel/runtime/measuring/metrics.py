"""mimo_accel's per-step figures in Megatron Bridge's own TensorBoard and W&B writers.

Bridge's writers exist on the job's last rank only. On every logged iteration (``iteration %
cfg.logger.log_interval == 0``; every iteration while the cost model is learnt online) each rank
puts its step figures (:func:`~mimo_accel.runtime.measuring.step_figures.rank_figures`) under its
own key in the job's rendezvous store, a ``set`` that waits for no one. The last rank hands the
rest to a thread of its own over its own store client: it waits for every rank's key, reads them
with one ``multi_get``, marks the iteration read, lets the online calibration learn and writes the
scalars to TensorBoard. The next optimizer-step hook collects it on the training thread (logs its
W&B row, raises its error, e.g. the ranks that never came); each other rank deletes its keys once
they are read. No process group, no collective. The scalars are listed in docs/usage.md, the way
they travel in docs/design.md; without the profiler none of them exist.
"""

from __future__ import annotations

import json
import logging
import threading
from typing import Any, Optional

import numpy as np

from mimo_accel.runtime.measuring.step_figures import model_scalars, rank_figures, step_histograms, step_scalars
from mimo_accel.runtime.store import Worker, default_store, next_round, store_key, wait_for

logger = logging.getLogger("mimo_accel")


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
        self._worker: Optional[Worker] = None  # the writing rank's metrics thread
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

    def iteration_gathered(self) -> tuple[Optional[int], bool]:
        """The iteration the optimizer step now ending belongs to (Bridge counts it after the step)
        when its figures are gathered (every one while calibrating, else the ones Bridge logs), and
        whether Bridge logs it."""
        iteration = int(self.state.train_state.step) + 1
        logged = self.writes and iteration % self.interval == 0
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
                self._worker = Worker(_gather_job(self), "mimo-accel-metrics", store.clone())
            # Bridge makes its writer on first use: here, on the training thread, never on two at once
            self._job = _Job(iteration, self.state.tensorboard_logger if logged else None, logged)
            self._worker.submit(self._job)
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
        return self._store if self._store is not None else default_store()

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
        if not wait_for(store, keys, range(self.world), f"mimo_accel metrics: ranks {{missing}} never reached the end of "
                        f"iteration {iteration} (rank {self.rank} waited for their figures)", stop):
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

class _Job:
    """One logged iteration handed to the metrics thread (and the TensorBoard writer it writes to):
    its scalars or its error, once done."""

    def __init__(self, iteration: int, tensorboard: Any, logged: bool = True):
        self.iteration, self.tensorboard, self.logged = iteration, tensorboard, logged
        self.scalars: Optional[dict[str, float]] = None
        self.error: Optional[BaseException] = None
        self.done = threading.Event()


def _gather_job(metrics: Metrics):
    """The metrics thread's work: :meth:`Metrics.gather` for a logged iteration (its :class:`_Job`),
    its scalars or its error kept for the training thread."""

    def work(store, job: _Job, stop: threading.Event) -> None:
        try:
            job.scalars = metrics.gather(store, job.iteration, job.tensorboard, stop, job.logged)
        except BaseException as exc:  # raised on the training thread when collected
            job.error = exc
        finally:
            job.done.set()

    return work
