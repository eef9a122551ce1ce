"""Exchange mode on real gloo ranks: after one ragged all_to_all every replica holds exactly the
joint plan's samples (every module balanced, as plan-before-read plans them; computed here from the
same costs), nothing lost or duplicated, the
bytes moved are the planned bytes, vision and language agree group by group, 0/1/N-image samples
arrive intact, a failing cost function stops every rank, and overlap changes nothing but timing.
"""

from __future__ import annotations

import itertools
import math
import os

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as hs

from mimo_accel.runtime.reading import exchange as ex
from mimo_accel_dev.rehearse import stack as st
from mimo_accel.costs import CostIndex, CostModel
from mimo_accel.costs.resize import FixedPatches
from mimo_accel.planner import CostIndexPlanner, plan_costs
from mimo_accel.grid import owned_groups, replica_samples
from mimo_accel.runtime.context import ShardContext
from mimo_accel.runtime.reading.shard import SHARD_TAG_KEY
from mimo_accel_dev.rehearse.ranks import LANGUAGE, VISION, Modules, layout_of, module, run_ranks
from tests._hypothesis import examples

MICRO_BATCH = 16
STEPS = 3
WORLD = 8
DATASET = dict(seq_length=64, patch_dim=24, vocab_size=2048)
# dp 2 and 4 on both modules; the third has two vision DP groups (tp 2) exchanging side by side.
LAYOUTS = {
    "v2-l4": layout_of(2, 4),
    "v4-l2": layout_of(4, 2),
    "v2tp2-l4": Modules.of(module(VISION, 2, tp=2), module(LANGUAGE, 4)),
    "v4-l4": layout_of(4, 4),
    "v1-l2": layout_of(1, 2),  # fan-out: the single vision replica reorders locally
}
BAD_SAMPLE = 5  # global micro-batch 0 holds it; exactly one replica per module reads it


def _dataset(n=MICRO_BATCH * (STEPS + 2)):
    return st.SyntheticVLMDataset(n, st.VariedSpec(), **DATASET)


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


class _RaiseOn:
    def __init__(self, sample_id, ctx):
        self.sample_id = sample_id
        self.inner = ex.DecodedModuleCosts(list(ctx.dp_sizes))

    def __call__(self, sample):
        if sample["sample_id"] == self.sample_id:
            raise KeyError(f"boom at sample {self.sample_id}")
        return self.inner(sample)


class _NaNOn(_RaiseOn):
    def __call__(self, sample):
        return math.nan if sample["sample_id"] == self.sample_id else self.inner(sample)


# ----------------------------------------------------------------------------------------------
# Rank side
# ----------------------------------------------------------------------------------------------


def _shards(ctx, ds, steps=STEPS):
    out = []
    for step in range(steps):
        ids = list(range(step * MICRO_BATCH, (step + 1) * MICRO_BATCH))
        out.append([ds[i] for i in replica_samples(ids, ctx.dp_rank, ctx.dp_size, ctx.grid)])
    return out


def _upstream_loader(ds):
    from megatron.bridge.data import samplers

    build = getattr(samplers.build_pretraining_data_loader, "__wrapped__", samplers.build_pretraining_data_loader)
    return build(ds, 0, "single", MICRO_BATCH, 0, True, collate_fn=st.collate, pin_memory=False,
                 data_parallel_rank=0, data_parallel_size=1, drop_last=True)


def _expect_error(fn):
    try:
        fn()
    except ex.ExchangeError as exc:
        return str(exc)
    return None


