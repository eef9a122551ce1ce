"""Plans made ahead (mimo_accel.runtime.reading.plan_ahead) behind the sharded sampler, in one process:
the shares equal the serial plan's bit for bit (windows, a short last micro-batch, the arithmetic
on the planner thread or in a forked child), upstream's sampler state moves as it would without
planning ahead, a planner error surfaces at the batch it belongs to with its own message, the
training thread's wait for a plan travels with the batch, and a pass that is exhausted or dropped
leaves no thread or process behind (with and without loader workers).

Megatron Bridge's own samplers (``MegatronPretrainingSampler``, ``MegatronPretrainingRandomSampler``)
are the upstream samplers; no ranks are started (the check across ranks: tests/test_plan_check.py,
tests/test_plan_agreement.py)."""

from __future__ import annotations

import gc
import multiprocessing
import threading
import time

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as hs

from mimo_accel.costs import CostIndex, CostModel
from mimo_accel.costs.resize import FixedPatches
from mimo_accel.modules import Modules
from mimo_accel.planner import CostIndexPlanner
from mimo_accel.runtime.reading.sampler import ShardedBatchSampler, ShareRules, tagged_loader
from mimo_accel.runtime.context import ShardContext
from mimo_accel.runtime.reading.shard import SHARD_TAG_KEY
from tests._hypothesis import examples

DPS = {"vision": 2, "language": 4}
CTX = ShardContext("vision", 1, 2, 4, DPS)


def _planner(n=4096, seed=0):
    rng = np.random.default_rng(seed)
    items = rng.integers(0, 3, n)
    rows = np.where(items > 0, rng.integers(1, 2000, n), 0)
    index = CostIndex(rng.integers(16, 1024, n), {"vision": (items, rows, rows * rows, FixedPatches(1))})
    return CostIndexPlanner(index, CostModel(), Modules.from_dp_sizes(DPS))


def _megatron_sampler(kind, n, mbs, consumed=0, drop_last=True):
    from megatron.bridge.data import samplers

    if kind == "single":
        return samplers.MegatronPretrainingSampler(total_samples=n, consumed_samples=consumed, micro_batch_size=mbs,
                                                   data_parallel_rank=0, data_parallel_size=1, drop_last=drop_last)
    return samplers.MegatronPretrainingRandomSampler(dataset=range(n), total_samples=n, consumed_samples=consumed,
                                                     micro_batch_size=mbs, data_parallel_rank=0,
                                                     data_parallel_size=1, data_sharding=True)


def _serial(sampler, planner, window):
    """What the sampler yields when every window is planned in the loop that asks for it."""
    rules = ShareRules(CTX, window)
    out = []
    for _, batches, _, _ in rules.windows(sampler):
        out.extend(rules.plan(planner, batches)[0])
    return out


def _planners():
    """(planner threads, planner processes) alive in this process."""
    return (sum(t.name.startswith("mimo-accel-plan-ahead") for t in threading.enumerate()),
            sum(p.name == "mimo-accel-planner" for p in multiprocessing.active_children()))


def _settled(deadline_s=10.0):
    """The planners alive once every dropped pass has stopped (bounded wait: a dropped pass's thread
    ends at its next queue wait, within a fraction of a second). One collection finalizes what the
    test dropped; a collection per poll would cost seconds in a process that has imported Megatron."""
    gc.collect()
    end = time.monotonic() + deadline_s
    while _planners() != (0, 0) and time.monotonic() < end:
        time.sleep(0.02)
    return _planners()


@settings(max_examples=examples(25), deadline=None)
@given(kind=hs.sampled_from(["single", "cyclic"]), micro_batches=hs.integers(1, 7), window=hs.sampled_from([1, 2, 4]),
       short=hs.booleans(), in_process=hs.booleans(), seed=hs.integers(0, 3))
def test_planned_ahead_shares_equal_the_serial_plan(kind, micro_batches, window, short, in_process, seed):
    mbs = 16
    n = micro_batches * mbs + (8 if short and kind == "single" else 0)  # drop_last=False: a short last micro-batch
    planner = _planner(n, seed)
    if short and kind == "single" and window > 1:
        window = 1  # a window spans whole steps; the short tail is planned alone in any case
    want = _serial(_megatron_sampler(kind, n, mbs, drop_last=not short), planner, window)
    got = list(ShardedBatchSampler(_megatron_sampler(kind, n, mbs, drop_last=not short), CTX, planner, window=window,
                                   in_process=in_process))
    assert [g.indices for g in got] == [w.indices for w in want]
    assert [(g.spread, g.spreads) for g in got] == [(w.spread, w.spreads) for w in want]
    for g, w in zip(got, want):  # each micro-batch's planned load per replica rides with its share
        assert g.loads.keys() == w.loads.keys() == set(DPS) and all(
            np.array_equal(g.loads[m], w.loads[m]) and g.loads[m].shape == (DPS[m],) for m in DPS)


