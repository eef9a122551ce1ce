"""A user's DataLoader settings survive sharded reads and reorder: the loader mimo_accel builds over
this replica's share (``tagged_loader``; exchange mode's reader too) carries every setting of the
upstream loader that does not decide the batches, read off it by DataLoader's own parameter names."""

from __future__ import annotations

import inspect
import multiprocessing

import torch
from torch.utils.data import BatchSampler, DataLoader, SequentialSampler

from mimo_accel.runtime.reading.sampler import loader_settings, tagged_loader
from mimo_accel.runtime.context import ShardContext
from mimo_accel.runtime.reading.shard import SHARD_TAG_KEY

CTX = ShardContext("vision", 0, 1, 1, {"vision": 1, "language": 1})


def _init_worker(worker_id: int) -> None:  # module level: picklable for spawned workers
    torch.manual_seed(worker_id)


def _collate(samples):
    return {"x": torch.tensor(samples)}


def test_every_setting_of_a_loader_with_workers_is_carried():
    generator = torch.Generator().manual_seed(7)
    context = multiprocessing.get_context("spawn")
    user = DataLoader(list(range(8)), batch_size=2, collate_fn=_collate, num_workers=2, prefetch_factor=3,
                      timeout=11.0, generator=generator, multiprocessing_context=context,
                      persistent_workers=True, worker_init_fn=_init_worker, in_order=False,
                      pin_memory=False, pin_memory_device="")
    ours = tagged_loader(user, CTX, BatchSampler(SequentialSampler(range(8)), 4, drop_last=True))
    for name in ("num_workers", "prefetch_factor", "timeout", "generator", "multiprocessing_context",
                 "persistent_workers", "worker_init_fn", "in_order", "pin_memory", "pin_memory_device"):
        assert getattr(ours, name) == getattr(user, name), name
    assert ours.generator is generator and ours.worker_init_fn is _init_worker


def test_every_constructor_setting_is_accounted_for():
    """A setting a later torch adds is carried without a change here: whatever DataLoader takes is
    either carried or decides the batches (which the sharded loader brings itself)."""
    user = DataLoader(list(range(4)), batch_size=2)
    carried = set(loader_settings(user))
    taken = set(inspect.signature(DataLoader.__init__).parameters) - {"self"}
    batching = {"dataset", "batch_size", "shuffle", "sampler", "batch_sampler", "drop_last", "collate_fn"}
    assert taken - batching - {"prefetch_factor"} == carried  # no workers: no prefetch to carry


def test_a_loader_without_workers_reads_tagged_batches():
    user = DataLoader(list(range(8)), batch_size=2, collate_fn=_collate, timeout=0, in_order=True)
    ours = tagged_loader(user, CTX, BatchSampler(SequentialSampler(range(8)), 4, drop_last=True))
    batches = list(ours)
    assert [b["x"].tolist() for b in batches] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert all(b[SHARD_TAG_KEY].samples == 4 for b in batches)
