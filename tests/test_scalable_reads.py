"""Upstream's own scalable reads (Megatron-Bridge PR #5525, ``dataset.megatron_mimo_scalable_dp``)
with mimo_accel on top, through Bridge's own loop (``examples/train_mimo.py --scalable-dp``:
``pretrain_megatron_mimo`` with evaluation, checkpoints and resume) on CPU gloo ranks.

With the flag on, upstream reads each replica's share on the canonical grid itself
(``build_canonical_mimo_data_loader``) and its step does not slice. mimo_accel's sharded reads step
aside; reorder plans the global micro-batch upstream's own canonical-group samplers give (under
``single`` and ``cyclic``), fan-in carries uneven encoder rows, packing packs and the profiler
counts — on top of upstream's reads. Reordering changes which replica computes a sample, not what
is computed: per iteration, the samples each module trained and the global loss equal upstream's
on the same canonical grid (1:1, where upstream runs uneven rows).

These tests need a megatron-bridge with ``canonical_sampler`` (PR #5525): they run under
``make test-upstream`` on that branch and are skipped elsewhere (0.6.2 and main have no scalable
reads to build on); ``tests/test_version_guard.py`` checks the shape's declaration everywhere.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest

from mimo_accel_dev.rehearse.ranks import RankFailure, run_ranks

from ._example import run_example, steps_from_trace

HAS_SCALABLE_READS = importlib.util.find_spec("megatron.bridge.data.megatron_mimo.canonical_sampler") is not None
pytestmark = [pytest.mark.distributed,
              pytest.mark.skipif(not HAS_SCALABLE_READS,
                                 reason="this megatron-bridge has no scalable MegatronMIMO reads (PR #5525)")]

MBS, GBS = 4, 8
# runs compared sample for sample with separate runs: the cost model pinned (one learnt online follows each run's timings)
ALL = dict(sharded_reads=True, reorder=True, packing=True, calibrate_online=False)
DEADLINE_S = 150.0
RTOL = 1e-4  # reordering and packing change summation order
RESUME_RTOL = 1e-9  # a resume repeats the same float operations


def _train(rank, world, argv, features, env):
    return run_example(argv, features, env)["active"]


def _run(workdir: Path, name: str, vdp: int, ldp: int, features: dict, *extra: str, iters: int = 4,
         sampler: str = "cyclic", data: tuple = ("--varied",), language_pp: int = 1) -> tuple[list, list, Path]:
    trace, ckpt = workdir / f"{name}.jsonl", workdir / f"ckpt-{name}"
    argv = ["--cpu", "--scalable-dp", "--dataloader-type", sampler, *data,
            "--vision-dp", str(vdp), "--language-dp", str(ldp), "--language-pp", str(language_pp),
            "--mbs", str(MBS), "--gbs", str(GBS), "--train-iters", str(iters), "--eval-interval", "2",
            "--eval-iters", "1", "--save", str(ckpt), "--trace", str(trace), *extra]
    active = run_ranks(_train, vdp + ldp * language_pp, argv, features, {}, deadline_s=DEADLINE_S)
    records = [json.loads(line) for line in trace.read_text().splitlines()]
    return records, active[0], ckpt


def _assert_same_training(got: dict, want: dict, iterations, rtol: float = RTOL) -> None:
    for it in iterations:
        for module in ("vision", "language"):
            assert got[it][module] == want[it][module], f"iteration {it}: {module} trained other samples"
        assert got[it]["loss"] == pytest.approx(want[it]["loss"], rel=rtol), f"iteration {it}: loss differs"


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("scalable-reads")


@pytest.fixture(scope="module")
def upstream(workdir):
    """Upstream's scalable reads alone, 1:1 on two replicas (canonical grid 2), per sampler."""
    return {s: _run(workdir, f"upstream-{s}", 2, 2, {}, sampler=s) for s in ("single", "cyclic")}


@pytest.fixture(scope="module")
def profiled_fan_in(workdir):
    return _run(workdir, "accel-fan-in-cyclic", 2, 1, dict(ALL, profile=str(workdir / "profile")))


