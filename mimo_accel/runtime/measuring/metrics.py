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
* ``reads/samples``, ``reads/bytes``, ``reads/bytes_exchanged``: summed over every rank;
* ``plan_wait_s`` (with ``reorder``): the longest any rank's training thread waited this step for a
  plan made ahead (0 while planning keeps up).

These are the report's definitions (:mod:`mimo_accel.tools.report`), for one step.

How the figures reach the logging rank: every rank reaches the optimizer-step hook once per
iteration (:func:`mimo_accel.runtime.patches.profiler.wrap_optimizer_step`). On a logged iteration each
rank puts its step figures (a few numbers, JSON) under its own key in the job's rendezvous store —
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
from collections import defaultdict
from typing import Any, Iterable, Optional

import numpy as np

from mimo_accel.costs.flops import FlopsShape, peak_tflops_of, throughput
from mimo_accel.modules import LANGUAGE
from mimo_accel.profiler.recorder import FORMAT_V1_ENCODER, module_regions
from mimo_accel.profiler.run import module_seconds, record_number
from mimo_accel.runtime.store import next_round, store_key

logger = logging.getLogger("mimo_accel")

PREFIX = "mimo_accel"
# The metrics thread waits in the store this long at a time, so a failed run's stop is seen that
# soon (a thread still in a store call when the interpreter exits can abort the process); each
# wait that times out (a rank over a second late) logs a c10d socket warning.
_POLL_S = 1.0

# ------------------------------------------------------------------------------ pure figures


def rank_figures(header: dict, record: dict) -> dict:
    """What one rank contributes to a logged step: its module and replica (from its profile
    header), its module's forward + backward seconds, what it read, what it computed (samples; the
    language model's real tokens Σ L, Σ L², an encoder's rows Σ rows, Σ rows²), its step's wall
    time, and the plan's prediction."""
    module = str(header.get("module", "unknown"))
    rows, sq_rows = ("tokens", "sq_tokens") if module == LANGUAGE else (f"{module}_rows", f"{module}_sq_rows")
    spreads: dict = {}
    table = record.get("predicted_spreads")
    if isinstance(table, dict):
        spreads = {str(m): v for m in table if (v := record_number(table, m)) is not None}
    elif (single := record_number(record, "predicted_spread")) is not None:
        spreads = {"": single}  # one figure for the worst module (a plan that priced one encoder)
    return {
        "rank": int(header.get("rank", 0)),
        "module": module,
        "dp_rank": int(header.get("dp_rank", 0)),
        # the module's PP stages: the online calibration sums a replica's stages
        "stages": int(((header.get("layout") or {}).get("pp") or {}).get(module) or 1),
        "time_s": module_seconds(record, module_regions(module)),
        "samples_read": record_number(record, "samples_read") or 0,
        "bytes_read": record_number(record, "bytes_read") or 0,
        "bytes_exchanged": record_number(record, "bytes_exchanged") or 0,
        "tokens": record_number(record, "tokens") if module == LANGUAGE else None,
        "samples": record_number(record, "samples"),
        "rows": record_number(record, rows),
        "sq_rows": record_number(record, sq_rows),
        "step_time_s": record_number(record, "step_time_s"),
        "spreads": spreads,
        "plan_wait_s": record_number(record, "plan_wait_s"),
        "features": _features(module, record),
        "micro": _micro_figures(module, record),
    }


def _micro_figures(module: str, record: dict) -> Optional[dict]:
    """An encoder's micro-batches this step, where the line has one time and one count per
    forward in call order: ``{"features": [[rows, Σ rows², items], ...], "seconds": [fwd + bwd,
    ...]}`` (a frozen encoder's seconds are its forwards); None otherwise (the language model, a
    line without them, or lists that do not pair one to one)."""
    from mimo_accel.costs.online import features_of

    micro = record.get("micro")
    if module == LANGUAGE or not isinstance(micro, dict):
        return None
    forward, backward = micro.get(f"{module}_fwd"), micro.get(f"{module}_bwd")
    counts = [micro.get(f"{module}_{name}") for name in features_of(module)]
    lists = [forward, *counts] + ([backward] if backward is not None else [])
    if not all(isinstance(v, list) and v for v in lists) or len({len(v) for v in lists}) != 1:
        return None
    seconds = [float(f) + float(b) for f, b in zip(forward, backward or [0.0] * len(forward))]
    return {"features": [list(map(float, row)) for row in zip(*counts)], "seconds": seconds}


def _features(module: str, record: dict) -> Optional[list]:
    """What the module computed this step, as the online calibration learns from it (an encoder's
    rows, Σ rows², items; the language model's tokens, Σ tokens²); None where the line lacks them."""
    from mimo_accel.costs.online import features_of

    keys = [name if module == LANGUAGE else f"{module}_{name}" for name in features_of(module)]
    values = [record_number(record, k) for k in keys]
    return None if any(v is None for v in values) else values


def _ratio(values: list) -> Optional[float]:
    mean = sum(values) / len(values) if values else 0.0
    return max(values) / mean if mean > 0 else None