def _exchange_scenarios(rank, world, layouts):
    from mimo_accel.runtime.context import context_from_grids
    from mimo_accel_dev.rehearse.ranks import build_grids, parallelism_config

    ds = _dataset()
    out = {}
    for name, layout in layouts.items():
        grids = build_grids(layout)
        ctx, _ = context_from_grids(parallelism_config(layout), grids)
        if ctx is None:
            continue
        pg = grids[ctx.module].get_pg(["dp"])
        exchange = ex.ExchangeReorder(pg, ctx, collate_fn=st.collate)
        steps = []
        for shard in _shards(ctx, ds):
            before = [s["sample_id"] for s in shard]
            after, stats = exchange.reorder(shard)
            steps.append(dict(before=before, after=[s["sample_id"] for s in after], stats=stats,
                              intact=all(_same(s, ds[s["sample_id"]]) for s in after),
                              kept_same_object=all(any(a is b for b in shard) for a in after
                                                   if a["sample_id"] in before)))
        # The loader path: collated and tagged batches, same samples as reorder().
        seen = []
        batches = [(b[st.SAMPLE_ID_KEY].tolist(), b[SHARD_TAG_KEY])
                   for b in ex.ExchangeLoader(_shards(ctx, ds), exchange, on_exchange=seen.append)]
        # On top of an upstream loader (global sampler, dp_size=1), as the loader hook would build it.
        shard_loader = ex.exchange_shard_loader(_upstream_loader(ds), ctx, MICRO_BATCH, pg)
        from_upstream = [b[st.SAMPLE_ID_KEY].tolist() for b in itertools.islice(shard_loader, STEPS)]
        # Overlapped: a side thread exchanges on its own group; same result.
        overlapped_ex = ex.ExchangeReorder(pg, ctx, collate_fn=st.collate, overlap=True)
        assert overlapped_ex.comm_group is not pg
        overlapped = [b[st.SAMPLE_ID_KEY].tolist() for b in ex.ExchangeLoader(_shards(ctx, ds), overlapped_ex,
                                                                              prefetch=2)]
        # Failures: raise on one replica, NaN on one replica, raise inside the overlap thread.
        shard0 = _shards(ctx, ds, 1)[0]
        raised = _expect_error(lambda: ex.ExchangeReorder(pg, ctx, _RaiseOn(BAD_SAMPLE, ctx)).reorder(shard0))
        nan = _expect_error(lambda: ex.ExchangeReorder(pg, ctx, _NaNOn(BAD_SAMPLE, ctx)).reorder(shard0))
        overlap_err = _expect_error(lambda: list(ex.ExchangeLoader(
            [shard0], ex.ExchangeReorder(pg, ctx, _RaiseOn(BAD_SAMPLE, ctx), st.collate, comm_group=overlapped_ex.comm_group,
                                         overlap=True))))
        # ... and the group still works afterwards (nobody was left inside a collective).
        again = [s["sample_id"] for s in exchange.reorder(shard0)[0]]
        # Overlap refused with CUDA_DEVICE_MAX_CONNECTIONS=1, before anything collective.
        os.environ[ex.OVERLAP_ENV] = "1"
        try:
            refused = _expect_error(lambda: ex.ExchangeReorder(pg, ctx, overlap=True))
        finally:
            del os.environ[ex.OVERLAP_ENV]
        out[name] = dict(module=ctx.module, dp_rank=ctx.dp_rank, dp_size=ctx.dp_size, grid=ctx.grid, dps=ctx.dp_sizes,
                         group_ranks=list(exchange.ranks), steps=steps, batches=batches,
                         seen=len(seen), overlapped=overlapped, from_upstream=from_upstream, raised=raised, nan=nan,
                         overlap_err=overlap_err, again=again, refused=refused)
    return out


# ----------------------------------------------------------------------------------------------
# Parent side: the expected plan from the same costs
# ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def results():
    return run_ranks(_exchange_scenarios, WORLD, LAYOUTS, deadline_s=400)


