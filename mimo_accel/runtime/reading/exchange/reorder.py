"""The exchange (collective): reorder each global micro-batch of a module's DP group after decoding."""

from __future__ import annotations

import dataclasses

import math
import os
import struct
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np
import torch

from mimo_accel.costs import CostModel
from mimo_accel.runtime.reading.exchange.cost import DecodedModuleCosts
from mimo_accel.runtime.reading.exchange.routes import route_exchange
from mimo_accel.runtime.reading.exchange.wire import EncodedSample, decode_sample
from mimo_accel.runtime.reading.sampler import SamplesRead, TaggingCollate
from mimo_accel.runtime.context import ShardContext
from mimo_accel.runtime.reading.shard import SHARD_TAG_KEY, ReplicaShare
from mimo_accel.runtime.state import notify_with

OVERLAP_ENV = "CUDA_DEVICE_MAX_CONNECTIONS"
_MESSAGE_BYTES = 480  # error text carried by the status all-gather (utf-8, truncated)
_STATUS_HEADER = struct.Struct("<qqH")  # ok flag (1 = ok), local sample count, the error text's bytes


class ExchangeError(RuntimeError):
    """The exchange cannot proceed on this DP group; raised on every rank of it alike."""


@dataclass(frozen=True)
class ExchangeStats:
    """One micro-batch's exchange, seen from one rank.

    ``bytes_*`` / ``samples_*`` sent and received: this rank's share of the payload (the all-gathers are
    ``meta_bytes``); ``*_moved``: the whole DP group's. Spreads are max/mean per canonical group (the
    ``baseline_spread`` the contiguous split's). Wall times: ``cost_s`` pricing the local samples,
    ``plan_s`` the all-gathers and the plan (waiting for the slowest replica included), ``move_s``
    serialising, the all_to_all and deserialising, ``total_s`` all of it."""

    bytes_sent: int
    bytes_received: int
    samples_sent: int
    samples_received: int
    samples_moved: int
    bytes_moved: int
    meta_bytes: int
    predicted_spread: float
    baseline_spread: float
    cost_s: float
    plan_s: float
    move_s: float
    total_s: float
    predicted_spreads: Optional[dict] = None  # each module's, the plan's (predicted_spread: the worst)


