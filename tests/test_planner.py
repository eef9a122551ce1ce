"""Plan-before-read planning and the sharded sampler, without processes (pure parts).

Every module's replicas must derive the same plan: what an encoder replica reads equals what its
language peers read, for 1:1, fan-in, fan-out and windows of several micro-batches. The planner
balances every module of the layout (each encoder by its own column, the language model by its
real tokens) and predicts each module's spread.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st_

from mimo_accel.balance import balance_modules, contiguous_order, module_spreads
from mimo_accel.balance.step_schedule import step_time
from mimo_accel.costs import AudioRule, CostIndex, CostModel, ResizeRule
from mimo_accel.costs.index import IndexModulesError
from mimo_accel.grid import canonical_grid
from mimo_accel.modules import Modules
from mimo_accel.planner import CostIndexPlanner
from mimo_accel.runtime.reading.sampler import ShardedBatchSampler
from mimo_accel.runtime.context import ShardContext
from mimo_accel.workloads import load_profile
from tests._hypothesis import examples

AUDIO = AudioRule(sampling_rate=16000, hop_length=160, max_samples=480000)  # variable length up to 30 s


def _index(n: int, seed: int) -> CostIndex:
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 4, n)
    per_image = [rng.integers(4, 400, k) for k in images]
    return CostIndex(rng.integers(10, 500, n), {"vision": (images, [int(p.sum()) for p in per_image],
                                                           [int((p * p).sum()) for p in per_image], ResizeRule())})


def _audio_columns(n: int, seed: int, present: float = 0.6):
    """Clips per sample (0, 1 or 2, each 0.5-30 s long) as the audio probe records them."""
    rng = np.random.default_rng(seed)
    clips = np.where(rng.random(n) < present, rng.integers(1, 3, n), 0)
    rows = np.zeros(n, np.int64)
    sq = np.zeros(n, np.int64)
    for i, k in enumerate(clips):
        r = AUDIO.rows_many(rng.integers(8000, 480000, k))
        rows[i], sq[i] = r.sum(), (r * r).sum()
    return clips, rows, sq


def _workload(n: int, seed: int, encoders=("vision",), profile="mixed_chat") -> CostIndex:
    """A generated workload: a shipped profile's images and tokens, and an audio column."""
    base = load_profile(profile).cost_index(n, seed)
    every = np.arange(n)
    cols = {}
    for name in encoders:
        if name == "audio":
            items, rows, sq = _audio_columns(n, seed + 1)
            cols[name] = (items, rows, sq, AUDIO)
        else:
            cols[name] = (base.items("vision", every), base.rows("vision", every),
                          base.sq_rows("vision", every), base.rule_of("vision"))
    tokens = base.tokens(every)
    if "audio" in cols:  # each clip's placeholders are language tokens too
        tokens = tokens + 64 * cols["audio"][0]
    return CostIndex(tokens, cols)


def _contexts(vdp: int, ldp: int):
    g = canonical_grid([vdp, ldp])
    sizes = {"vision": vdp, "language": ldp}
    return [ShardContext(m, r, d, g, sizes) for m, d in sizes.items() for r in range(d)]


def _read(vdp, ldp, batches, index, window=1):
    out = {}
    for ctx in _contexts(vdp, ldp):
        planner = CostIndexPlanner(index, CostModel(), ctx.modules)
        # the plan on the planner thread itself: forking a planner per replica and example would be the
        # test's time (the forked planner: tests/test_plan_ahead.py)
        shares = ShardedBatchSampler(batches, ctx, planner, window=window, in_process=False)
        out[(ctx.module, ctx.dp_rank)] = [list(share.indices) for share in shares]
    return out


@settings(max_examples=examples(40), deadline=None)
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


LAYOUTS = {
    "1:1": {"vision": 4, "language": 4},
    "fan-in": {"vision": 4, "language": 2},
    "fan-out": {"vision": 2, "language": 8},
    "vision+audio 1:1": {"vision": 4, "audio": 4, "language": 4},
    "vision+audio fan-in": {"vision": 4, "audio": 2, "language": 2},
    "vision+audio fan-out": {"vision": 2, "audio": 4, "language": 8},
    "three dps": {"vision": 2, "audio": 3, "language": 4},
}


@pytest.mark.parametrize("layout", list(LAYOUTS), ids=list(LAYOUTS))
@pytest.mark.parametrize("profile", ["mixed_chat", "documents"])
def test_the_plan_balances_every_module_no_worse_than_contiguous(layout, profile):
    dps = LAYOUTS[layout]
    modules = Modules.from_dp_sizes(dps)
    per_replica = 8
    n = modules.grid * per_replica
    worst_plan, worst_contiguous = [], []
    for seed in range(4):
        index = _workload(n * 3, seed, encoders=[m.name for m in modules.encoders], profile=profile)
        model = CostModel()
        planner = CostIndexPlanner(index, model, modules)
        batch = list(range(n, 2 * n))  # a global micro-batch from the middle of the dataset
        order, predicted = planner(batch)
        spreads = predicted.spreads
        assert sorted(order) == batch
        costs = index.module_costs(np.asarray(batch), model, modules)
        assert set(costs) == set(dps) == set(spreads)
        # the predicted spreads are module_spreads of the plan it returns
        positions = [batch.index(i) for i in order]
        assert spreads == module_spreads(costs, dps, positions)
        contiguous = module_spreads(costs, dps, contiguous_order(n))
        assert max(spreads.values()) <= max(contiguous.values()) + 1e-12
        worst_plan.append(max(spreads.values()))
        worst_contiguous.append(max(contiguous.values()))
    # and on these workloads the plan is a real improvement
    assert np.median(worst_plan) < np.median(worst_contiguous)


