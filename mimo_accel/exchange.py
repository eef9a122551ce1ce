"""Exchange mode: balance vision load when sample costs are only known after decoding.

The fallback to plan-before-read (:mod:`mimo_accel.planner`), and upstream's approach. Each rank
reads and decodes its canonical shard (sharded reads: contiguous groups of the global
micro-batch), costs its samples from what it decoded, and then, per global micro-batch:

1. **status** — one all-gather of a fixed-size header (ok flag, sample count, error text) over the
   module DP group. A ``cost_fn`` that raises or returns NaN/inf/negative fails *every* rank with
   the failing rank's message, before any sample byte moves: no rank is left waiting in a
   collective the others skipped.
2. **costs and sizes** — one all-gather of each rank's per-sample costs (float64) and serialised
   sizes (int64). The global costs, concatenated in DP-rank order, are the global micro-batch in
   canonical order; every rank computes the same :func:`~mimo_accel.balance.balanced_order` with
   ``n_groups = G`` (no plan broadcast) and, from the sizes, every send and receive split.
3. **samples** — ONE ragged ``all_to_all_single`` of uint8 bytes. Only samples whose owner changes
   are serialised; a sample that stays is handed on as the same object.

Why ``all_to_all_single``: gloo's list form ``dist.all_to_all`` only accepts equal-size tensors
(``ProcessGroupGloo::alltoall: invalid tensor size``), so it cannot carry ragged samples; gloo's
``all_to_all_single`` takes per-peer split sizes (alltoallv, zero-size splits included), which is
exactly a ragged exchange in one collective, and NCCL has it too. ``batch_isend_irecv`` would need
one message per peer pair and its own completion handling for the same result.

Every module must end up with the same samples in the same order per canonical group, so the
cost must be computed from what every module decodes: the default :class:`DecodedSampleCost`
uses the images' ``grid_thw`` and the real-token count, which vision and language ranks both see.

Layering: the planning (:func:`plan_exchange`, :class:`ExchangePlan`) and the sample codec
(:func:`encode_sample`, :func:`decode_sample`) are pure and testable without processes; only
:class:`ExchangeReorder` talks to ``torch.distributed``. Sample bytes are host memory and travel
over a gloo group (the module's DP group when it is gloo, else a dedicated gloo group over the
same ranks); the codec uses pickle for the non-tensor skeleton of a sample, as torch.distributed's
object collectives do — peers are ranks of the same job.

Overlap (``overlap=True``): a side thread reads, exchanges and collates the next micro-batch while
the current one trains. Its collectives use a dedicated process group made at construction, so
they never interleave with the training's own collectives on the DP group. Refused when
``CUDA_DEVICE_MAX_CONNECTIONS=1`` (upstream reproduced a deadlock with a side-thread exchange
there).
"""

from __future__ import annotations

import math
import os
import pickle
import queue
import struct
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Optional

import numpy as np
import torch

from mimo_accel.balance import balanced_order, contiguous_order, spread
from mimo_accel.costs import CostModel
from mimo_accel.grid import check_micro_batch
from mimo_accel.sampler import ShardContext, TaggingCollate

__all__ = [
    "DecodedSampleCost",
    "ExchangeError",
    "ExchangeLoader",
    "ExchangePlan",
    "ExchangeReorder",
    "ExchangeStats",
    "decode_sample",
    "encode_sample",
    "exchange_loader",
    "exchange_shard_loader",
    "plan_exchange",
    "serialized_size",
]

OVERLAP_ENV = "CUDA_DEVICE_MAX_CONNECTIONS"
_MESSAGE_BYTES = 480  # error text carried by the status all-gather (utf-8, truncated)
_STATUS_HEADER = struct.Struct("<qq")  # ok flag (1 = ok), local sample count
_SAMPLE_HEADER = struct.Struct("<Q")  # length of the pickled skeleton


class ExchangeError(RuntimeError):
    """The exchange cannot proceed on this DP group; raised on every rank of it alike."""