def test_upstream_scalable_reads_train_each_replica_its_canonical_share(upstream):
    single, _, _ = upstream["single"]
    for r in single:
        first = (r["iteration"] - 1) * GBS
        for m, ids in enumerate(r["ids"]):
            lo = first + m * MBS + r["dp_rank"] * (MBS // 2)
            assert ids == list(range(lo, lo + MBS // 2))  # single: the contiguous share
    cyclic = steps_from_trace(upstream["cyclic"][0])
    # cyclic: shuffled (each iteration trains 8 of the 32 samples, not the next contiguous 8)
    assert any(step["vision"] != list(range((it - 1) * GBS, it * GBS)) for it, step in cyclic.items())
    assert sorted(i for step in cyclic.values() for i in step["vision"]) == list(range(4 * GBS))


@pytest.mark.parametrize("sampler", ["single", "cyclic"])
@pytest.mark.parametrize("layout", [(2, 1), (1, 2), (2, 2)], ids=["fan-in", "fan-out", "one-to-one"])
def test_mimo_accel_on_scalable_reads_trains_what_upstream_trains(workdir, upstream, profiled_fan_in, layout,
                                                                  sampler):
    if layout == (2, 1) and sampler == "cyclic":
        records, active, ckpt = profiled_fan_in
    else:
        records, active, ckpt = _run(workdir, f"accel-{layout[0]}-{layout[1]}-{sampler}", *layout, ALL,
                                     sampler=sampler)
    assert active[:3] == ["sharded_reads", "reorder", "packing"]
    assert int((ckpt / "latest_checkpointed_iteration.txt").read_text()) == 4
    _assert_same_training(steps_from_trace(records), steps_from_trace(upstream[sampler][0]), range(1, 5))


def test_the_plan_moves_samples_away_from_upstreams_canonical_share(upstream, profiled_fan_in):
    """Upstream's vision replica r trains canonical group r; the plan moved some samples."""
    def shares(records):
        return {(r["iteration"], r["dp_rank"]): r["ids"] for r in records if r["module"] == "vision"}

    mine, theirs = shares(profiled_fan_in[0]), shares(upstream["cyclic"][0])
    assert mine.keys() == theirs.keys()
    assert any(sorted(m) != sorted(t) for k in mine for m, t in zip(mine[k], theirs[k]))


def test_the_profiler_counts_reads_and_plans_on_scalable_reads(workdir, profiled_fan_in):
    from mimo_accel.profiler.run import read_run

    run = read_run(workdir / "profile")
    assert not run.warnings
    assert sorted(run.ranks) == [0, 1, 2]
    for rank, log in run.ranks.items():
        assert [s["step"] for s in log.steps] == [0, 1, 2, 3]
        # each vision replica read half of every global micro-batch (2 per step); the language
        # replica the whole of it: nobody read the (dp-1)/dp it throws away. Evaluation (after
        # iterations 2 and 4) reads are not counted into a training step.
        want = GBS // 2 if rank < 2 else GBS
        assert [s["samples_read"] for s in log.steps] == [want] * 4, rank
        if rank < 2:
            assert all(s["vision_fwd_s"] > 0 and s["timed_calls"]["vision_fwd"] == 2 for s in log.steps)
    vision = [s for r in (0, 1) for s in run.ranks[r].steps if s.get("samples_read")]
    assert any(s.get("predicted_spread") is not None for s in vision)


def test_resume_on_scalable_reads_trains_what_an_uninterrupted_run_trains(workdir):
    # A 6-iteration run checkpoints at 4 and 6. The dataset is sized by train_iters, and cyclic
    # shuffles over the whole of it, so the interrupted run must be this same 6-iteration run:
    # keep only its iteration-4 checkpoint, as a job that died during iteration 5 would.
    straight, _, ckpt = _run(workdir, "accel-fan-in-cyclic-6", 2, 1, ALL, "--save-interval", "4", iters=6)
    crashed = workdir / "ckpt-crashed-after-4"
    shutil.copytree(ckpt / "iter_0000004", crashed / "iter_0000004")
    (crashed / "latest_checkpointed_iteration.txt").write_text("4")
    resumed, _, _ = _run(workdir, "accel-fan-in-cyclic-resumed", 2, 1, ALL, "--load", str(crashed), iters=6)
    _assert_same_training(steps_from_trace(resumed), steps_from_trace(straight), [5, 6], rtol=RESUME_RTOL)
    want = {(r["module"], r["dp_rank"], r["iteration"]): r["ids"] for r in straight}
    for r in resumed:
        assert r["ids"] == want[(r["module"], r["dp_rank"], r["iteration"])]
    assert sorted({r["iteration"] for r in resumed}) == [5, 6]


def test_exchange_mode_on_scalable_reads(workdir, upstream):
    records, active, _ = _run(workdir, "accel-fan-in-exchange", 2, 1, dict(ALL, reorder_mode="exchange"))
    _assert_same_training(steps_from_trace(records), steps_from_trace(upstream["cyclic"][0]), range(1, 5))


def test_upstream_scalable_reads_alone_cannot_fan_in_uneven_rows(workdir):
    # What mimo_accel adds: the same fan-in run without it stops in upstream's code.
    with pytest.raises(RankFailure, match="Mismatch in shape|Fan-in with variable|does not match|divisible"):
        _run(workdir, "upstream-fan-in", 2, 1, {})


def test_packing_on_two_language_stages_takes_its_lengths_before_the_step_drops_their_fields(workdir):
    """Bridge's own MegatronMIMODataset (its attention_mask all ones: lengths come from loss_mask and
    input_ids) with the language model on two pipeline stages: upstream's step runs no slice here
    and drops input_ids off the first stage and loss_mask off the last before it packs, so
    mimo_accel works the lengths out as the shard arrives. It trains what upstream's scalable reads
    alone train, unpacked."""
    data = ("--dataset", "images", "--image-dir", str(workdir / "images"), "--image-rows", "4", "--seq-length", "64")
    want, _, _ = _run(workdir, "upstream-images-pp2", 1, 1, {}, data=data, language_pp=2)
    got, active, ckpt = _run(workdir, "accel-images-pp2", 1, 1, ALL, data=data, language_pp=2)
    assert active[:3] == ["sharded_reads", "reorder", "packing"]
    assert int((ckpt / "latest_checkpointed_iteration.txt").read_text()) == 4
    _assert_same_training(steps_from_trace(got), steps_from_trace(want), range(1, 5))
