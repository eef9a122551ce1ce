"""Sharded (and planned) batch sampling on top of Megatron Bridge's own samplers.

Upstream's sampler is kept exactly as it is: it still decides the *global* order (``single`` /
``cyclic``, epoch seeds, ``consumed_samples`` resume and ``drop_last`` as upstream, alike on every
module), and a wrapper yields only the share of each global micro-batch this rank's replica owns on
the canonical grid; with a planner, the share of the planned order, planned ahead
(:mod:`~mimo_accel.runtime.reading.plan_ahead`) and agreed by every data-loading rank. The share
(:class:`~mimo_accel.runtime.reading.shard.ReplicaShare`) travels with its samples through the read
and the loader's workers into the batch's tag, so nothing pairs figures with batches afterwards.
"""

from __future__ import annotations

import itertools
import weakref
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterator, Mapping, Optional, Sequence

import numpy as np

from mimo_accel.grid import check_micro_batch, moved_between_replicas, replica_samples
from mimo_accel.nvtx import ranged
from mimo_accel.planner import Prediction
from mimo_accel.runtime.context import ShardContext
from mimo_accel.runtime.reading.shard import SHARD_TAG_KEY, ReplicaShare, tag_for

# planner(global_indices, micro_batches) -> (the same indices in canonical-group order, what the plan
# predicts: a planner.Prediction, or each module's spread, one number, or None); with
# micro_batches > 1 the indices are a window of consecutive micro-batches. The indices are given
# as an int64 array; the order may be any sequence of them.
Planner = Callable[[Sequence[int], int], "tuple[list[int], object]"]


def _spreads_of(predictions: list) -> tuple[Optional[float], dict]:
    """The worst predicted spread and each module's (empty where a planner gave one number) over
    the plans of a window's parts, each a planner's second result."""
    spreads = [p.spreads if isinstance(p, Prediction) else p for p in predictions]
    if any(s is None for s in spreads):
        return None, {}
    if all(isinstance(s, Mapping) for s in spreads):
        each = {m: max(float(s[m]) for s in spreads) for m in spreads[0]}
        return max(each.values(), default=None), each
    return max(float(max(s.values()) if isinstance(s, Mapping) else s) for s in spreads), {}


@dataclass(frozen=True)
class SamplesRead:
    """The samples read for one share, as the collate function receives them."""

    samples: list
    share: Optional[ReplicaShare] = None


class SampleLoadError(RuntimeError):
    """A sample failed to load (decode, read, process); names its index and, where the dataset's
    example row has one, its file. The original error is the ``__cause__``."""

    def __init__(self, message: str, index: Optional[int] = None, files: tuple = ()):
        super().__init__(message)
        self.index = index
        self.files = files


def _files_of(dataset, index: int) -> tuple:
    """The files of sample ``index`` where the dataset's example row names them (Bridge's
    ``MegatronMIMODataset``: ``dataset.examples[i][column]`` for its modality columns); () if none."""
    import os

    examples = getattr(dataset, "examples", None)
    if examples is None:
        return ()
    try:
        row = examples[int(index)]
    except Exception:  # noqa: BLE001 - only a hint for the error message
        return ()
    if not isinstance(row, dict):
        return ()
    columns = list((getattr(dataset, "modality_columns", None) or {}).values())
    values = [row.get(c) for c in columns] if columns else list(row.values())

    def paths(v):
        if isinstance(v, (str, os.PathLike)):
            if columns or os.path.isfile(v):
                yield os.fspath(v)
        elif isinstance(v, (list, tuple)):
            for x in v:
                yield from paths(x)
        elif isinstance(v, dict):
            for key in ("path", "file", "filename", "image", "audio"):
                if key in v:
                    yield from paths(v[key])

    return tuple(p for v in values for p in paths(v))


def _if_empty(path: str) -> str:
    """``, empty: 0 bytes`` after an empty file's name (its decoder says only that it cannot read it)."""
    import os

    try:
        return ", empty: 0 bytes" if os.path.getsize(path) == 0 else ""
    except OSError:
        return ""