# ----------------------------------------------------------------------------------------------
# Cost of a decoded sample
# ----------------------------------------------------------------------------------------------

_GRID_KEYS = ("grid_thw", "image_grid_thw")


def _find_key(obj: Any, keys: Sequence[str], depth: int = 0) -> Any:
    if not isinstance(obj, Mapping) or depth > 4:
        return None
    for k in keys:
        if k in obj:
            return obj[k]
    for v in obj.values():
        found = _find_key(v, keys, depth + 1)
        if found is not None:
            return found
    return None


class DecodedSampleCost:
    """Vision cost of one decoded sample under a :class:`~mimo_accel.costs.CostModel`.

    Image patch counts are the rows' ``t·h·w`` of the sample's ``grid_thw`` (looked up as
    ``grid_thw`` or ``image_grid_thw``, at the top level or inside nested dicts such as
    ``modality_inputs``; a sample without one has no images). Real tokens are the sum of
    ``attention_mask`` when present, else the number of ``input_ids``. Both are what every module
    decodes, so vision and language ranks compute the same cost.
    """

    def __init__(self, model: Optional[CostModel] = None):
        self.model = CostModel() if model is None else model

    def __call__(self, sample: Any) -> float:
        grid = _find_key(sample, _GRID_KEYS)
        p_sum = p_sq = 0
        if grid is not None:
            g = torch.as_tensor(grid)
            if g.numel():
                if g.dim() != 2 or g.size(-1) != 3 or g.is_floating_point() or bool((g < 0).any()):
                    raise ValueError(f"malformed grid_thw {tuple(g.shape)} (want [images, 3] non-negative "
                                     "integers t, h, w per image)")
                for t, h, w in g.tolist():
                    p = t * h * w
                    p_sum += p
                    p_sq += p * p
        mask = sample.get("attention_mask") if isinstance(sample, Mapping) else None
        if isinstance(mask, torch.Tensor):
            tokens = int(mask.sum())
        else:
            ids = sample.get("input_ids") if isinstance(sample, Mapping) else None
            tokens = int(ids.numel()) if isinstance(ids, torch.Tensor) else 0
        # CostModel.costs_from_sums' arithmetic in Python floats (the same float64 result, without
        # numpy's per-call overhead on one sample).
        m = self.model
        cost = m.a * float(p_sum) + m.b * float(p_sq) + m.c * float(tokens)
        if not math.isfinite(cost):
            raise ValueError("the sample cost overflowed to infinity; its counts are implausibly large")
        return cost


# ----------------------------------------------------------------------------------------------
# Sample codec: a pickled skeleton plus the raw tensor bytes
# ----------------------------------------------------------------------------------------------


class _TensorRef:
    """Stands in for a tensor inside a pickled skeleton."""

    __slots__ = ("index", "dtype", "shape", "nbytes")

    def __init__(self, index: int, dtype: torch.dtype, shape: tuple, nbytes: int):
        self.index, self.dtype, self.shape, self.nbytes = index, dtype, shape, nbytes

    def __reduce__(self):
        return (_TensorRef, (self.index, self.dtype, self.shape, self.nbytes))


def _flatten(obj: Any, tensors: list) -> Any:
    if isinstance(obj, torch.Tensor):
        if obj.layout != torch.strided:
            raise TypeError(f"exchange cannot serialise a {obj.layout} tensor; densify it in the dataset")
        t = obj.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        t = t.contiguous()
        tensors.append(t)
        return _TensorRef(len(tensors) - 1, t.dtype, tuple(t.shape), t.numel() * t.element_size())
    if type(obj) is dict:
        return {k: _flatten(v, tensors) for k, v in obj.items()}
    if type(obj) is list:
        return [_flatten(v, tensors) for v in obj]
    if type(obj) is tuple:
        return tuple(_flatten(v, tensors) for v in obj)
    return obj  # anything else (ints, strings, numpy arrays, ...) is pickled as it is