def test_upstream_sampler_state_moves_as_it_does_without_planning_ahead():
    mbs, n = 16, 16 * 12
    planned, unplanned = _megatron_sampler("cyclic", n, mbs), _megatron_sampler("cyclic", n, mbs)
    ahead = iter(ShardedBatchSampler(planned, CTX, _planner(n), window=2))
    plain = iter(ShardedBatchSampler(unplanned, CTX))
    for _ in range(4):  # two windows taken: the planner has read further ahead, the sampler has not
        next(ahead), next(plain)
    assert planned.consumed_samples == unplanned.consumed_samples == 4 * mbs
    # a new iterator over the same loader continues where the loader's sampler is, as without planning
    again = list(ShardedBatchSampler(planned, CTX, _planner(n), window=2))
    assert len(again) == 12 - 4
    assert planned.consumed_samples == n


def test_a_resume_inside_a_window_is_refused_at_the_first_batch():
    sampler = ShardedBatchSampler(_megatron_sampler("single", 256, 16, consumed=16), CTX, _planner(256), window=2)
    with pytest.raises(ValueError, match="consumed_samples=16, 1 micro-batches in, which is not the start of a window"):
        next(iter(sampler))


class _FailsAt:
    """A planner that raises on the window holding global sample ``at``."""

    def __init__(self, planner, at):
        self.planner, self.at = planner, at

    def __call__(self, indices, micro_batches):
        if self.at in indices:
            raise KeyError(f"the cost index lost sample {self.at}")
        return self.planner(indices, micro_batches)


@pytest.mark.parametrize("in_process", [True, False])
def test_a_planner_error_surfaces_at_its_batch_with_its_own_message(in_process):
    assert _settled() == (0, 0)  # earlier tests' passes are gone (a dropped cyclic pass stops at its next wait)
    sampler = ShardedBatchSampler(_megatron_sampler("single", 256, 16), CTX, _FailsAt(_planner(256), 40),
                                  in_process=in_process)
    it = iter(sampler)
    assert len([next(it), next(it)]) == 2  # micro-batches 0 and 1 (samples 0-31) arrive
    with pytest.raises(KeyError, match="the cost index lost sample 40"):
        next(it)
    assert _planners() == (0, 0)  # the failed pass is over: nothing of it is left
    with pytest.raises(StopIteration):
        next(it)


def test_the_wait_for_a_plan_travels_with_its_batch():
    release = threading.Event()
    planner = _planner(256)

    def slow(indices, micro_batches):
        if 0 in indices:
            release.wait(30)
        return planner(indices, micro_batches)

    sampler = ShardedBatchSampler(_megatron_sampler("single", 256, 16), CTX, slow, in_process=False)
    timer = threading.Timer(0.3, release.set)
    timer.start()
    batches = [b for _, b in zip(range(3), iter(sampler))]
    assert batches[0].plan_wait_s >= 0.3  # the first plan was not ready: the batch says how long it waited
    assert all(b.plan_wait_s < batches[0].plan_wait_s for b in batches[1:])


def _collate(samples):
    return {"input_ids": torch.tensor(samples)}


@pytest.mark.parametrize("workers,persistent", [(0, False), (2, False), (2, True)])
def test_a_dropped_or_exhausted_loader_leaves_no_planner_behind(workers, persistent):
    assert _settled() == (0, 0)  # earlier tests' passes are gone
    source = torch.utils.data.DataLoader(list(range(4096)), batch_size=16, num_workers=workers,
                                         persistent_workers=persistent, collate_fn=_collate)
    sampler = ShardedBatchSampler(_megatron_sampler("single", 4096, 16), CTX, _planner(4096))
    loader = tagged_loader(source, CTX, sampler)
    it = iter(loader)
    first = next(it)
    assert first[SHARD_TAG_KEY].share.plan_wait_s >= 0.0 and first["input_ids"].numel() == 8  # vision replica 1 of 2
    assert _planners() == (1, 1)  # planning ahead: its thread and child are running
    t0 = time.monotonic()
    del it, loader, sampler, first  # torch joins its workers here (persistent or not)
    dropped_s = time.monotonic() - t0
    assert _settled() == (0, 0)

    small = tagged_loader(torch.utils.data.DataLoader(list(range(64)), batch_size=16, num_workers=workers,
                                                      persistent_workers=persistent, collate_fn=_collate),
                          CTX, ShardedBatchSampler(_megatron_sampler("single", 64, 16), CTX, _planner(64)))
    t0 = time.monotonic()
    assert len(list(small)) == 4
    exhausted_s = time.monotonic() - t0
    assert _planners() == (0, 0)  # exhausted: at once, without the loader being dropped
    # A child that holds another's exit pipe (forked from two threads at once) shows as torch's or
    # the planner's 5 s join timeout; a clean stop takes milliseconds.
    assert dropped_s < 4.0 and exhausted_s < 4.0, (dropped_s, exhausted_s)
