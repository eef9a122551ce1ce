"""What a plan depends on is the same everywhere, and windows stay inside a training step.

- every data-loading rank compares digests of its plan inputs (cost index, cost model, options,
  dataset, sampler) when its loaders are built; a rank with a different cost index stops the job
  with an error naming the ranks on each side (real gloo ranks, Bridge's own loaders);
- each split (train, validation, test) gets its own cost index;
- a reorder window must tile the micro-batches of a step, and never starts mid-window on resume.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from mimo_accel.runtime.reading import plan_inputs
from mimo_accel_dev.rehearse import stack as st
from mimo_accel.costs import CostIndex, ResizeRule
from mimo_accel.datasets.split_index import cost_index_for, index_digest
from mimo_accel.runtime.reading.sampler import ShardedBatchSampler
from mimo_accel.runtime.context import ShardContext
from mimo_accel_dev.rehearse.ranks import RankFailure, build_grids, layout_of, loader_config, run_ranks


def _index(n: int, seed: int) -> CostIndex:
    rng = np.random.default_rng(seed)
    p = rng.integers(1, 50, n)
    return CostIndex(rng.integers(1, 9, n), {"vision": (np.ones(n, int), p, p * p, ResizeRule())})


def test_mismatches_name_the_ranks_on_each_side():
    rows = [{"cost index": "a", "options": "x"}, {"cost index": "a", "options": "x"},
            {"cost index": "b", "options": "x"}]
    assert plan_inputs.mismatches(rows, [0, 1, 5]) == ["cost index: ranks [0, 1] have a; ranks [5] have b"]
    assert plan_inputs.mismatches(rows[:2], [0, 1]) == []


def test_index_digest_sees_any_change():
    a, b = _index(32, 0), _index(32, 0)
    assert index_digest(a) == index_digest(b)
    every = np.arange(32)
    p = a.rows("vision", every).copy()
    p[7] += 1
    sq = np.maximum(p * p, a.sq_rows("vision", every))
    c = CostIndex(a.tokens(every), {"vision": (a.items("vision", every), p, sq, ResizeRule())})
    assert index_digest(c) != index_digest(a)


def test_one_cost_index_per_split(tmp_path):
    ds = type("DS", (), {"__len__": lambda self: 16})()
    for split, seed in (("train", 1), ("validation", 2)):
        _index(16, seed).save(tmp_path / f"costs-{split}.npz")
    template = str(tmp_path / "costs-{split}.npz")
    train, valid = cost_index_for(ds, template, "train"), cost_index_for(ds, template, "validation")
    assert index_digest(train) == index_digest(_index(16, 1))
    assert index_digest(valid) == index_digest(_index(16, 2))
    # a plain path is the train split's only: the validation split is not costed with it
    plain = str(tmp_path / "costs-train.npz")
    assert index_digest(cost_index_for(ds, plain, "train")) == index_digest(train)
    with pytest.raises(ValueError, match=r"(?s)Three ways out.*train split's.*\{split\}.*validation split"):
        cost_index_for(ds, plain, "validation")


class _Sampler(list):
    """Stands for upstream's batch sampler (a list of global micro-batches plus its attributes)."""

    def __init__(self, batches, consumed, mbs):
        super().__init__(batches)
        self.consumed_samples, self.micro_batch_size = consumed, mbs


def test_windowed_plans_stay_in_their_step_and_resume_exactly():
    from mimo_accel.costs import CostModel
    from mimo_accel.modules import Modules
    from mimo_accel.planner import CostIndexPlanner

    mbs, step_mbs, steps = 4, 2, 4
    index = _index(mbs * step_mbs * steps, 3)
    batches = [list(range(i * mbs, (i + 1) * mbs)) for i in range(step_mbs * steps)]
    ctx = ShardContext("vision", 0, 1, 1, {"vision": 1, "language": 1})
    planner = CostIndexPlanner(index, CostModel(), Modules.from_dp_sizes({"vision": 1, "language": 1}))
    whole = list(ShardedBatchSampler(_Sampler(batches, 0, mbs), ctx, planner, window=step_mbs))
    for s in range(steps):  # each step trains exactly its own samples
        got = sorted(i for b in whole[s * step_mbs:(s + 1) * step_mbs] for i in b.indices)
        assert got == list(range(s * mbs * step_mbs, (s + 1) * mbs * step_mbs))
    # resume at step 2 (upstream's sampler then starts at consumed = 2 steps): the same batches
    consumed = 2 * step_mbs * mbs
    resumed = list(ShardedBatchSampler(_Sampler(batches[2 * step_mbs:], consumed, mbs), ctx, planner,
                                       window=step_mbs))
    assert [b.indices for b in resumed] == [b.indices for b in whole[2 * step_mbs:]]
    with pytest.raises(ValueError, match="not the start of a window"):
        list(ShardedBatchSampler(_Sampler(batches[3:], 3 * mbs, mbs), ctx, planner, window=step_mbs))