class EncodedSample:
    """A sample ready to be written into a byte buffer: ``nbytes`` is exact before writing."""

    __slots__ = ("skeleton", "tensors", "nbytes")

    def __init__(self, sample: Any):
        tensors: list[torch.Tensor] = []
        self.skeleton = pickle.dumps(_flatten(sample, tensors), protocol=pickle.HIGHEST_PROTOCOL)
        self.tensors = tensors
        self.nbytes = (_SAMPLE_HEADER.size + len(self.skeleton)
                       + sum(t.numel() * t.element_size() for t in tensors))

    def write(self, out: np.ndarray, offset: int) -> int:
        """Write into the uint8 array ``out`` at ``offset``; return the offset after it."""
        head = _SAMPLE_HEADER.pack(len(self.skeleton)) + self.skeleton
        out[offset:offset + len(head)] = np.frombuffer(head, dtype=np.uint8)
        offset += len(head)
        for t in self.tensors:
            n = t.numel() * t.element_size()
            if n:
                out[offset:offset + n] = t.reshape(-1).view(torch.uint8).numpy()
            offset += n
        return offset


def _rebuild(obj: Any, tensors: list) -> Any:
    if isinstance(obj, _TensorRef):
        return tensors[obj.index]
    if type(obj) is dict:
        return {k: _rebuild(v, tensors) for k, v in obj.items()}
    if type(obj) is list:
        return [_rebuild(v, tensors) for v in obj]
    if type(obj) is tuple:
        return tuple(_rebuild(v, tensors) for v in obj)
    return obj


def _collect_refs(obj: Any, refs: list) -> None:
    if isinstance(obj, _TensorRef):
        refs.append(obj)
    elif type(obj) is dict:
        for v in obj.values():
            _collect_refs(v, refs)
    elif type(obj) in (list, tuple):
        for v in obj:
            _collect_refs(v, refs)


def encode_sample(sample: Any) -> bytes:
    """The bytes of one sample as the exchange sends it (for tests and tools)."""
    enc = EncodedSample(sample)
    out = np.empty(enc.nbytes, dtype=np.uint8)
    enc.write(out, 0)
    return out.tobytes()


def serialized_size(sample: Any) -> int:
    """Bytes one sample occupies in the exchange (what moves if its owner changes)."""
    return EncodedSample(sample).nbytes


def decode_sample(buf: Any, offset: int = 0) -> tuple[Any, int]:
    """``(sample, offset after it)`` from a uint8 buffer holding encoded samples back to back.

    Tensors come back as fresh CPU tensors (own storage, not views of ``buf``).
    """
    data = np.frombuffer(buf, dtype=np.uint8) if not isinstance(buf, np.ndarray) else buf
    (skel_len,) = _SAMPLE_HEADER.unpack_from(data, offset)
    offset += _SAMPLE_HEADER.size
    skeleton = pickle.loads(data[offset:offset + skel_len].tobytes())
    offset += skel_len
    refs: list[_TensorRef] = []
    _collect_refs(skeleton, refs)
    tensors: list[Optional[torch.Tensor]] = [None] * len(refs)
    for ref in sorted(refs, key=lambda r: r.index):  # written in index order
        t = torch.empty(ref.shape, dtype=ref.dtype)
        if ref.nbytes:
            t.reshape(-1).view(torch.uint8).numpy()[:] = data[offset:offset + ref.nbytes]
        tensors[ref.index] = t
        offset += ref.nbytes
    return _rebuild(skeleton, tensors), offset