def _new_gloo_group(parent, ranks: list[int]):
    """A gloo group over ``ranks``, created by those ranks only (collective over ``parent``).

    Encoder and language ranks build their groups independently, hence
    ``new_group(use_local_synchronization=True)``; torch names such a group by its ranks and the
    creating rank's count of registered groups, which differs between members with different
    histories, and they would wait on different store keys forever. So the members agree on the
    largest count first and pad theirs with single-rank groups (which involve no other rank)."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    # torch's registry of group names (private, declared in patching.targets.INTERNALS), where it has one
    names = getattr(getattr(c10d, "_world", None), "pg_names", None)
    if names is not None and len(ranks) > 1:
        counts: list = [None] * len(ranks)
        dist.all_gather_object(counts, len(names), group=parent)  # works on gloo and NCCL groups
        me = dist.get_rank()
        for _ in range(max(counts) - len(names)):
            dist.new_group([me], backend="gloo", use_local_synchronization=True)
    return dist.new_group(ranks, backend="gloo", use_local_synchronization=True)


class ExchangeReorder:
    """Reorder each global micro-batch of a module's DP group after decoding, with one all_to_all.

    Collective at construction where it creates a process group: every rank of ``group`` (the
    module's DP group, in DP-rank order, matching ``ctx``) constructs it, in the same order relative
    to other group creations. ``cost_fn``: ``sample -> {module: cost}``, or one number for every
    module (finite, >= 0), from the decoded sample (default :class:`DecodedModuleCosts` over
    ``cost_model``); the plan is plan-before-read's joint plan (:func:`route_exchange`).
    ``collate_fn``: collate for :meth:`collate` (None: lists). ``overlap``: exchange the next
    micro-batch on a side thread, over a group of its own; ``comm_group``: a ready gloo group over the
    same ranks instead. ``notify``: ``say_once(key, message)``. ``check``: a
    :class:`~mimo_accel.runtime.reading.plan_check.FirstPlanCheck` (None: unchecked)."""

    def __init__(self, group, ctx: ShardContext, cost_fn: Optional[Callable[[Any], float]] = None,
                 collate_fn: Optional[Callable] = None, *, cost_model: Optional[CostModel] = None,
                 overlap: bool = False, comm_group=None, notify: Optional[Callable[[str, str], object]] = None,
                 check=None):
        import torch.distributed as dist

        if overlap and os.environ.get(OVERLAP_ENV, "").strip() == "1":  # refused before anything collective
            raise ExchangeError(
                f"mimo_accel exchange: overlap=True is refused while {OVERLAP_ENV}=1. Upstream reproduced "
                "a deadlock when samples are exchanged on a side thread while training kernels and "
                f"collectives are serialised on one hardware queue. Use overlap=False, or unset "
                f"{OVERLAP_ENV} (or set it > 1) if your setup allows.")
        self.ctx = ctx
        self.overlap = bool(overlap)
        self.dps = dict(ctx.dp_sizes or {ctx.module: ctx.dp_size})
        self.modules = tuple(self.dps)
        self.cost_fn = cost_fn if cost_fn is not None else DecodedModuleCosts(self.modules, cost_model)
        self.check = check
        self.micro_batches = 0  # micro-batches reordered so far (the check's ordinal)
        self.collate_fn = collate_fn
        self.notify = notify_with(None) if notify is None else notify
        self._tagging = TaggingCollate(collate_fn, ctx) if collate_fn is not None else None
        self.ranks = list(dist.get_process_group_ranks(group))
        if len(self.ranks) != ctx.dp_size or dist.get_rank(group) != ctx.dp_rank:
            raise ExchangeError(
                f"mimo_accel exchange: the process group has {len(self.ranks)} ranks and this rank is "
                f"{dist.get_rank(group)} in it, but the ShardContext says {ctx.module} replica "
                f"{ctx.dp_rank}/{ctx.dp_size}; pass the module's DP group")
        if comm_group is not None:
            if list(dist.get_process_group_ranks(comm_group)) != self.ranks:
                raise ExchangeError("mimo_accel exchange: comm_group must hold the DP group's ranks in "
                                    "the same order")
            self.comm_group = comm_group
        elif overlap or dist.get_backend(group) != "gloo":
            self.comm_group = _new_gloo_group(group, self.ranks)
        else:
            self.comm_group = group
        if dist.get_rank(self.comm_group) != ctx.dp_rank:
            raise ExchangeError("mimo_accel exchange: the exchange group orders ranks differently from "
                                "the DP group; pass comm_group in DP-rank order")
        self._buffers: dict[str, np.ndarray] = {}

    def _buffer(self, name: str, size: int) -> np.ndarray:
        """A reused uint8 buffer of at least ``size`` bytes (spares page faults on every step)."""
        buf = self._buffers.get(name)
        if buf is None or buf.size < size:
            buf = np.empty(max(size, int(size * 1.25)), dtype=np.uint8)
            self._buffers[name] = buf
        return buf[:size]

    # -- steps ---------------------------------------------------------------------------------

    def _local_costs(self, samples: Sequence[Any]):
        """[samples, modules] costs of the local samples, and the samples encoded for the wire."""
        costs = np.empty((len(samples), len(self.modules)), dtype=np.float64)
        encoded = []
        for i, sample in enumerate(samples):
            try:
                value = self.cost_fn(sample)
                if not isinstance(value, dict):
                    value = dict.fromkeys(self.modules, value)
                missing = [m for m in self.modules if m not in value]
                row = [float(value[m]) for m in self.modules if m in value]
            except Exception as exc:
                raise ExchangeError(f"cost_fn raised {type(exc).__name__} on local sample {i}: {exc}") from exc
            if missing:
                raise ExchangeError(f"cost_fn gave no cost for modules {missing} on local sample {i} (the layout's "
                                    f"modules: {list(self.modules)})")
            bad = [c for c in row if not math.isfinite(c) or c < 0]
            if bad:
                raise ExchangeError(f"cost_fn returned {bad[0]} for local sample {i}; costs must be finite "
                                    "and >= 0 (fix the cost function or the sample)")
            costs[i] = row
            encoded.append(EncodedSample(sample))
        return costs, encoded

    def _all_gather(self, payload: np.ndarray) -> list[np.ndarray]:
        import torch.distributed as dist

        t = torch.from_numpy(payload)
        out = [torch.empty_like(t) for _ in self.ranks]
        dist.all_gather(out, t, group=self.comm_group)
        return [o.numpy() for o in out]

    def _status(self, n_local: int, error: Optional[BaseException]) -> int:
        msg = b"" if error is None else (
            f"{self.ctx.module} replica {self.ctx.dp_rank}: {error}".encode("utf-8", "replace")[:_MESSAGE_BYTES])
        head = _STATUS_HEADER.pack(1 if error is None else 0, n_local, len(msg))
        payload = np.frombuffer(head + msg.ljust(_MESSAGE_BYTES, b"\0"), dtype=np.uint8).copy()
        failures, counts = [], []
        for rank, row in enumerate(self._all_gather(payload)):
            ok, n, length = _STATUS_HEADER.unpack_from(row)
            counts.append(n)
            if not ok:
                text = row[_STATUS_HEADER.size:_STATUS_HEADER.size + length].tobytes()
                failures.append((rank, text.decode("utf-8", "replace")))
        if failures:
            first = failures[0][1]
            raise ExchangeError(
                f"mimo_accel exchange: computing sample costs failed on {self.ctx.module} replica(s) "
                f"{[r for r, _ in failures]} of {len(self.ranks)} (first: {first}). Every replica of "
                "the DP group stops before any sample moves; fix the cost function or the data.") from error
        if len(set(counts)) > 1:
            raise ExchangeError(
                f"mimo_accel exchange: the {self.ctx.module} replicas hold different numbers of samples "
                f"{counts}; each must hold its equal canonical share of the global micro-batch (build "
                "the loader with sharded reads on the same global sampler)")
        return payload.size

    def reorder(self, local_samples: Sequence[Any]) -> tuple[list, ExchangeStats]:
        """This rank's samples after balancing the global micro-batch, and the exchange's stats.

        Collective over the DP group: every replica calls it with its canonical shard of the same
        global micro-batch (equal lengths).
        """
        import torch.distributed as dist

        t0 = time.perf_counter()
        samples = list(local_samples)
        error: Optional[BaseException] = None
        try:
            costs, encoded = self._local_costs(samples)
        except ExchangeError as exc:
            error, costs, encoded = exc, None, None
        except Exception as exc:  # serialisation of an odd sample, ...
            error, costs, encoded = ExchangeError(f"{type(exc).__name__}: {exc}"), None, None
            error.__cause__ = exc
        t1 = time.perf_counter()
        meta = self._status(len(samples), error)  # raises on every rank if any failed

        n_local, n_ranks, me = len(samples), len(self.ranks), self.ctx.dp_rank
        n_costs = 8 * n_local * len(self.modules)
        local = np.concatenate([costs.reshape(-1).view(np.uint8),
                                np.fromiter((e.nbytes for e in encoded), dtype=np.int64, count=n_local).view(np.uint8)])
        rows = self._all_gather(local)
        meta += local.size
        all_costs = np.concatenate([r[:n_costs].view(np.float64).reshape(n_local, -1) for r in rows])
        all_sizes = np.concatenate([r[n_costs:].view(np.int64) for r in rows])
        plan = route_exchange({m: all_costs[:, j] for j, m in enumerate(self.modules)}, all_sizes, n_ranks,
                             self.ctx.grid, self.dps, self.notify)
        t2 = time.perf_counter()

        send_splits = plan.send_bytes(me)
        recv_splits = plan.recv_bytes(me)
        send = self._buffer("send", sum(send_splits))
        offset = 0
        for d in range(n_ranks):
            if d != me:
                for p in plan.incoming(d, me):
                    offset = encoded[p - me * n_local].write(send, offset)
        recv = self._buffer("recv", sum(recv_splits))
        moved = plan.moved()
        if moved:  # the same answer on every rank: all call the collective, or none
            dist.all_to_all_single(torch.from_numpy(recv), torch.from_numpy(send), recv_splits, send_splits,
                                   group=self.comm_group)
        received: dict[int, Any] = {}
        offset = 0
        for s in range(n_ranks):
            if s != me:
                for p in plan.incoming(me, s):
                    received[p], offset = decode_sample(recv, offset)
        out = [samples[p - me * n_local] if p // n_local == me else received[p] for p in plan.local_after(me)]
        if self.check is not None:  # after the collective (no replica is left inside it), before training
            from mimo_accel.runtime.reading.plan_check import plan_digest

            self.check(self.micro_batches, plan_digest(range(len(plan.order)), plan.order))
        self.micro_batches += 1
        t3 = time.perf_counter()

        stats = ExchangeStats(
            bytes_sent=int(send.size), bytes_received=int(recv.size),
            samples_sent=sum(len(plan.incoming(d, me)) for d in range(n_ranks) if d != me),
            samples_received=len(received), samples_moved=len(moved),
            bytes_moved=int(sum(plan.sizes[p] for p in moved)), meta_bytes=int(meta),
            predicted_spread=plan.predicted_spread, baseline_spread=plan.baseline_spread,
            cost_s=t1 - t0, plan_s=t2 - t1, move_s=t3 - t2, total_s=t3 - t0,
            predicted_spreads=dict(plan.predicted_spreads))
        return out, stats

    def collate(self, samples: list, stats: Optional[ExchangeStats] = None) -> Any:
        """Collate and tag (as already local for this replica, with what the exchange predicted and
        moved), or the list without a collate_fn."""
        if self._tagging is None:
            return samples
        if stats is None:
            return self._tagging(SamplesRead(samples))
        # the samples came by the exchange, not by index: the share holds what its plan predicted
        share = ReplicaShare(spread=float(stats.predicted_spread), spreads=dict(stats.predicted_spreads or {}),
                             moved=int(stats.samples_moved))
        batch = self._tagging(SamplesRead(samples, share))
        batch[SHARD_TAG_KEY] = dataclasses.replace(batch[SHARD_TAG_KEY], bytes_exchanged=stats.bytes_sent)
        return batch

    def reorder_and_collate(self, local_samples: Sequence[Any]) -> tuple[Any, ExchangeStats]:
        samples, stats = self.reorder(local_samples)
        return self.collate(samples, stats), stats
