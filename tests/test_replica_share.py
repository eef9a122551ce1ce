"""What rides with a batch: the sampler's ReplicaShare (this replica's indices and what the plan
predicted for them, with the cost model that planned them) goes through the read, a loader worker
and the batch's tag to the profiler's step line.

Real pieces: Megatron Bridge's sampler, torch's DataLoader with a worker process, the planner over a
cost index, the profiler's Recorder; no ranks are started.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mimo_accel.config import AccelConfig
from mimo_accel.costs import CostIndex, CostModel
from mimo_accel.costs.resize import FixedPatches
from mimo_accel.modules import Modules
from mimo_accel.planner import CostIndexPlanner
from mimo_accel.profiler.run import read_run
from mimo_accel.runtime.measuring.calibration import WindowModel
from mimo_accel.runtime.measuring.profiling import Profiling, planned_spreads
from mimo_accel.runtime.reading.sampler import ShardedBatchSampler, ShareRules, tagged_loader
from mimo_accel.runtime.context import ShardContext
from mimo_accel.runtime.reading.shard import SHARD_TAG_KEY, ReplicaShare, tag_for
from mimo_accel.runtime.state import Runtime

DPS = {"vision": 2, "language": 4}
CTX = ShardContext("vision", 1, 2, 4, DPS)


def _profiling(tmp_path) -> Runtime:
    runtime = Runtime(AccelConfig(profile=str(tmp_path)))
    runtime.context = CTX
    runtime.profiling = Profiling(runtime)
    return runtime


def _collate(samples):
    return {"input_ids": torch.tensor(samples)}


def test_the_plan_rides_from_the_sampler_through_a_worker_to_the_step_line(tmp_path):
    from megatron.bridge.data import samplers

    n, mbs = 64, 16
    rng = np.random.default_rng(3)
    items = rng.integers(0, 3, n)
    rows = np.where(items > 0, rng.integers(1, 400, n), 0)
    index = CostIndex(rng.integers(16, 1024, n), {"vision": (items, rows, rows * rows, FixedPatches(1))})
    planner = CostIndexPlanner(index, CostModel(), Modules.from_dp_sizes(DPS))
    model = WindowModel(CostModel(), "digest-7", {"language": 0.5})  # online calibration's, for every window
    upstream = samplers.MegatronPretrainingSampler(total_samples=n, consumed_samples=0, micro_batch_size=mbs,
                                                   data_parallel_rank=0, data_parallel_size=1, drop_last=True)
    sampler = ShardedBatchSampler(upstream, CTX, planner, window=2, in_process=False,
                                  models=lambda first_micro_batch: model)
    source = torch.utils.data.DataLoader(list(range(n)), batch_size=mbs, num_workers=1, collate_fn=_collate)
    want, _, _ = ShareRules(CTX, 2).plan(planner, [list(range(0, mbs)), list(range(mbs, 2 * mbs))], model)

    runtime = _profiling(tmp_path)
    batches = iter(tagged_loader(source, CTX, sampler))
    for planned in want:  # the first step: one window of two micro-batches
        batch = next(batches)
        share = batch.pop(SHARD_TAG_KEY).share
        assert share.indices == planned.indices == tuple(batch["input_ids"].tolist())  # what was read
        assert (share.spread, share.spreads) == (planned.spread, planned.spreads) and share.spread >= 1.0
        assert share.cost_model == "digest-7" and share.overheads == {"language": 0.5}
        assert {m: v.tolist() for m, v in share.loads.items()} == {m: v.tolist() for m, v in planned.loads.items()}
        runtime.profiling.record_batch(batch, read_samples=len(share.indices), tag=tag_for(CTX, mbs // 4, share))
    runtime.profiling.end_step()
    runtime.close()
    step = read_run(tmp_path).ranks[0].steps[0]
    step_loads = {m: want[0].loads[m] + want[1].loads[m] for m in DPS}
    assert step["predicted_spreads"] == pytest.approx(planned_spreads(step_loads, {"language": 0.5}))
    assert step["cost_model"] == "digest-7" and "plan_wait_s" in step


def test_the_step_straggler_is_the_spread_of_the_planned_loads_summed_over_the_step(tmp_path):
    runtime = _profiling(tmp_path)
    batch = {"input_ids": torch.zeros(2, 4, dtype=torch.long)}
    loads = ({"vision": np.array([3.0, 1.0]), "language": np.array([2.0, 2.0, 1.0, 3.0])},
             {"vision": np.array([1.0, 3.0]), "language": np.array([1.0, 3.0, 2.0, 2.0])})
    for micro in loads:
        share = ReplicaShare((0, 1), spread=1.5, spreads={"vision": 1.5, "language": 1.5}, loads=micro,
                             overheads={"language": 2.0}, cost_model="digest-7")
        runtime.profiling.record_batch(batch, read_samples=2, tag=tag_for(CTX, 2, share))
    runtime.profiling.end_step()
    runtime.close()
    step = read_run(tmp_path).ranks[0].steps[0]
    # vision sums to [4, 4]: even; language to [3, 5, 3, 5], plus 2 s of overhead each: 7 / 6
    assert step["predicted_spreads"] == pytest.approx({"vision": 1.0, "language": 7 / 6})
    assert step["predicted_spread"] == pytest.approx(7 / 6) and step["cost_model"] == "digest-7"