class ReadsOf:
    """The dataset as the sharded loader reads it: the same samples, read by a batch of indices at
    a time (torch's ``__getitems__``), so that the plan's figures stay with them. A sample that
    fails to load raises :class:`SampleLoadError`, naming its index and file."""

    def __init__(self, dataset):
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index):
        try:
            return self.dataset[index]
        except IndexError:  # out of range: the iteration protocol's signal, left as it is
            raise
        except Exception as exc:
            files = _files_of(self.dataset, index)
            where = f" (file {', '.join(f + _if_empty(f) for f in files)})" if files else ""
            raise SampleLoadError(f"mimo_accel: sample {index} of {type(self.dataset).__name__}{where} failed to "
                                  f"load: {type(exc).__name__}: {exc}", int(index), files) from exc

    @ranged("mimo_accel/read")  # NVTX on CUDA only (mimo_accel.nvtx)
    def __getitems__(self, share) -> SamplesRead:
        """The samples of ``share``: a :class:`ReplicaShare`, or a plain batch of indices (upstream's
        own sampler under its scalable reads)."""
        if not isinstance(share, ReplicaShare):
            share = ReplicaShare(tuple(int(i) for i in share))
        indices = list(share.indices)
        own = getattr(self.dataset, "__getitems__", None)
        if own is None:
            samples = [self[i] for i in indices]
        else:
            try:
                samples = own(indices)
            except Exception as exc:
                # the dataset read them together: find the one that fails on its own
                for i in indices:
                    self[i]
                raise SampleLoadError(f"mimo_accel: samples {list(indices)} of {type(self.dataset).__name__} "
                                      f"failed to load together: {type(exc).__name__}: {exc}",
                                      int(indices[0]) if len(indices) else -1) from exc
        return SamplesRead(samples, share)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["dataset"], name)