def test_each_encoder_is_priced_by_its_own_column():
    modules = Modules.from_dp_sizes({"vision": 2, "audio": 2, "language": 2})
    index = _workload(64, 3, encoders=["vision", "audio"])
    model = CostModel(modules={"audio": {"a": 2.0, "b": 0.0, "k": 5.0}})
    costs = index.module_costs(np.arange(64), model, modules)
    every = np.arange(64)
    np.testing.assert_allclose(costs["audio"], 2.0 * index.rows("audio", every) + 5.0 * index.items("audio", every))
    np.testing.assert_allclose(costs["vision"], model.a * index.rows("vision", every) + model.b * index.sq_rows("vision", every))
    t = index.tokens(every).astype(float)
    np.testing.assert_allclose(costs["language"], t + t * t / 8192)
    # the audio plan is not the image plan: balancing audio by image costs would not be this good
    planner = CostIndexPlanner(index, model, modules)
    order, predicted = planner(list(range(64)))
    spreads = predicted.spreads
    image_only = CostIndexPlanner(index, model, Modules.from_dp_sizes({"vision": 2, "language": 1}))
    other, _ = image_only(list(range(64)))
    assert spreads["audio"] <= module_spreads(costs, modules.dp_sizes, other)["audio"] + 1e-12


def test_an_encoder_the_index_cannot_price_is_an_error_naming_both_sides():
    index = _workload(32, 0, encoders=["vision"])
    modules = Modules.from_dp_sizes({"vision": 2, "audio": 2, "language": 2})
    with pytest.raises(IndexModulesError, match=r"prices the encoders \['vision'\].*layout's encoders are "
                                                 r"\['vision', 'audio'\].*\['audio'\].*--module NAME"):
        CostIndexPlanner(index, CostModel(), modules)
    with pytest.raises(IndexModulesError, match=r"\['images', 'audios'\]"):
        index.module_costs([0, 1], CostModel(), Modules.from_dp_sizes({"images": 1, "audios": 1, "language": 1}))


def test_one_encoder_on_each_side_is_used_and_said_once():
    index = _workload(32, 0, encoders=["vision"])
    said = []
    planner = CostIndexPlanner(index, CostModel(), Modules.from_dp_sizes({"images": 2, "language": 2}),
                               notify=lambda key, msg: said.append((key, msg)))
    for _ in range(3):
        order, predicted = planner(list(range(16)))
        spreads = predicted.spreads
    assert set(spreads) == {"images", "language"}
    assert len({key for key, _ in said}) == 1 and "'vision' prices the layout's one encoder 'images'" in said[0][1]


def test_equal_costs_keep_the_contiguous_split_and_say_so():
    n = 8
    index = CostIndex([50] * n, {"vision": ([1] * n, [100] * n, [10_000] * n, ResizeRule())})
    said = []
    planner = CostIndexPlanner(index, CostModel(), Modules.from_dp_sizes({"vision": 2, "language": 2}),
                               notify=lambda key, msg: said.append(key))
    order, predicted = planner(list(range(n)))
    spreads = predicted.spreads
    assert order == list(range(n)) and spreads == {"vision": 1.0, "language": 1.0}
    assert said == ["reorder:equal-costs"]


def test_the_planner_needs_the_layouts_modules():
    with pytest.raises(TypeError, match="Modules"):
        CostIndexPlanner(_index(8, 0), CostModel(), 4)


def test_a_window_is_planned_for_the_step_the_pipeline_runs():
    index = _index(64, 5)
    model = CostModel()
    planner = CostIndexPlanner(index, model, Modules.from_dp_sizes({"vision": 4, "language": 4}))
    costs = index.module_costs(np.arange(64), model, planner.modules)
    # each micro-batch planned alone, its replicas even, in the sampler's micro-batch order
    one_at_a_time = [i * 16 + p for i in range(4) for p in balance_modules(
        {m: c[i * 16:(i + 1) * 16] for m, c in costs.items()}, planner.dps)]
    order, predicted = planner(list(range(64)), micro_batches=4)
    window_spreads = predicted.spreads
    assert sorted(order) == list(range(64))
    # samples move between the window's micro-batches: its modelled step is no longer than the
    # micro-batches planned one at a time, or the window's cells evened by balance_modules
    planned = step_time(costs, planner.dps, order, 4)
    assert planned <= step_time(costs, planner.dps, one_at_a_time, 4)
    assert planned <= step_time(costs, planner.dps, balance_modules(costs, planner.dps, 4), 4)
    assert window_spreads == module_spreads(costs, planner.dps, order, 4)