def _build_with_index(rank, world, index_path_for_rank):
    import mimo_accel

    layout = layout_of(2, 1)
    grids = build_grids(layout)
    mimo_accel.enable(sharded_reads=True, reorder=True, cost_index=index_path_for_rank[rank])
    from megatron.bridge.data.megatron_mimo.loaders import build_megatron_mimo_data_loaders  # after enable
    provider = st.build_provider(st.StackConfig(layout=layout))
    provider._grids = grids
    cfg = loader_config(provider, 4)
    data = st.make_data_provider(lambda n: st.SyntheticVLMDataset(n, st.uniform_spec(), seq_length=32,
                                                                 patch_dim=24, vocab_size=256))
    train, _, _ = build_megatron_mimo_data_loaders(cfg, SimpleNamespace(consumed_train_samples=0), data, 32, 0, 0)
    first = next(iter(train))[st.SAMPLE_ID_KEY].tolist()
    mimo_accel.disable()
    return first


@pytest.mark.distributed
def test_a_rank_with_another_cost_index_stops_the_job_naming_the_ranks(tmp_path):
    same, other = tmp_path / "same.npz", tmp_path / "other.npz"
    _index(32, 0).save(same)
    _index(32, 1).save(other)
    # the same index everywhere: loaders build and read
    out = run_ranks(_build_with_index, 3, {0: str(same), 1: str(same), 2: str(same)}, deadline_s=180)
    assert sorted(out[0] + out[1]) == sorted(out[2])  # vision replicas 0+1 = the language replica
    # rank 2 (the language rank) has another file: an error naming both sides, never a mis-pairing
    with pytest.raises(RankFailure, match=r"cost index: ranks \[0, 1\] have \w+; ranks \[2\] have \w+"):
        run_ranks(_build_with_index, 3, {0: str(same), 1: str(same), 2: str(other)}, deadline_s=180)


def _plan(tmp_path, index: CostIndex, dp_sizes: dict):
    from mimo_accel.config import AccelConfig
    from mimo_accel.runtime.patches.loaders import loader_order_for
    from mimo_accel.runtime.state import Runtime

    path = tmp_path / "costs.npz"
    index.save(path)
    ds = type("DS", (), {"__len__": lambda self: len(index)})()
    first = next(iter(dp_sizes))
    ctx = ShardContext(first, 0, dp_sizes[first], 4, dp_sizes)
    runtime = Runtime(AccelConfig(reorder=True, cost_index=str(path)))
    return loader_order_for(ds, [0, "single", 4], ctx, "train", runtime, 4), runtime


def test_the_plan_prices_every_module_of_the_layout(tmp_path):
    rng = np.random.default_rng(0)
    n = 16
    audio = rng.integers(0, 2, n)
    patches = rng.integers(1, 2500, n)  # one image each: Σp² = p²
    index = CostIndex(rng.integers(1, 90, n), {
        "vision": (np.ones(n, int), patches, patches * patches, ResizeRule()),
        "audio": (audio, audio * 1500, audio * 1500 ** 2, ResizeRule())})
    plan, _ = _plan(tmp_path, index, {"vision": 2, "audio": 4, "language": 4})
    assert plan.planner.modules.names == ("vision", "audio", "language")
    order, predicted = plan.planner(list(range(n)))
    spreads = predicted.spreads
    assert sorted(order) == list(range(n)) and set(spreads) == {"vision", "audio", "language"}


def test_a_layout_encoder_the_index_cannot_price_stops_the_plan_naming_both_sides(tmp_path):
    # the failure: the image plan applied to the audio replicas, silently; now an error
    with pytest.raises(ValueError, match=r"prices the encoders \['vision'\], the layout's encoders are "
                                         r"\['vision', 'audio'\].*nothing in the index prices \['audio'\]"):
        _plan(tmp_path, _index(16, 0), {"vision": 2, "audio": 2, "language": 4})
    # one encoder on each side: used for it, said once
    plan, runtime = _plan(tmp_path, _index(16, 0), {"images": 2, "language": 4})
    assert set(plan.planner(list(range(16)))[1].spreads) == {"images", "language"}
    assert any("'vision' prices the layout's one encoder 'images'" in m for m in runtime.notices().values())