# ----------------------------------------------------------------------------------------------
# Planning (pure)
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ExchangePlan:
    """Who holds which sample after the exchange, and what moves.

    Positions are indices into the global micro-batch in canonical order (rank 0's local samples,
    then rank 1's, ...). ``order`` is the balanced canonical-group order; rank r holds
    ``order[r·n_local:(r+1)·n_local]`` afterwards, in that order.
    """

    n_ranks: int
    n_local: int
    grid: int
    order: tuple[int, ...]
    sizes: tuple[int, ...]
    predicted_spread: float
    baseline_spread: float

    def local_after(self, rank: int) -> list[int]:
        return list(self.order[rank * self.n_local:(rank + 1) * self.n_local])

    def owner_before(self, position: int) -> int:
        return position // self.n_local

    @cached_property
    def _owner_after(self) -> tuple[int, ...]:
        owner = [0] * len(self.order)
        for k, p in enumerate(self.order):
            owner[p] = k // self.n_local
        return tuple(owner)

    def owner_after(self) -> list[int]:
        return list(self._owner_after)

    @cached_property
    def _flows(self) -> dict[tuple[int, int], list[int]]:
        flows: dict[tuple[int, int], list[int]] = {}
        for k, p in enumerate(self.order):  # in each receiver's hold order
            flows.setdefault((k // self.n_local, p // self.n_local), []).append(p)
        return flows

    def incoming(self, rank: int, src: int) -> list[int]:
        """Positions ``rank`` receives from ``src``, in the order ``rank`` will hold them."""
        return list(self._flows.get((rank, src), ()))

    def send_bytes(self, rank: int) -> list[int]:
        """Bytes ``rank`` sends to each peer (0 to itself)."""
        return [0 if d == rank else sum(self.sizes[p] for p in self._flows.get((d, rank), ()))
                for d in range(self.n_ranks)]

    def recv_bytes(self, rank: int) -> list[int]:
        return [0 if s == rank else sum(self.sizes[p] for p in self._flows.get((rank, s), ()))
                for s in range(self.n_ranks)]

    def moved(self) -> list[int]:
        """Positions whose owner changes, ascending."""
        return [p for p, r in enumerate(self._owner_after) if r != p // self.n_local]

    @property
    def bytes_moved(self) -> int:
        return sum(self.sizes[p] for p in self.moved())


def plan_exchange(costs: Sequence[float] | np.ndarray, sizes: Sequence[int] | np.ndarray,
                  n_ranks: int, grid: int) -> ExchangePlan:
    """The exchange plan of a global micro-batch held by ``n_ranks`` replicas on a grid of G groups.

    ``costs``/``sizes``: per sample, in canonical order. The order is
    ``balanced_order(costs, grid)``: the same on every rank, ties broken by position.
    """
    c = np.asarray(costs, dtype=np.float64)
    s = np.asarray(sizes, dtype=np.int64)
    if c.shape != s.shape or c.ndim != 1:
        raise ValueError("costs and sizes must be 1-D and of equal length (one per sample)")
    if n_ranks < 1 or grid % n_ranks:
        raise ValueError(f"the canonical grid G={grid} must be a multiple of the DP size {n_ranks}")
    check_micro_batch(c.size, grid, "global micro-batch size")
    order = balanced_order(c, grid)
    return ExchangePlan(n_ranks=n_ranks, n_local=c.size // n_ranks, grid=grid, order=tuple(order),
                        sizes=tuple(int(x) for x in s),
                        predicted_spread=float(spread(c, order, grid)),
                        baseline_spread=float(spread(c, contiguous_order(c.size), grid)))


# ----------------------------------------------------------------------------------------------
# The exchange (collective)
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ExchangeStats:
    """One micro-batch's exchange, seen from one rank.

    ``bytes_sent``/``bytes_received``/``samples_sent``/``samples_received``: this rank's share of the
    sample payload (the status and cost all-gathers are ``meta_bytes``). ``samples_moved`` and
    ``bytes_moved``: the whole DP group's (every rank reports the same). Spreads are per canonical
    group, max/mean (1.0 is perfect); ``baseline_spread`` is the contiguous split's.
    Wall times: ``cost_s`` costing and sizing the local samples; ``plan_s`` the status and cost
    all-gathers plus planning (it includes waiting for the slowest replica); ``move_s`` serialising,
    the all_to_all and deserialising; ``total_s`` all of it.
    """

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


def _refuse_overlap_if_unsafe() -> None:
    if os.environ.get(OVERLAP_ENV, "").strip() == "1":
        raise ExchangeError(
            f"mimo_accel exchange: overlap=True is refused while {OVERLAP_ENV}=1. Upstream reproduced "
            "a deadlock when samples are exchanged on a side thread while training kernels and "
            f"collectives are serialised on one hardware queue. Use overlap=False, or unset "
            f"{OVERLAP_ENV} (or set it > 1) if your setup allows.")


def _new_gloo_group(parent, ranks: list[int]):
    """A gloo group over ``ranks``, created by those ranks only (collective over ``parent``).

    Vision and language ranks build their exchange groups independently (ranks that load no data
    never get here), so this uses ``new_group(use_local_synchronization=True)``. torch names such a
    group by hashing its ranks with the creating rank's count of registered groups, and that count
    differs between members whose group-membership histories differ (a rank that was in another
    module's group earlier) — the members would then wait on different store keys forever. So the
    members first agree on the largest count and pad theirs with single-rank groups, which register
    without involving any other rank.
    """
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

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

    Collective at construction (when it creates a process group): every rank of ``group`` must
    construct it, in the same order relative to other group creations.

    group: the module's DP process group (defines the ranks, in DP-rank order).
    ctx: this rank's :class:`~mimo_accel.sampler.ShardContext` (its ``dp_rank``/``dp_size`` must
        match ``group``; ``grid`` is G).
    cost_fn: ``sample -> float`` (finite, >= 0), computed from the decoded sample; default
        :class:`DecodedSampleCost` with ``cost_model`` (or the default :class:`CostModel`).
    collate_fn: collate for :meth:`collate`/:func:`exchange_loader`; ``None`` yields lists.
    overlap: exchange the next micro-batch on a side thread (uses a dedicated group).
    comm_group: a ready gloo group over the same ranks to use instead of creating one.
    """

    def __init__(self, group, ctx: ShardContext, cost_fn: Optional[Callable[[Any], float]] = None,
                 collate_fn: Optional[Callable] = None, *, cost_model: Optional[CostModel] = None,
                 overlap: bool = False, comm_group=None):
        import torch.distributed as dist

        if overlap:
            _refuse_overlap_if_unsafe()  # before anything collective
        self.ctx = ctx
        self.overlap = bool(overlap)
        self.cost_fn = cost_fn if cost_fn is not None else DecodedSampleCost(cost_model)
        self.collate_fn = collate_fn
        self._tagging = TaggingCollate(collate_fn, ctx) if collate_fn is not None else None
        self.ranks = list(dist.get_process_group_ranks(group))
        if len(self.ranks) != ctx.dp_size or dist.get_rank(group) != ctx.dp_rank:
            raise ExchangeError(
                f"mimo_accel exchange: the process group has {len(self.ranks)} ranks and this rank is "
                f"{dist.get_rank(group)} in it, but the ShardContext says {ctx.module} replica "
                f"{ctx.dp_rank}/{ctx.dp_size}; pass the module's DP group")
        if ctx.grid % ctx.dp_size:
            raise ExchangeError(f"mimo_accel exchange: G={ctx.grid} is not a multiple of dp_size {ctx.dp_size}")
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
        self.last_plan: Optional[ExchangePlan] = None
        self.last_stats: Optional[ExchangeStats] = None
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
        costs = np.empty(len(samples), dtype=np.float64)
        encoded = []
        for i, sample in enumerate(samples):
            try:
                value = self.cost_fn(sample)
                cost = float(value)
            except Exception as exc:
                raise ExchangeError(f"cost_fn raised {type(exc).__name__} on local sample {i}: {exc}") from exc
            if not math.isfinite(cost) or cost < 0:
                raise ExchangeError(f"cost_fn returned {cost} for local sample {i}; costs must be finite "
                                    "and >= 0 (fix the cost function or the sample)")
            costs[i] = cost
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
        head = _STATUS_HEADER.pack(1 if error is None else 0, n_local)
        payload = np.zeros(_STATUS_HEADER.size + 2 + _MESSAGE_BYTES, dtype=np.uint8)
        payload[:_STATUS_HEADER.size] = np.frombuffer(head, dtype=np.uint8)
        payload[_STATUS_HEADER.size:_STATUS_HEADER.size + 2] = np.frombuffer(struct.pack("<H", len(msg)), np.uint8)
        payload[_STATUS_HEADER.size + 2:_STATUS_HEADER.size + 2 + len(msg)] = np.frombuffer(msg, np.uint8)
        failures, counts = [], []
        for rank, row in enumerate(self._all_gather(payload)):
            ok, n = _STATUS_HEADER.unpack(row[:_STATUS_HEADER.size].tobytes())
            (length,) = struct.unpack("<H", row[_STATUS_HEADER.size:_STATUS_HEADER.size + 2].tobytes())
            counts.append(n)
            if not ok:
                failures.append((rank, row[_STATUS_HEADER.size + 2:_STATUS_HEADER.size + 2 + length]
                                 .tobytes().decode("utf-8", "replace")))
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
        local = np.concatenate([costs.view(np.uint8), np.fromiter((e.nbytes for e in encoded), dtype=np.int64,
                                                                  count=n_local).view(np.uint8)])
        rows = self._all_gather(local)
        meta += local.size
        all_costs = np.concatenate([r[:8 * n_local].view(np.float64) for r in rows])
        all_sizes = np.concatenate([r[8 * n_local:].view(np.int64) for r in rows])
        if all_costs.size and np.all(all_costs == all_costs[0]):
            from mimo_accel.notices import say_once

            say_once("exchange:equal-costs", "mimo_accel reorder (exchange): every decoded sample of a "
                     "global micro-batch has the same cost (no grid_thw/image_grid_thw in the batch, or "
                     "equal images), so there is nothing to balance: samples stay where they were read")
        plan = plan_exchange(all_costs, all_sizes, n_ranks, self.ctx.grid)
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
        t3 = time.perf_counter()

        stats = ExchangeStats(
            bytes_sent=int(send.size), bytes_received=int(recv.size),
            samples_sent=sum(len(plan.incoming(d, me)) for d in range(n_ranks) if d != me),
            samples_received=len(received), samples_moved=len(moved),
            bytes_moved=int(sum(plan.sizes[p] for p in moved)), meta_bytes=int(meta),
            predicted_spread=plan.predicted_spread, baseline_spread=plan.baseline_spread,
            cost_s=t1 - t0, plan_s=t2 - t1, move_s=t3 - t2, total_s=t3 - t0)
        self.last_plan, self.last_stats = plan, stats
        return out, stats

    def collate(self, samples: list) -> Any:
        """Collate and tag (as already local for this replica), or the list without a collate_fn."""
        return self._tagging(samples) if self._tagging is not None else samples

    def reorder_and_collate(self, local_samples: Sequence[Any]) -> tuple[Any, ExchangeStats]:
        samples, stats = self.reorder(local_samples)
        return self.collate(samples), stats


# ----------------------------------------------------------------------------------------------
# Loaders
# ----------------------------------------------------------------------------------------------


def _as_list(samples):
    """A DataLoader collate that keeps the decoded samples (module-level: picklable for workers)."""
    return list(samples)


def _check_list(item: Any) -> list:
    if not isinstance(item, (list, tuple)):
        raise TypeError("mimo_accel exchange needs a loader that yields lists of decoded samples "
                        f"(collate_fn=list), got {type(item).__name__}; collate happens after the exchange")
    return list(item)


class ExchangeLoader:
    """Iterable of collated, tagged batches: each source list of samples after the exchange.

    With ``exchange.overlap`` a side thread reads, exchanges and collates up to ``prefetch``
    micro-batches ahead; errors raised there are re-raised here. ``on_exchange(stats)`` is called
    on the consuming thread when a batch is handed out (so a profiler attributes the bytes to the
    step that uses them); ``last_stats`` holds the latest.
    """

    def __init__(self, source: Iterable, exchange: ExchangeReorder, *, prefetch: int = 1,
                 on_exchange: Optional[Callable[[ExchangeStats], None]] = None):
        if prefetch < 1:
            raise ValueError(f"prefetch must be >= 1, got {prefetch}")
        self.source = source
        self.exchange = exchange
        self.prefetch = prefetch
        self.on_exchange = on_exchange
        self.last_stats: Optional[ExchangeStats] = None

    def __len__(self) -> int:
        return len(self.source)

    def _deliver(self, batch: Any, stats: ExchangeStats) -> Any:
        self.last_stats = stats
        if self.on_exchange is not None:
            self.on_exchange(stats)
        return batch

    def __iter__(self) -> Iterator[Any]:
        if not self.exchange.overlap:
            for item in self.source:
                batch, stats = self.exchange.reorder_and_collate(_check_list(item))
                yield self._deliver(batch, stats)
            return
        yield from self._overlapped()

    def _overlapped(self) -> Iterator[Any]:
        q: queue.Queue = queue.Queue(maxsize=self.prefetch)
        stop = threading.Event()

        def put(item) -> bool:
            while not stop.is_set():
                try:
                    q.put(item, timeout=0.1)
                    return True
                except queue.Full:
                    continue
            return False

        def work() -> None:
            try:
                for item in self.source:
                    if stop.is_set():
                        return
                    if not put(("ok", self.exchange.reorder_and_collate(_check_list(item)))):
                        return
                put(("end", None))
            except BaseException as exc:  # handed to the consumer, raised there
                put(("error", exc))

        thread = threading.Thread(target=work, name="mimo-accel-exchange", daemon=True)
        thread.start()
        try:
            while True:
                kind, value = q.get()
                if kind == "end":
                    return
                if kind == "error":
                    raise value
                batch, stats = value
                yield self._deliver(batch, stats)
        finally:
            stop.set()
            thread.join(timeout=5.0)


def exchange_loader(source: Iterable, exchange: ExchangeReorder, *, prefetch: int = 1,
                    on_exchange: Optional[Callable[[ExchangeStats], None]] = None) -> ExchangeLoader:
    """Batches of ``source`` (an iterable of lists of decoded samples) after the exchange."""
    return ExchangeLoader(source, exchange, prefetch=prefetch, on_exchange=on_exchange)


def exchange_shard_loader(loader, ctx: ShardContext, micro_batch_size: int, group, *,
                          cost_fn: Optional[Callable[[Any], float]] = None,
                          cost_model: Optional[CostModel] = None, overlap: bool = False,
                          prefetch: int = 1, on_exchange=None, local_batch_sampler=None) -> ExchangeLoader:
    """Exchange mode on top of an upstream DataLoader: read this replica's canonical shard (sharded
    reads), decode it in the loader's workers, exchange, then collate with the loader's collate_fn.
    ``local_batch_sampler``: a sampler that already yields this replica's share (upstream's scalable
    reads); by default the share is cut from the loader's global batch sampler.

    Collective (builds an :class:`ExchangeReorder`): every rank of ``group`` calls it.
    """
    from torch.utils.data import DataLoader

    from mimo_accel.sampler import ShardedBatchSampler

    check_micro_batch(micro_batch_size, ctx.grid)
    if getattr(loader, "batch_sampler", None) is None:
        raise TypeError("mimo_accel exchange: the upstream loader has no batch sampler to shard "
                        "(dataloader_type 'external' passes the dataset through). Use 'single' or "
                        "'cyclic', or turn reorder off.")
    share = local_batch_sampler or ShardedBatchSampler(loader.batch_sampler, ctx)
    reader = DataLoader(loader.dataset, batch_sampler=share,
                        num_workers=loader.num_workers, collate_fn=_as_list, pin_memory=False,
                        worker_init_fn=loader.worker_init_fn,
                        persistent_workers=loader.persistent_workers if loader.num_workers > 0 else False)
    exchange = ExchangeReorder(group, ctx, cost_fn, loader.collate_fn, cost_model=cost_model, overlap=overlap)
    return ExchangeLoader(reader, exchange, prefetch=prefetch, on_exchange=on_exchange)
