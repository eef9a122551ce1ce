"""The line rank 0 logs at a run's first training step and at every log interval (Bridge's
``logger.log_interval``): the features on, the samples each module's ranks read (and what
upstream's loader reads), the samples the plan gave another replica, and the padding tokens
packing removed, that step, over the whole job. With or without the profiler::

    mimo_accel: step 1: on: sharded_reads, reorder, packing; read per rank: vision 4, language 8 of 8
    samples (upstream: all 8); the plan gave another replica 3 of 8 vision, 0 of 8 language samples;
    packing removed 1960 of 4096 language tokens (48%), all padding

Each rank counts what its step already holds, on the host (the batch's tag, tensor shapes; no device
read, no collective). At a logged step every rank puts its counts under its own key in the job's
rendezvous store (a ``set`` that waits for no one); rank 0 hands the gather to a thread of its own,
which waits for every rank's key, reads and deletes them, and logs the line. Evaluation passes
count for nothing.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
from dataclasses import dataclass
from typing import Any, Optional

from mimo_accel.modules import LANGUAGE
from mimo_accel.runtime.state import Runtime
from mimo_accel.runtime.store import Worker, default_store, next_round, store_key, wait_for

logger = logging.getLogger("mimo_accel")


@dataclass
class StepCounts:
    """What one rank did in one training step."""

    read: int = 0  # samples this rank's loader read
    whole: int = 0  # samples upstream's loader reads on this rank: every global micro-batch whole
    moved: int = 0  # samples the plan gave another replica of this rank's module
    planned: int = 0  # micro-batches a plan (or the exchange) ordered
    padded: int = 0  # language tokens of the shards this rank packed, as [batch, seq]
    packed: int = 0  # the same shards' tokens packed (THD)


def _tokens(batch: dict, flat: bool) -> Optional[int]:
    """The tokens of a language batch by its tensors' shapes: ``[b, S]`` (b·S) or packed ``[1, T]`` (T)."""
    for key in ("labels", "loss_mask", "input_ids", "position_ids"):
        shape = getattr(batch.get(key), "shape", None)
        if shape is not None and len(shape) == 2 and (not flat or shape[0] == 1):
            return int(shape[0]) * int(shape[1])
    return None


