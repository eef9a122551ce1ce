"""Plan-before-read planning and the sharded sampler, without processes (pure parts).

Every module's replicas must derive the same plan: what vision replica r reads equals what its
language peers read, for 1:1, fan-in, fan-out and windows of several micro-batches.
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st_

from mimo_accel.balance import lpt_order, spread
from mimo_accel.costs import CostIndex, CostModel, ResizeRule
from mimo_accel.grid import canonical_grid
from mimo_accel.planner import CostIndexPlanner
from mimo_accel.runtime.sampler import ShardedBatchSampler
from mimo_accel.runtime.shard import ShardContext


def _index(n: int, seed: int) -> CostIndex:
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 4, n)
    per_image = [rng.integers(4, 400, k) for k in images]
    return CostIndex(patches=[int(p.sum()) for p in per_image], sq_patches=[int((p * p).sum()) for p in per_image],
                     tokens=rng.integers(10, 500, n), images=images, rule=ResizeRule())


def _contexts(vdp: int, ldp: int):
    g = canonical_grid([vdp, ldp])
    sizes = {"vision": vdp, "language": ldp}
    return [ShardContext(m, r, d, g, sizes) for m, d in sizes.items() for r in range(d)]


def _read(vdp, ldp, batches, index, window=1):
    g = canonical_grid([vdp, ldp])
    out = {}
    for ctx in _contexts(vdp, ldp):
        planner = CostIndexPlanner(index, CostModel(), g, vision_groups=vdp)
        out[(ctx.module, ctx.dp_rank)] = list(ShardedBatchSampler(batches, ctx, planner, window=window,
                                                                  step_micro_batches=2))
    return out


@settings(max_examples=40, deadline=None)
@given(vdp=st_.sampled_from([1, 2, 4]), ldp=st_.sampled_from([1, 2, 4]), per=st_.sampled_from([1, 2, 3]),
       steps=st_.integers(1, 3), window=st_.sampled_from([1, 2]), seed=st_.integers(0, 10_000))
def test_every_module_reads_the_same_samples_per_vision_replica(vdp, ldp, per, steps, window, seed):
    g = canonical_grid([vdp, ldp])
    mbs = g * per
    index = _index(mbs * steps + 7, seed)
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(index)).tolist()
    batches = [order[i * mbs:(i + 1) * mbs] for i in range(steps)]
    reads = _read(vdp, ldp, batches, index, window)
    for s in range(steps):
        # nothing lost or duplicated per module, and samples stay inside their window of micro-batches
        w = s // window
        window_samples = sorted(i for b in batches[w * window:(w + 1) * window] for i in b)
        for module, d in (("vision", vdp), ("language", ldp)):
            got = sorted(i for r in range(d) for i in reads[(module, r)][s])
            assert len(got) == mbs and len(set(got)) == mbs and set(got) <= set(window_samples)
        # vision replica r's samples, in order, are what its language peers hold, in order
        if vdp >= ldp:  # fan-in / 1:1: language i concatenates vision i*k ... i*k+k-1
            k = vdp // ldp
            for i in range(ldp):
                assert reads[("language", i)][s] == [x for r in range(i * k, (i + 1) * k) for x in reads[("vision", r)][s]]
        else:  # fan-out: vision i is split in order between language i*k ... i*k+k-1
            k = ldp // vdp
            for i in range(vdp):
                assert reads[("vision", i)][s] == [x for j in range(i * k, (i + 1) * k) for x in reads[("language", j)][s]]


def test_fan_out_balances_the_vision_replicas_not_the_finer_groups():
    # G = 8 language groups, 2 vision replicas: the replica-level spread must be near the bound,
    # and no worse than LPT over the replicas (what balancing the 8 groups alone can miss).
    index = _index(64, 3)
    model = CostModel()
    costs = index.costs(np.arange(64), model)
    planner = CostIndexPlanner(index, model, grid=8, vision_groups=2)
    order, predicted = planner(list(range(64)))
    pos = {s: p for p, s in enumerate(range(64))}
    replica_spread = spread(costs, [pos[s] for s in order], 2)
    assert predicted == replica_spread
    assert replica_spread <= spread(costs, lpt_order(costs, 2), 2) + 1e-12
    # and the language groups inside each vision block are balanced by tokens
    tokens = index.tokens(np.asarray(order)).astype(float).reshape(8, 8).sum(axis=1)
    assert tokens.max() / tokens.mean() < 1.25


def test_window_balances_across_the_micro_batches_of_a_step():
    index = _index(64, 5)
    model = CostModel()
    planner = CostIndexPlanner(index, model, grid=4)
    one_at_a_time = [planner(list(range(i * 16, (i + 1) * 16)))[1] for i in range(4)]
    order, window_spread = planner(list(range(64)), micro_batches=4)
    assert sorted(order) == list(range(64))
    # 16 groups of 4 over the whole window: at least as good as the worst single micro-batch plan
    assert window_spread <= max(one_at_a_time) + 1e-12