@dataclass(frozen=True)
class ShareRules:
    """How a sampler cuts upstream's micro-batches into this replica's shares: the windows planned
    together, where the sampler starts, this rank's place on the grid. Holds nothing else, so a
    planner thread that reads with it keeps no loader alive."""

    ctx: ShardContext
    window: int = 1
    start: Optional[tuple[int, int]] = None

    def windows(self, source, state=lambda: None) -> Iterator[tuple[int, list[list], object, int]]:
        """``(ordinal, micro-batches, state(), first micro-batch)`` for each window of ``source``;
        the first micro-batch counted from the start of training (where the sampler resumes)."""
        consumed, mbs = self.start or (getattr(source, "consumed_samples", None),
                                       getattr(source, "micro_batch_size", None))
        if self.window > 1 and consumed and mbs and (consumed // mbs) % self.window:
            raise ValueError(
                f"mimo_accel reorder_window={self.window}: the loader starts at consumed_samples="
                f"{consumed}, {consumed // mbs} micro-batches in, which is not the start of a window; "
                "resume from a checkpoint taken at the end of a training step")
        first = consumed // mbs if consumed and mbs else 0
        pending: list[list] = []
        ordinal = 0
        for global_indices in source:
            pending.append(list(global_indices))
            check_micro_batch(len(pending[-1]), self.ctx.grid, "global micro-batch size")
            if len(pending) == self.window:
                yield ordinal, pending, state(), first + ordinal * self.window
                ordinal += 1
                pending = []
        if pending:
            yield ordinal, pending, state(), first + ordinal * self.window

    def plan(self, planner, batches: list[list], model=None) -> tuple[list[ReplicaShare], str, int]:
        """One window's shares for this replica, the digest of its plan, and its first global index.
        ``model``: the :class:`~mimo_accel.runtime.measuring.calibration.WindowModel` the window is planned
        with (online calibration), or None (the planner's own)."""
        from mimo_accel.runtime.reading.plan_check import plan_digest

        # numpy, not lists, from here: this runs on the planner thread beside the training thread,
        # and what it does in Python it does holding the interpreter lock
        window = np.fromiter(itertools.chain.from_iterable(batches), dtype=np.int64, count=sum(map(len, batches)))
        extra = () if model is None else (model.model,)
        if len({len(b) for b in batches}) == 1:
            parts = [planner(window, len(batches), *extra)]
        else:  # a short last micro-batch (drop_last=False): plan it on its own
            parts = [planner(np.asarray(b, dtype=np.int64), 1, *extra) for b in batches]
        order = np.concatenate([np.asarray(p[0], dtype=np.int64).reshape(-1) for p in parts])
        if order.shape != window.shape or not np.array_equal(np.sort(order), np.sort(window)):
            raise RuntimeError("mimo_accel planner returned a different set of samples than the "
                               "global micro-batch it was given; refusing to mis-pair samples")
        spread, spreads = _spreads_of([p[1] for p in parts])
        steps = [p[1].step_time for p in parts if isinstance(p[1], Prediction) and p[1].step_time is not None]
        shares = self.shares(batches, order, ReplicaShare(spread=spread, spreads=spreads,
                                                          step_time=steps[0] if len(parts) == 1 and steps else None))
        starts = np.cumsum([0, *map(len, batches)])
        shares = [replace(share, moved=moved_between_replicas(b, order[lo:hi], self.ctx.dp_size))
                  for share, b, lo, hi in zip(shares, batches, starts[:-1], starts[1:])]
        if all(isinstance(p[1], Prediction) and p[1].loads for p in parts):  # each micro-batch's load per replica
            overheads, digest = ({}, None) if model is None else (dict(model.overheads), model.digest)
            # float64 arrays, not lists: a window's loads per replica would be thousands of Python
            # floats made on this thread and summed per step on the training thread
            loads = [{m: np.array(rows[j], dtype=np.float64) for m, rows in p[1].loads.items()}
                     for p in parts for j in range(next(iter(p[1].loads.values())).shape[0])]
            shares = [replace(share, loads=micro, overheads=overheads, cost_model=digest)
                      for share, micro in zip(shares, loads)]
        digest = plan_digest(window, order, "" if model is None else model.digest)
        return shares, digest, int(window[0]) if window.size else -1

    def shares(self, batches: list[list], order: list,
               predicted: ReplicaShare = ReplicaShare()) -> list[ReplicaShare]:
        """This replica's share of each micro-batch of a window ordered as ``order``, each with what
        ``predicted`` holds besides its indices."""
        ctx, out, start = self.ctx, [], 0
        for b in batches:
            mine = replica_samples(order[start:start + len(b)], ctx.dp_rank, ctx.dp_size, ctx.grid)
            start += len(b)
            out.append(replace(predicted, indices=tuple(mine.tolist() if isinstance(mine, np.ndarray) else mine)))
        return out

class ShardedBatchSampler:
    """Yields this replica's share of every global micro-batch the upstream sampler yields.

    With a planner and ``window`` > 1, ``window`` consecutive micro-batches are planned together (a
    window that tiles a training step: :func:`mimo_accel.config.resolve_window`); the sampler must
    start at a window boundary (a resume starts at a step). Each pass (each ``iter()``) is planned
    ahead on a thread of its own, each window agreed by the data-loading ranks (``check``). The first
    pass starts when the sampler is built, so a rank whose iterator is made lazily (Bridge's
    examples) has its first windows planned before its first batch is asked for.
    """

    def __init__(self, global_sampler, ctx: ShardContext, planner: Optional[Planner] = None, window: int = 1,
                 start: Optional[tuple[int, int]] = None, check=None, in_process: bool = True, models=None):
        window = window if planner is not None else 1
        # models(first micro-batch of a window) -> (cost model, digest, overheads) it is planned with
        # (online calibration), or None: the planner's own model
        self.models = models if planner is not None else None
        self.check = check if planner is not None else None
        self.global_sampler = global_sampler
        # start: (consumed_samples, micro_batch_size) where the global sampler starts; default: its
        # own attributes (Megatron's flat samplers have them, #5525's canonical-group sampler does not)
        self.rules = ShareRules(ctx, window, start)
        self.ctx = ctx
        self.planner = planner
        self.window = window
        self.in_process = in_process  # the plan's arithmetic in a forked child (plan_ahead.ForkedPlanner)
        self.passes = 0  # passes planned so far (each iter() is one; the check keys them)
        self._last = None  # weakref to the pass handed out last
        self._ready = self._start_pass() if planner is not None else None

    def _start_pass(self):
        from mimo_accel.runtime.reading.plan_ahead import PassSpec, PlannedPass, detached

        source, carry, state, base = detached(self.global_sampler)
        rules = self.rules
        spec = PassSpec(windows=lambda: rules.windows(source, state), plan=rules.plan, planner=self.planner,
                        check=self.check, pass_no=self.passes, in_process=self.in_process, models=self.models)
        self.passes += 1
        return PlannedPass(spec, carry, base)

    def __iter__(self) -> Iterator[list]:
        if self.planner is None:
            return self._unplanned()
        # The pass started when the sampler was built, or the last one handed out while nothing has
        # been taken from it (a DataLoader with workers asks twice for one iterator): that pass.
        ready, self._ready = self._ready, None
        if ready is None and self._last is not None:
            ready = self._last()
        if ready is not None and ready.untaken and ready.fresh_for(self.global_sampler):
            self._last = weakref.ref(ready)
            return ready
        fresh = self._start_pass()
        self._last = weakref.ref(fresh)
        return fresh

    def _unplanned(self) -> Iterator[list]:
        for _, batches, _, _ in self.rules.windows(self.global_sampler):
            yield from self.rules.shares(batches, [i for b in batches for i in b])

    def __len__(self) -> int:
        return len(self.global_sampler)

    def __getattr__(self, name: str) -> Any:
        # consumed_samples, micro_batch_size, ... stay the upstream sampler's (global) values
        return getattr(self.__dict__["global_sampler"], name)


class TaggingCollate:
    """Collate the local samples, then tag the batch as already sharded for this replica."""

    def __init__(self, collate_fn, ctx: ShardContext):
        self.collate_fn = collate_fn
        self.ctx = ctx

    def __call__(self, read: SamplesRead):
        samples = read.samples
        batch = self.collate_fn(samples) if self.collate_fn is not None else samples
        if not isinstance(batch, dict):
            raise TypeError("mimo_accel sharded reads need the collate function to return a dict "
                            f"(MegatronMIMO batches are dicts), got {type(batch).__name__}")
        batch[SHARD_TAG_KEY] = tag_for(self.ctx, len(samples), read.share)
        return batch


def shard_loader(loader, ctx: ShardContext, micro_batch_size: int, planner: Optional[Planner] = None,
                 window: int = 1, global_sampler=None, start: Optional[tuple[int, int]] = None, check=None,
                 models=None):
    """A DataLoader over the same dataset/collate/workers that reads only this replica's share of
    ``global_sampler``'s micro-batches (default: the upstream loader's own, global, batch sampler)."""
    check_micro_batch(micro_batch_size, ctx.grid)
    if global_sampler is None and getattr(loader, "batch_sampler", None) is None:
        raise TypeError("mimo_accel sharded reads: the upstream loader has no batch sampler to shard "
                        "(dataloader_type 'external' passes the dataset through). Use 'single' or "
                        "'cyclic', or turn sharded_reads off.")
    sampler = ShardedBatchSampler(global_sampler or loader.batch_sampler, ctx, planner, window, start, check,
                                  models=models)
    return tagged_loader(loader, ctx, sampler)


# What a DataLoader is built from that decides the batches themselves: the sharded loader brings
# its own (the batch sampler, the tagging collate); every other setting is carried as the user set it.
_BATCHING = frozenset({"self", "dataset", "batch_size", "shuffle", "sampler", "batch_sampler", "drop_last",
                       "collate_fn"})


def loader_settings(loader) -> dict:
    """Every setting of ``loader`` that its constructor takes and that does not decide the batches
    (workers, prefetch, timeout, generator, multiprocessing context, pinning, ``in_order``, ...),
    read off the loader by the constructor's own parameter names, so a setting a later torch adds
    is carried too."""
    import inspect

    from torch.utils.data import DataLoader

    names = [n for n in inspect.signature(DataLoader.__init__).parameters if n not in _BATCHING]
    settings = {n: getattr(loader, n) for n in names if hasattr(loader, n)}
    if not settings.get("num_workers"):
        # torch refuses these without workers; a loader without workers holds only their defaults
        settings.pop("prefetch_factor", None)
        settings["persistent_workers"] = False
    return settings


def prefetched(loader) -> int:
    """How many batches ``loader``'s workers take from its batch sampler ahead of the one training
    (0 without workers, or without a loader)."""
    workers = int(getattr(loader, "num_workers", 0) or 0)
    return workers * int(getattr(loader, "prefetch_factor", None) or 2) if workers else 0


def tagged_loader(loader, ctx: ShardContext, batch_sampler):
    """The upstream loader's dataset, collate and every other setting over ``batch_sampler``,
    batches tagged."""
    from torch.utils.data import DataLoader

    return DataLoader(ReadsOf(loader.dataset), batch_sampler=batch_sampler,
                      collate_fn=TaggingCollate(loader.collate_fn, ctx), **loader_settings(loader))