class Activity:
    """One process's counts and, on rank 0, the line (see the module docstring)."""

    def __init__(self, runtime: Runtime):
        self.runtime = runtime
        self.counts = StepCounts()
        self.state: Any = None  # Bridge's GlobalState of the run under way (the train entry's)
        self.interval = 1
        self.rank, self.world = 0, 1
        self.run = 0
        self._gatherer: Optional[Worker] = None  # rank 0's thread: one gather per logged step, in order
        self._first = True

    # -- counting, on the training thread ------------------------------------------------------

    def saw_batch(self, read: int, whole: int, share=None) -> None:
        """A training micro-batch reached the step: ``read`` samples of a global micro-batch of
        ``whole``, ``share`` what the plan said of it (a ReplicaShare, or None)."""
        from mimo_accel.runtime.measuring.profiling import evaluating

        if self.state is None or evaluating():
            return
        c = self.counts
        c.read += int(read)
        c.whole += int(whole)
        if share is not None and share.moved is not None:
            c.moved += int(share.moved)
            c.planned += 1

    def saw_pack(self, before: dict, after: dict) -> None:
        """A language shard was packed: ``before`` its ``[b, S]`` batch, ``after`` the packed one."""
        from mimo_accel.runtime.measuring.profiling import evaluating

        if self.state is None or evaluating():
            return
        padded, packed = _tokens(before, flat=False), _tokens(after, flat=True)
        if padded is not None and packed is not None:
            self.counts.padded += padded
            self.counts.packed += packed

    # -- the run -------------------------------------------------------------------------------

    def start_run(self, global_state: Any) -> None:
        """Bridge's training loop starts with ``global_state`` (its logger config, its step count)."""
        import torch.distributed as dist

        if not dist.is_initialized():
            return
        logger_cfg = getattr(getattr(global_state, "cfg", None), "logger", None)
        self.interval = max(1, int(getattr(logger_cfg, "log_interval", 1) or 1))
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.run = next_round("activity")  # a train entry: two runs' keys in one job never meet
        self.state = global_state
        self.counts = StepCounts()
        self._first = True  # the run's first step is logged (a resumed run's too)

    def end_step(self) -> None:
        """An optimizer step ended on this rank: at a logged step, its counts go to rank 0."""
        if self.state is None:
            return
        counts, self.counts = self.counts, StepCounts()
        iteration = int(self.state.train_state.step) + 1  # Bridge counts the step after it
        first, self._first = self._first, False
        if not first and iteration % self.interval:
            return
        ctx = self.runtime.shard_context()
        mine = {"rank": self.rank, "module": ctx.module if ctx else None, "dp_rank": ctx.dp_rank if ctx else 0,
                **dataclasses.asdict(counts)}
        default_store().set(self._key(iteration, self.rank), json.dumps(mine))
        if self.rank == 0:
            if self._gatherer is None:
                self._gatherer = Worker(self._gather_or_say, "mimo-accel-activity")
            self._gatherer.submit(iteration)

    def finish(self, failed: bool = False) -> None:
        """Training ended: rank 0 logs what is still to come (or, after a failure, gives up waiting)."""
        gatherer, self._gatherer = self._gatherer, None
        if gatherer is not None:
            gatherer.shutdown(stop=failed)
        self.state = None

    def close(self) -> None:
        self.finish(failed=True)

    def _key(self, iteration: int, rank: int) -> str:
        return store_key("activity", self.run, iteration, rank)

    # -- rank 0's thread -----------------------------------------------------------------------

    def _gather_or_say(self, store, iteration: int, stop: threading.Event) -> None:
        try:
            self.gather(store, iteration, stop)
        except Exception as exc:  # noqa: BLE001 - a line the job can go without: said, not raised
            self.runtime.say_once("activity:gather", f"mimo_accel: no step line: {exc}")

    def gather(self, store, iteration: int, stop: threading.Event) -> Optional[str]:
        """Wait for every rank's counts of ``iteration``, read and delete them, log the line."""
        keys = [self._key(iteration, r) for r in range(self.world)]
        if not wait_for(store, keys, range(self.world), f"mimo_accel: ranks {{missing}} never reported step "
                        f"{iteration}'s reads, moves and packing (rank 0 waited for them)", stop):
            return None
        figures = [json.loads(v) for v in store.multi_get(keys)]
        for key in keys:
            store.delete_key(key)
        line = step_line(iteration, self.runtime.features(), figures)
        logger.info(line)
        return line


def step_line(iteration: int, features: list, figures: list) -> str:
    """The line of one logged step from every rank's counts (:class:`StepCounts` and its place)."""
    parts = [f"step {iteration}: on: {', '.join(features) or 'nothing'}"]
    modules = sorted({f["module"] for f in figures if f["module"] and f["whole"]}, key=lambda m: (m == LANGUAGE, m))
    data = {m: [f for f in figures if f["module"] == m and f["whole"]] for m in modules}
    if modules:
        reads = ", ".join(f"{m} {_mean(f['read'] for f in data[m])}" for m in modules)
        wholes = sorted({f["whole"] for m in modules for f in data[m]})
        whole = "/".join(map(str, wholes))
        parts.append(f"read per rank: {reads} of {whole} samples (upstream: all {whole})")
    planned = [m for m in modules if any(f["planned"] for f in data[m])]
    if planned:  # every rank of a module holds the same plan: its figure is any rank's
        moved = ", ".join(f"{max(f['moved'] for f in data[m])} of {max(f['whole'] for f in data[m])} {m}"
                          for m in planned)
        parts.append(f"the plan gave another replica {moved} samples")
    if "packing" in features:
        # a replica's TP ranks and PP stages pack the same shard: each replica once
        replicas: dict = {}
        for f in figures:
            if f["module"] == LANGUAGE and f["padded"]:
                replicas[f["dp_rank"]] = max(replicas.get(f["dp_rank"], (0, 0)), (f["padded"], f["packed"]))
        padded = sum(p for p, _ in replicas.values())
        packed = sum(t for _, t in replicas.values())
        if padded:
            parts.append(f"packing removed {padded - packed} of {padded} language tokens "
                         f"({100 * (padded - packed) / padded:.0f}%), all padding")
        else:
            parts.append("packing packed no language shard this step")
    return "; ".join(parts)


def _mean(values) -> str:
    values = list(values)
    mean = sum(values) / len(values)
    return str(int(mean)) if mean == int(mean) else f"{mean:.1f}"