def step_scalars(figures: Iterable[dict], flops: Optional[dict] = None) -> dict[str, float]:
    """The scalars of one step from every rank's :func:`rank_figures` (see the module docstring);
    ``flops``: the profile header's ``layout["flops"]`` (:mod:`mimo_accel.runtime.measuring.model_flops`)."""
    figures = sorted(figures, key=lambda f: f["rank"])
    by_module: dict[str, list[dict]] = defaultdict(list)
    for f in figures:
        by_module[f["module"]].append(f)
    out: dict[str, float] = {}
    for module, ranks in by_module.items():
        if module == "unknown":  # a rank whose place in the layout the profiler never learnt: reads only
            continue
        p = f"{PREFIX}/{module}"
        replicas: dict[int, float] = {}
        for f in ranks:
            if f["time_s"] is not None:
                replicas[f["dp_rank"]] = max(replicas.get(f["dp_rank"], 0.0), f["time_s"])
        if replicas:
            order = sorted(replicas)
            times = [replicas[d] for d in order]
            out[f"{p}/slowest_replica_s"] = max(times)
            out[f"{p}/slowest_replica"] = order[times.index(max(times))]
            if (ratio := _ratio(times)) is not None:
                out[f"{p}/straggler"] = ratio
        out[f"{p}/samples_read_per_rank"] = sum(f["samples_read"] for f in ranks) / len(ranks)
        out[f"{p}/bytes_read_per_rank"] = sum(f["bytes_read"] for f in ranks) / len(ranks)
    # the plan's predictions: the same on every rank that got a planned batch
    planned: dict[str, float] = {}
    for f in figures:
        for m, v in f["spreads"].items():
            planned[m] = max(planned.get(m, v), v)
    single = planned.pop("", None)
    if single is not None and not planned:  # the plan priced one encoder: the layout's first (in rank order)
        encoders = [m for m in by_module if m not in (LANGUAGE, "unknown")]
        planned = {encoders[0] if encoders else FORMAT_V1_ENCODER: single}
    for m, v in planned.items():
        out[f"{PREFIX}/{m}/straggler_planned"] = v
        if (measured := out.get(f"{PREFIX}/{m}/straggler")) is not None:
            out[f"{PREFIX}/{m}/predicted_error"] = abs(v - measured)
    tokens = _language_tokens(figures)
    if tokens:
        out[f"{PREFIX}/{LANGUAGE}/tokens_max"] = max(tokens.values())
        out[f"{PREFIX}/{LANGUAGE}/tokens_mean"] = sum(tokens.values()) / len(tokens)
    if len(tokens) > 1 and (ratio := _ratio(list(tokens.values()))) is not None:
        out[f"{PREFIX}/{LANGUAGE}/tokens_straggler"] = ratio
    for key in ("samples", "bytes", "bytes_exchanged"):
        name = "samples_read" if key == "samples" else "bytes_read" if key == "bytes" else key
        out[f"{PREFIX}/reads/{key}"] = sum(f[name] for f in figures)
    waits = [w for f in figures if (w := f.get("plan_wait_s")) is not None]
    if waits:  # the training thread's wait for the plans it was to train, the slowest rank's
        out[f"{PREFIX}/plan_wait_s"] = max(waits)
    out.update(_throughput_scalars(by_module, figures, flops or {}))
    return out


def _throughput_scalars(by_module: dict[str, list[dict]], figures: list[dict], flops: dict) -> dict[str, float]:
    """Each module's samples/s, tokens/s per GPU, TFLOP/s per GPU and MFU this step (the figures
    that can be computed: see :func:`mimo_accel.costs.flops.throughput`)."""
    times = [t for f in figures if (t := f.get("step_time_s")) is not None]
    if not times:
        return {}
    table = flops.get("modules") or {}
    peak = peak_tflops_of(flops.get("device_name"))
    out: dict[str, float] = {}
    for module, ranks in by_module.items():
        if module == "unknown":
            continue
        own = table.get(module) or {}
        work = {k: sum(v.values()) if (v := _per_replica(ranks, k)) else None for k in ("samples", "rows", "sq_rows")}
        figures_of = throughput(samples=work["samples"], tokens=work["rows"], sq_tokens=work["sq_rows"],
                                step_time_s=max(times), ranks=own.get("ranks") or len(ranks),
                                shape=FlopsShape.from_dict(own["shape"]) if own.get("shape") else None,
                                trained=own.get("trained", True), peak_tflops=peak[1] if peak else None)
        out.update({f"{PREFIX}/{module}/{k}": v for k, v in figures_of.items() if v is not None})
    return out


def _per_replica(figures: Iterable[dict], key: str) -> dict[int, float]:
    """``key`` of each DP replica of ``figures`` this step (the most any of its ranks counted)."""
    values: dict[int, float] = {}
    for f in figures:
        if (v := f.get(key)) is not None:
            values[f["dp_rank"]] = max(values.get(f["dp_rank"], 0.0), v)
    return values


def _language_tokens(figures: Iterable[dict]) -> dict[int, float]:
    """The real tokens of each language replica this step (the most any of its ranks counted)."""
    return _per_replica([f for f in figures if f["module"] == LANGUAGE], "tokens")


def step_histograms(figures: Iterable[dict]) -> dict[str, list[float]]:
    """The distributions of one step, one value per replica: ``language/tokens``."""
    tokens = _language_tokens(figures)
    return {f"{PREFIX}/{LANGUAGE}/tokens": [tokens[d] for d in sorted(tokens)]} if tokens else {}


def model_scalars(model, figures: Iterable[dict]) -> dict[str, float]:
    """The cost model in use for each module of the step (online calibration): its coefficients
    ``cost_model/a``, ``/b`` and an encoder's ``/k``."""
    out: dict[str, float] = {}
    for module in sorted({f["module"] for f in figures if f.get("module") not in (None, "unknown")}):
        cost = model.of(module)
        for name in ("a", "b") if module == LANGUAGE else ("a", "b", "k"):
            out[f"{PREFIX}/{module}/cost_model/{name}"] = getattr(cost, name)
    return out


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
        store.set(self._key(iteration, self.rank), json.dumps(rank_figures(header, record)))
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
