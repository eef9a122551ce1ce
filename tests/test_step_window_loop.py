"""Upstream's validated shape on Bridge's loop: one image replica feeding two language replicas,
two-sample global micro-batches, several a step (the Qwen3.5-VL tutorial's images dp1 -> language
dp2, MBS 2; here GBS 8, so four micro-batches a step); and the same micro-batches 1:1 (dp2 -> dp2).

Planned one micro-batch at a time, every replica holds one sample of it or all of them, so no plan
can change a replica's load: mimo_accel says so once and names ``reorder_window="step"``. With
``"step"`` the plan moves samples between the step's micro-batches and replicas; with the per-token
loss that leaves each step's gradient as it was: the losses of every iteration (each after the
previous step's update) equal the one-micro-batch plan's, and each iteration trains the same
samples, paired across the modules.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mimo_accel_dev.rehearse.ranks import run_ranks

from ._example import run_example, steps_from_trace

pytestmark = pytest.mark.distributed

MBS, GBS, ITERS = 2, 8, 3
ALL = dict(sharded_reads=True, reorder=True, packing=True, calibrate_online=False)
DEADLINE_S = 150.0
RTOL = 1e-4  # reordering and packing change summation order


def _status(rank, world, argv, features, env):
    return run_example(argv, features, env)


def _run(workdir: Path, name: str, vision_dp: int, features: dict):
    trace = workdir / f"{name}.jsonl"
    argv = ["--cpu", "--varied", "--vision-dp", str(vision_dp), "--language-dp", "2", "--mbs", str(MBS),
            "--gbs", str(GBS), "--train-iters", str(ITERS), "--eval-interval", "2", "--eval-iters", "1",
            "--trace", str(trace)]
    statuses = run_ranks(_status, vision_dp + 2, argv, features, {}, deadline_s=DEADLINE_S)
    return [json.loads(line) for line in trace.read_text().splitlines()], statuses


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("step-window")


# fan-out (the tutorial's images dp1 -> language dp2) and 1:1 (dp2 -> dp2): one sample per replica
@pytest.fixture(scope="module", params=[1, 2], ids=["fan-out", "one-to-one"])
def vision_dp(request):
    return request.param


@pytest.fixture(scope="module")
def one_micro_batch(workdir, vision_dp):
    return _run(workdir, f"window-1-v{vision_dp}", vision_dp, ALL)


@pytest.fixture(scope="module")
def whole_step(workdir, vision_dp):
    # profiled: the step the plan predicts rides to the step lines, beside the step the report replays
    return _run(workdir, f"window-step-v{vision_dp}", vision_dp,
                dict(ALL, reorder_window="step", profile=str(workdir / f"profile-step-v{vision_dp}")))


def test_the_step_the_plan_predicts_stands_beside_the_replayed_one(workdir, vision_dp, whole_step):
    from mimo_accel.profiler.run import read_run
    from mimo_accel.tools.report import summarize

    run = read_run(workdir / f"profile-step-v{vision_dp}")
    lines = [line for log in run.ranks.values() for line in log.steps]
    assert len(lines) == ITERS * (vision_dp + 2)
    # every rank planned each step's window alike: one predicted step per iteration, the same on every rank
    by_step = {}
    for line in lines:
        assert by_step.setdefault(line["step"], line["predicted_step_s"]) == line["predicted_step_s"] > 0
    s = summarize(run)
    assert s["step_time_predicted_p50"] > 0 and s["step_time_replayed_p50"] > 0


def test_a_one_micro_batch_plan_says_it_cannot_move_anything(one_micro_batch, whole_step):
    for statuses, said in ((one_micro_batch[1], 1), (whole_step[1], 0)):
        for st in statuses:
            notes = [n for n in st["notes"] if "cannot change any replica's load" in n]
            assert len(notes) == said and all("reorder_window=step" in n for n in notes)


def test_the_step_plan_moves_samples_between_micro_batches_and_trains_the_same_step(one_micro_batch, whole_step):
    got, want = steps_from_trace(whole_step[0]), steps_from_trace(one_micro_batch[0])
    assert sorted(got) == list(range(1, ITERS + 1))
    for it in got:
        assert got[it]["vision"] == got[it]["language"] == list(range((it - 1) * GBS, it * GBS)), f"iteration {it}"
        assert got[it]["loss"] == pytest.approx(want[it]["loss"], rel=RTOL), f"iteration {it}: the step differs"
    # without a step plan, language replica r of micro-batch k holds sample (it-1)·GBS + k·MBS + r
    crossed = [(r["iteration"], k) for r in whole_step[0] if r["module"] == "language"
               for k, ids in enumerate(r["ids"])
               if ids != [(r["iteration"] - 1) * GBS + k * MBS + r["dp_rank"]]]
    assert crossed, "the step plan left every sample where the sampler put it"
