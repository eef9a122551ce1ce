"""Loaders: each source list of decoded samples after the exchange, collated and tagged."""

from __future__ import annotations

import functools
import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Optional

from mimo_accel.costs import CostModel
from mimo_accel.runtime.reading.exchange.reorder import ExchangeReorder, ExchangeStats
from mimo_accel.runtime.reading.plan_ahead import put_unless_stopped
from mimo_accel.grid import check_micro_batch
from mimo_accel.runtime.context import ShardContext


def _as_list(read):
    """A DataLoader collate that keeps the decoded samples of a read (``sampler.SamplesRead``; the
    exchange plans them anew) (module-level: picklable for workers)."""
    return list(read.samples)


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
    step that uses them).
    """

    def __init__(self, source: Iterable, exchange: ExchangeReorder, *, prefetch: int = 1,
                 on_exchange: Optional[Callable[[ExchangeStats], None]] = None):
        if prefetch < 1:
            raise ValueError(f"prefetch must be >= 1, got {prefetch}")
        self.source = source
        self.exchange = exchange
        self.prefetch = prefetch
        self.on_exchange = on_exchange

    def __len__(self) -> int:
        return len(self.source)

    def _deliver(self, batch: Any, stats: ExchangeStats) -> Any:
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
        put = functools.partial(put_unless_stopped, q, stop=stop)

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


def exchange_shard_loader(loader, ctx: ShardContext, micro_batch_size: int, group, *,
                          cost_fn: Optional[Callable[[Any], float]] = None,
                          cost_model: Optional[CostModel] = None, overlap: bool = False,
                          prefetch: int = 1, on_exchange=None, local_batch_sampler=None,
                          notify: Optional[Callable[[str, str], object]] = None, check=None) -> ExchangeLoader:
    """Exchange mode on top of an upstream DataLoader: read this replica's canonical shard (sharded
    reads), decode it in the loader's workers, exchange, then collate with the loader's collate_fn.
    ``local_batch_sampler``: a sampler that already yields this replica's share (upstream's scalable
    reads); by default the share is cut from the loader's global batch sampler. ``check``: the
    exchange plans compared across the data-loading ranks (:class:`~mimo_accel.runtime.reading.plan_check.FirstPlanCheck`).

    Collective (builds an :class:`ExchangeReorder`): every rank of ``group`` calls it.
    """
    from torch.utils.data import DataLoader

    from mimo_accel.runtime.reading.sampler import ReadsOf, ShardedBatchSampler, loader_settings

    check_micro_batch(micro_batch_size, ctx.grid)
    if getattr(loader, "batch_sampler", None) is None:
        raise TypeError("mimo_accel exchange: the upstream loader has no batch sampler to shard "
                        "(dataloader_type 'external' passes the dataset through). Use 'single' or "
                        "'cyclic', or turn reorder off.")
    share = local_batch_sampler or ShardedBatchSampler(loader.batch_sampler, ctx)
    # the user's settings, but unpinned: these are decoded samples bound for the exchange, and the
    # user's collate (with its pinning) runs after it
    reader = DataLoader(ReadsOf(loader.dataset), batch_sampler=share,  # a failing sample names itself
                        collate_fn=_as_list, **dict(loader_settings(loader), pin_memory=False))
    exchange = ExchangeReorder(group, ctx, cost_fn, loader.collate_fn, cost_model=cost_model, overlap=overlap,
                               notify=notify, check=check)
    return ExchangeLoader(reader, exchange, prefetch=prefetch, on_exchange=on_exchange)