def _expected(step, dps, dp_size):
    ds = _dataset()
    ids = list(range(step * MICRO_BATCH, (step + 1) * MICRO_BATCH))
    cost = ex.DecodedModuleCosts(list(dps))
    costs = [cost(ds[i]) for i in ids]
    sizes = [ex.serialized_size(ds[i]) for i in ids]
    order, _ = plan_costs({m: np.array([c[m] for c in costs]) for m in dps}, dps)
    n = MICRO_BATCH // dp_size
    local = [[ids[p] for p in order[r * n:(r + 1) * n]] for r in range(dp_size)]
    owner_after = {ids[p]: k // n for k, p in enumerate(order)}
    moved = [i for k, i in enumerate(ids) if owner_after[i] != k // n]
    return local, moved, {i: s for i, s in zip(ids, sizes)}


def _ranks(results, name, module=None):
    rs = [r[name] for r in results if name in r]
    return [r for r in rs if module is None or r["module"] == module]


@pytest.mark.distributed
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_every_rank_holds_exactly_the_planned_samples(results, name):
    ranks = _ranks(results, name)
    assert len(ranks) == LAYOUTS[name].world_size
    for r in ranks:
        for step, got in enumerate(r["steps"]):
            local, _, _ = _expected(step, r["dps"], r["dp_size"])
            assert got["after"] == local[r["dp_rank"]], (r["module"], r["dp_rank"], step)


@pytest.mark.distributed
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_union_is_the_global_micro_batch_without_duplicates(results, name):
    for module in (VISION, LANGUAGE):
        for group in {tuple(r["group_ranks"]) for r in _ranks(results, name, module)}:
            members = [r for r in _ranks(results, name, module) if tuple(r["group_ranks"]) == group]
            for step in range(STEPS):
                union = [i for r in members for i in r["steps"][step]["after"]]
                assert sorted(union) == list(range(step * MICRO_BATCH, (step + 1) * MICRO_BATCH))


@pytest.mark.distributed
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_bytes_moved_equal_the_planned_bytes(results, name):
    for module in (VISION, LANGUAGE):
        members = _ranks(results, name, module)
        groups = {tuple(r["group_ranks"]) for r in members}
        for group in groups:
            group_members = [r for r in members if tuple(r["group_ranks"]) == group]
            for step in range(STEPS):
                _, moved, sizes = _expected(step, group_members[0]["dps"], group_members[0]["dp_size"])
                planned = sum(sizes[i] for i in moved)
                assert planned > 0 or group_members[0]["dp_size"] == 1
                stats = [r["steps"][step]["stats"] for r in group_members]
                assert sum(s.bytes_sent for s in stats) == planned
                assert sum(s.bytes_received for s in stats) == planned
                assert all(s.bytes_moved == planned and s.samples_moved == len(moved) for s in stats)
                for r in group_members:
                    st_ = r["steps"][step]
                    leaving = [i for i in st_["before"] if i not in st_["after"]]
                    arriving = [i for i in st_["after"] if i not in st_["before"]]
                    assert st_["stats"].bytes_sent == sum(sizes[i] for i in leaving)
                    assert st_["stats"].bytes_received == sum(sizes[i] for i in arriving)
                    assert st_["stats"].predicted_spread <= st_["stats"].baseline_spread


@pytest.mark.distributed
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_vision_and_language_agree_group_by_group(results, name):
    def groups_of(module):
        out = {}
        for r in _ranks(results, name, module):
            per = MICRO_BATCH // r["grid"]
            for step, got in enumerate(r["steps"]):
                for j, g in enumerate(owned_groups(r["dp_rank"], r["dp_size"], r["grid"])):
                    key = (step, g)
                    value = got["after"][j * per:(j + 1) * per]
                    assert out.setdefault(key, value) == value  # several DP groups (tp>1) agree too
        return out

    vision, language = groups_of(VISION), groups_of(LANGUAGE)
    assert vision == language and len(vision) == STEPS * LAYOUTS[name].grid


@pytest.mark.distributed
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_zero_one_and_many_image_samples_arrive_intact(results, name):
    ds = _dataset()
    images = set()
    for r in _ranks(results, name):
        for got in r["steps"]:
            assert got["intact"] and got["kept_same_object"]
            images.update(int(ds[i]["grid_thw"].size(0)) for i in got["after"])
    assert {0, 1} <= images and max(images) >= 2


@pytest.mark.distributed
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_loader_yields_tagged_batches_and_overlap_gives_the_same_result(results, name):
    for r in _ranks(results, name):
        afters = [got["after"] for got in r["steps"]]
        assert [ids for ids, _ in r["batches"]] == afters
        assert r["overlapped"] == afters
        assert r["from_upstream"] == afters
        assert r["seen"] == STEPS
        for ids, tag in r["batches"]:
            assert (tag.module, tag.dp_rank, tag.dp_size, tag.grid, tag.samples) == (
                r["module"], r["dp_rank"], r["dp_size"], r["grid"], len(ids))


@pytest.mark.distributed
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_failing_cost_function_stops_every_rank_with_a_clear_error(results, name):
    for module in (VISION, LANGUAGE):
        members = _ranks(results, name, module)
        for r in members:
            holder = [m["dp_rank"] for m in members
                      if BAD_SAMPLE in replica_samples(list(range(MICRO_BATCH)), m["dp_rank"], m["dp_size"], m["grid"])]
            assert r["raised"] and f"replica(s) [{holder[0]}]" in r["raised"]
            assert "boom at sample 5" in r["raised"] and "KeyError" in r["raised"]
            assert r["nan"] and "returned nan" in r["nan"] and "finite" in r["nan"]
            assert r["overlap_err"] and "boom at sample 5" in r["overlap_err"]
            assert r["again"] == r["steps"][0]["after"]  # the group is still in step afterwards


@pytest.mark.distributed
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_overlap_refused_when_cuda_device_max_connections_is_1(results, name):
    for r in _ranks(results, name):
        assert r["refused"] and "CUDA_DEVICE_MAX_CONNECTIONS=1" in r["refused"] and "overlap=False" in r["refused"]


def test_overlap_refused_before_anything_collective(monkeypatch):
    monkeypatch.setenv(ex.OVERLAP_ENV, "1")
    ctx = ShardContext(VISION, 0, 2, 2)
    with pytest.raises(ex.ExchangeError, match="CUDA_DEVICE_MAX_CONNECTIONS=1"):
        ex.ExchangeReorder(object(), ctx, overlap=True)  # never touches the (bogus) group


# ----------------------------------------------------------------------------------------------
# Pure parts: codec, cost, plan
# ----------------------------------------------------------------------------------------------


def test_codec_round_trips_varied_samples_and_sizes_are_exact():
    ds = _dataset(64)
    counts = set()
    for i in range(64):
        s = ds[i]
        b = ex.encode_sample(s)
        back, end = ex.decode_sample(b)
        assert end == len(b) == ex.serialized_size(s)
        assert _same(back, s)
        counts.add(int(s["grid_thw"].size(0)))
    assert {0, 1, 2, 3} <= counts


def test_codec_handles_odd_tensors_and_refuses_sparse():
    x = {"scalar": torch.tensor(3.5), "empty": torch.zeros(0, 3, dtype=torch.long),
         "nested": [torch.ones(2, dtype=torch.bool), (torch.arange(6).view(2, 3).t(), "text", 7)],
         "bf16": torch.tensor([1.5], dtype=torch.bfloat16), "np": np.arange(3),
         "grad": torch.ones(2, requires_grad=True)}
    back, _ = ex.decode_sample(ex.encode_sample(x))
    assert _same({k: v for k, v in back.items() if k not in ("np", "grad")},
                 {k: v for k, v in x.items() if k not in ("np", "grad")})
    assert np.array_equal(back["np"], x["np"]) and torch.equal(back["grad"], x["grad"].detach())
    with pytest.raises(TypeError, match="sparse"):
        ex.encode_sample({"s": torch.eye(2).to_sparse()})


def test_decoded_cost_reads_grid_thw_where_bridge_puts_it():
    model = CostModel(a=1.0, b=0.5, modules={"language": {"a": 1.0, "b": 0.25}})
    cost = ex.DecodedModuleCosts(["vision", "language"], model)
    grid = torch.tensor([[1, 2, 4], [2, 2, 2]])  # two images of 8 rows
    flat = {"grid_thw": grid, "attention_mask": torch.tensor([1, 1, 1, 0])}
    nested = {"modality_inputs": {"vision": {"pixel_values": torch.zeros(1), "image_grid_thw": grid}},
              "input_ids": torch.zeros(4, dtype=torch.long)}
    assert cost(flat) == pytest.approx({"vision": 16 + 0.5 * 128, "language": 3 + 0.25 * 9})
    assert cost(nested) == pytest.approx({"vision": 16 + 0.5 * 128, "language": 4 + 0.25 * 16})
    assert cost({"attention_mask": torch.ones(5)}) == pytest.approx({"vision": 0.0, "language": 5 + 0.25 * 25})
    with pytest.raises(ValueError, match="malformed grid_thw"):
        cost({"grid_thw": torch.tensor([1, 2, 3])})


def test_decoded_costs_price_every_module_by_its_own_inputs():
    model = CostModel(modules={"vision": {"a": 1.0, "b": 0.5, "k": 2.0}, "audio": {"a": 3.0, "b": 0.0},
                               "language": {"a": 1.0, "b": 0.125}})
    sample = {"modality_inputs": {"vision": {"image_grid_thw": torch.tensor([[1, 2, 4], [2, 2, 2]])},
                                  "audio": {"grid_thw": torch.tensor([[1, 1, 5]])}},
              "attention_mask": torch.tensor([1, 1, 1, 1, 0])}
    costs = ex.DecodedModuleCosts(["vision", "audio", "language"], model)(sample)
    assert costs == {"vision": 16 + 0.5 * 128 + 2 * 2, "audio": 15.0, "language": 4 + 0.125 * 16}
    # one encoder: its grid_thw is found anywhere in the sample, as Bridge's batches carry it
    one = ex.DecodedModuleCosts(["vision", "language"], model)
    assert one({"grid_thw": torch.tensor([[1, 2, 4]]), "input_ids": torch.zeros(3, dtype=torch.long)}) == {
        "vision": 8 + 0.5 * 64 + 2.0, "language": 3 + 0.125 * 9}


@pytest.mark.parametrize("dps", [{"vision": 2, "language": 2}, {"vision": 4, "language": 2},
                                 {"vision": 2, "language": 4}, {"vision": 2, "audio": 1, "language": 4}])
def test_exchange_plans_every_module_as_plan_before_read_does(dps):
    rng = np.random.default_rng(sum(dps.values()))
    n = 64
    encoders = {m: (rng.integers(0, 4, n), rng.integers(1, 3000, n)) for m in dps if m != "language"}
    index = CostIndex(rng.integers(16, 2048, n), {
        m: (np.where(rows > 0, items, 0), rows * (items > 0), (rows * (items > 0)) ** 2, FixedPatches(1))
        for m, (items, rows) in encoders.items()})
    planner = CostIndexPlanner(index, CostModel(), Modules.from_dp_sizes(dps))
    indices = list(range(n))
    costs = planner.costs(indices)
    plan = ex.route_exchange(costs, [100] * n, dps["vision"], Modules.from_dp_sizes(dps).grid, dps)
    order, predicted = planner(indices)
    spreads = predicted.spreads
    assert list(plan.order) == order
    assert dict(plan.predicted_spreads) == spreads and set(spreads) == set(dps)
    assert plan.predicted_spread <= plan.baseline_spread  # the worst module: never worse than contiguous


@settings(max_examples=examples(60), deadline=None)
@given(hs.sampled_from([(1, 1), (1, 2), (2, 2), (2, 4), (4, 4), (4, 8)]), hs.integers(1, 3), hs.data())
def test_plan_covers_every_sample_once_and_its_flows_add_up(shape, per_group, data):
    n_ranks, grid = shape
    n = grid * per_group
    dps = {"vision": n_ranks, "language": grid}
    costs = {m: data.draw(hs.lists(hs.floats(0, 1e4, allow_nan=False), min_size=n, max_size=n)) for m in dps}
    sizes = data.draw(hs.lists(hs.integers(8, 10_000), min_size=n, max_size=n))
    plan = ex.route_exchange(costs, sizes, n_ranks, grid, dps)
    assert list(plan.order) == plan_costs({m: np.asarray(c) for m, c in costs.items()}, dps)[0]
    held = [p for r in range(n_ranks) for p in plan.local_after(r)]
    assert sorted(held) == list(range(n))
    for r in range(n_ranks):
        assert sorted(p for s in range(n_ranks) for p in plan.incoming(r, s)) == sorted(plan.local_after(r))
        for d in range(n_ranks):
            if d != r:
                assert plan.send_bytes(r)[d] == plan.recv_bytes(d)[r]
    assert sum(sum(plan.send_bytes(r)) for r in range(n_ranks)) == plan.bytes_moved
    assert plan.bytes_moved == sum(sizes[p] for p in plan.moved())


def test_plan_refuses_indivisible_shapes():
    with pytest.raises(ValueError, match="multiple of the DP size"):
        ex.route_exchange({"vision": [1.0] * 6}, [8] * 6, 4, 6, {"vision": 6})
    with pytest.raises(ValueError, match="canonical grid G=4"):
        ex.route_exchange({"vision": [1.0] * 6}, [8] * 6, 2, 4, {"vision": 4})
