"""Bridge's own training loop end to end: ``examples/train_mimo.py`` runs megatron-bridge's
``pretrain_megatron_mimo`` (training, interval evaluation, torch_dist checkpoints, resume) on CPU
gloo ranks, upstream as shipped and with ``enable(sharded_reads=True, reorder=True,
packing=True)``.

Every rank writes a trace (``--trace``): per training iteration, the sample ids it trained and,
on language ranks, the summed loss and token count. With the per-token loss (the example's
default) the gradient does not depend on which DP replica holds a sample, so reordering changes
who computes what, not the result: per iteration, the global loss and the multiset of samples
each module trained equal the baseline's.

Upstream cannot run fan-in with uneven encoder rows (0-3 images of varied sizes), and its
fan-out splits encoder rows evenly; mimo_accel's fan-in and fan-out runs on that data are checked
against upstream on one vision and one language replica, where its slicing is a no-op.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from mimo_accel_dev.rehearse.ranks import RankFailure, run_ranks

from ._example import run_example

pytestmark = pytest.mark.distributed

MBS, GBS = 4, 8
# Runs here are compared sample for sample with separate runs (straight against resumed, killed
# and restarted): the cost model is pinned, since a model learnt online follows each run's own
# timings (its resume: tests/test_online_calibration_loop.py, on known times).
ALL = dict(sharded_reads=True, reorder=True, packing=True, calibrate_online=False)
WINDOWED = dict(ALL, reorder_window="step")  # plan a whole step at a time
DEADLINE_S = 150.0
RTOL = 1e-4  # reordering and packing change summation order (observed: below 1e-7)
# A resume repeats the same float operations: bit-exact here. A tolerance as loose as RTOL would
# let doubled gradients after the first post-restart iteration through (3e-5 at the next loss).
RESUME_RTOL = 1e-9


def _train(rank, world, argv, features, env):
    """One rank: the example's own main(), with mimo_accel enabled first when asked."""
    return run_example(argv, features, env)["active"]


@dataclass
class Run:
    records: list  # the trace: one dict per rank and iteration
    active: list  # mimo_accel features active on the ranks
    checkpoint: Path

    def steps(self) -> dict:
        """iteration -> {"vision"/"language": sorted ids trained by the module, "loss": global loss}"""
        out: dict = {}
        for r in self.records:
            step = out.setdefault(r["iteration"], {"vision": [], "language": [], "sum": 0.0, "tokens": 0.0})
            step[r["module"]] += [i for micro in r["ids"] for i in micro]
            if r["loss_sum"] is not None:
                step["sum"] += r["loss_sum"]
                step["tokens"] += r["tokens"]
        return {it: {"vision": sorted(s["vision"]), "language": sorted(s["language"]),
                     "loss": s["sum"] / s["tokens"] if s["tokens"] else None}
                for it, s in sorted(out.items())}

    def replica(self, module: str, dp_rank: int) -> dict:
        """iteration -> the ids (per micro-batch) one replica trained."""
        return {r["iteration"]: r["ids"] for r in self.records
                if r["module"] == module and r["dp_rank"] == dp_rank}

    def saved_iteration(self) -> int:
        return int((self.checkpoint / "latest_checkpointed_iteration.txt").read_text())


def _train_run(workdir: Path, name: str, vdp: int, ldp: int, features: dict, *extra: str,
               iters: int = 4, env: dict | None = None, checkpoint: str | None = None,
               log_file: Path | None = None) -> Run:
    trace = workdir / f"{name}.jsonl"
    ckpt = workdir / (checkpoint or f"ckpt-{name}")
    argv = ["--cpu", "--vision-dp", str(vdp), "--language-dp", str(ldp), "--mbs", str(MBS), "--gbs", str(GBS),
            "--train-iters", str(iters), "--eval-interval", "2", "--eval-iters", "1",
            "--save", str(ckpt), "--trace", str(trace), *extra]
    active = run_ranks(_train, vdp + ldp, argv, features, env or {}, deadline_s=DEADLINE_S, log_file=log_file)
    assert all(a == active[0] for a in active)
    return Run(_read(trace), active[0], ckpt)


def _read(trace: Path) -> list:
    return [json.loads(line) for line in trace.read_text().splitlines()] if trace.exists() else []


def _contiguous(iteration: int) -> list:
    return list(range((iteration - 1) * GBS, iteration * GBS))


def _assert_same_training(got: dict, want: dict, iterations, rtol: float = RTOL) -> None:
    for it in iterations:
        for module in ("vision", "language"):
            assert got[it][module] == want[it][module], f"iteration {it}: {module} trained other samples"
        assert got[it]["loss"] == pytest.approx(want[it]["loss"], rel=rtol), f"iteration {it}: loss differs"


def _assert_resumed(resumed: "Run", straight: "Run", iterations) -> None:
    """Per replica: the same micro-batches, the same samples in them, the same losses."""
    _assert_same_training(resumed.steps(), straight.steps(), iterations, rtol=RESUME_RTOL)
    for r in resumed.records:
        want = [w for w in straight.records
                if (w["module"], w["dp_rank"], w["iteration"]) == (r["module"], r["dp_rank"], r["iteration"])]
        assert len(want) == 1
        assert r["ids"] == want[0]["ids"], f"{r['module']} replica {r['dp_rank']}, iteration {r['iteration']}"
        if want[0]["loss_sum"] is not None:
            assert r["loss_sum"] == pytest.approx(want[0]["loss_sum"], rel=RESUME_RTOL)
            assert r["tokens"] == want[0]["tokens"]
    assert sorted({r["iteration"] for r in resumed.records}) == list(iterations)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("pretrain-loop")


# Upstream, unchanged -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def upstream_varied(workdir):
    return _train_run(workdir, "upstream-v1-l1-varied", 1, 1, {"profile": str(workdir / "profile-upstream-v1-l1")},
                      "--varied")


@pytest.fixture(scope="module")
def upstream_one_to_one(workdir):
    # profiled, as a baseline is measured: the profiler observes and changes nothing trained
    return _train_run(workdir, "upstream-v2-l2", 2, 2, {"profile": str(workdir / "profile-upstream-v2-l2")})


# mimo_accel ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def accel_one_to_one(workdir):
    return _train_run(workdir, "accel-v2-l2", 2, 2, dict(ALL, profile=str(workdir / "profile-accel-v2-l2")))


@pytest.fixture(scope="module")
def accel_fan_in(workdir):
    # profiled: the profiler must not change what is trained (the resume test compares this run
    # bit for bit with an unprofiled one)
    return _train_run(workdir, "accel-v2-l1-varied", 2, 1, dict(ALL, profile=str(workdir / "profile-fan-in")),
                      "--varied")


@pytest.fixture(scope="module")
def accel_fan_out(workdir):
    return _train_run(workdir, "accel-v1-l2-varied", 1, 2, ALL, "--varied")


def test_upstream_loop_trains_every_sample_once_with_eval_and_checkpoint(upstream_varied, upstream_one_to_one):
    for run in (upstream_varied, upstream_one_to_one):
        steps = run.steps()
        assert list(steps) == [1, 2, 3, 4]
        for it, step in steps.items():
            assert step["vision"] == step["language"] == _contiguous(it)
            assert step["loss"] is not None and 0 < step["loss"] < 20
        assert run.saved_iteration() == 4
        assert [f for f in run.active if f != "profile"] == []  # as shipped: at most the profiler, observing


@pytest.mark.parametrize("layout", ["one-to-one", "fan-in", "fan-out"])
def test_accelerated_loop_matches_upstream(request, layout):
    accel = request.getfixturevalue({"one-to-one": "accel_one_to_one", "fan-in": "accel_fan_in",
                                     "fan-out": "accel_fan_out"}[layout])
    upstream = request.getfixturevalue("upstream_one_to_one" if layout == "one-to-one" else "upstream_varied")
    assert accel.active[:3] == ["sharded_reads", "reorder", "packing"]
    assert accel.saved_iteration() == 4
    _assert_same_training(accel.steps(), upstream.steps(), range(1, 5))


def test_upstream_padded_batches_count_the_real_tokens_packing_computes(workdir, upstream_one_to_one,
                                                                       accel_one_to_one, upstream_varied,
                                                                       accel_fan_in):
    """Upstream as shipped computes padded rows; its profile counts each sample's real length as
    packing takes it (here from loss_mask: the example drops the attention mask when nothing
    packs), so the language model's tokens/s per GPU compare before and after. Per step, the
    language replicas' tokens sum to what the packed run's cu_seqlens counted (from the mask it
    keeps), on even samples and on varied ones."""
    from mimo_accel.profiler.run import read_run
    from mimo_accel.tools.report import build

    def per_step(run):
        totals: dict = {}
        for log in run.ranks.values():
            if log.module == "language":
                for s in log.steps:
                    totals[s["step"]] = totals.get(s["step"], 0) + s["tokens"]
        return totals

    for upstream, accelerated in (("profile-upstream-v2-l2", "profile-accel-v2-l2"),
                                  ("profile-upstream-v1-l1", "profile-fan-in")):
        before, after = read_run(workdir / upstream), read_run(workdir / accelerated)
        assert per_step(before) == per_step(after) and len(per_step(before)) == 4, upstream
        assert all(0 < v < GBS * 64 for v in per_step(before).values())  # real tokens, fewer than the padded rows
        doc = build(before, after)
        assert doc["before"]["per_module"]["language"]["tokens_per_s_per_gpu_p50"] > 0
        assert not [n for n in doc["before"]["notes"] if "length" in n]  # every length known: nothing said
    assert len(set(per_step(before).values())) > 1  # the varied samples: steps of different real tokens


def test_reordering_moved_samples_between_vision_replicas(accel_fan_in):
    # Fan-in, varied images: the plan balances vision cost, so some replica trained samples
    # other than its contiguous half of a global micro-batch.
    moved = 0
    for it, micros in accel_fan_in.replica("vision", 0).items():
        for m, ids in enumerate(micros):
            first = (it - 1) * GBS + m * MBS
            moved += sorted(ids) != list(range(first, first + MBS // 2))
    assert moved > 0


def test_profile_step_lines_hold_training_steps_only(workdir, accel_fan_in):
    """Evaluation runs after iterations 2 and 4 (its forward passes under no_grad): its reads and
    its encoder time belong to no training step line."""
    from mimo_accel.profiler.run import read_run

    run = read_run(workdir / "profile-fan-in")
    assert sorted(run.ranks) == [0, 1, 2] and not run.warnings
    for rank, log in run.ranks.items():
        assert [s["samples_read"] for s in log.steps] == [GBS // 2 if rank < 2 else GBS] * 4, rank
        if rank < 2:  # two micro-batches per step: two timed encoder forwards and backwards
            assert all(s["timed_calls"] == {"vision_fwd": 2, "vision_bwd": 2} for s in log.steps)
        else:  # the language model, timed under its own name; its evaluation forwards are in no line
            assert all(s["timed_calls"] == {"language_fwd": 2, "language_bwd": 2} for s in log.steps)
            assert all(s["language_fwd_s"] > 0 and s["language_bwd_s"] > 0 and s["sq_tokens"] > 0 for s in log.steps)
        # each micro-batch's forward and backward time (evaluation's in none), summing to the step's,
        # and each forward's counts (an encoder's rows, the language model's real tokens), summing to
        # the step's counters
        counts = ("vision_items", "vision_rows", "vision_sq_rows") if rank < 2 else ("tokens", "sq_tokens")
        for s in log.steps:
            assert {k: len(v) for k, v in s["micro"].items()} == dict.fromkeys((*s["timed_calls"], *counts), 2), rank
            assert all(sum(s["micro"][k]) == pytest.approx(s[f"{k}_s"], rel=1e-9) for k in s["timed_calls"])
            assert all(sum(s["micro"][k]) == s[k] for k in counts)
    from mimo_accel.tools.report import build

    side = build(run)["before"]  # replayed through the 1F1B schedule: vision dp2 -> language dp1
    assert side["step_time_replayed_p50"] > 0 and side["step_time_replayed_skipped"] is None


# Resume --------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def accel_fan_in_straight(workdir):
    return _train_run(workdir, "accel-v2-l1-varied-6", 2, 1, ALL, "--varied", iters=6,
                      log_file=workdir / "accel-v2-l1-varied-6.log")


def _rank_log(path: Path, rank: int) -> str:
    """One rank's section of a run_ranks log file."""
    sections = path.read_text().split("\n===== ")
    (section,) = [s for s in sections if f": rank {rank} of " in s.split("\n", 1)[0]]
    return section


def test_rank_0_logs_what_mimo_accel_did_at_every_logged_step(workdir, accel_fan_in_straight):
    """Without the profiler: rank 0 (vision replica 0) logs one line a step (the example's
    log_interval is 1) with the reads, the plan's moves and what packing removed, each checked
    against the run's own trace; no other rank logs one."""
    import re

    log = workdir / "accel-v2-l1-varied-6.log"
    lines = [l for l in _rank_log(log, 0).splitlines() if l.startswith("mimo_accel: step ")]
    assert [l.split(":")[1] for l in lines] == [f" step {i}" for i in range(1, 7)], lines
    assert not any("mimo_accel: step " in _rank_log(log, r) for r in (1, 2))
    first = lines[0]
    assert first.startswith(f"mimo_accel: step 1: on: sharded_reads, reorder, packing; read per rank: vision "
                            f"{GBS // 2}, language {GBS} of {GBS} samples (upstream: all {GBS}); ")
    # the plan's moves in step 1, from what vision replica 0 trained: what left its contiguous half,
    # and as many came in
    left = sum(len(set(ids) - set(range((m * MBS), m * MBS + MBS // 2)))
               for m, ids in enumerate(accel_fan_in_straight.replica("vision", 0)[1]))
    assert f"the plan gave another replica {2 * left} of {GBS} vision, 0 of {GBS} language samples; " in first
    packed = re.search(r"packing removed (\d+) of (\d+) language tokens", first)
    assert packed and int(packed[2]) == GBS * 64 and 0 < int(packed[1]) < int(packed[2]), first  # seq 64


def test_resume_trains_what_an_uninterrupted_run_trains(workdir, accel_fan_in, accel_fan_in_straight):
    # accel_fan_in trained 4 iterations and saved; resume it to 6.
    _assert_resumed(accel_fan_in, accel_fan_in_straight, [1, 2, 3, 4])  # the same run, so far
    resumed = _train_run(workdir, "accel-v2-l1-varied-resumed", 2, 1, ALL, "--varied",
                         "--load", str(accel_fan_in.checkpoint), iters=6)
    _assert_resumed(resumed, accel_fan_in_straight, [5, 6])
    assert resumed.saved_iteration() == 6


@pytest.fixture(scope="module")
def windowed_straight(workdir):
    return _train_run(workdir, "windowed-v2-l1-varied-6", 2, 1, WINDOWED, "--varied", iters=6)


def test_a_killed_rank_fails_the_job_fast_and_a_restart_loses_nothing(workdir, windowed_straight):
    # reorder_window = the micro-batches of a step: samples move between the micro-batches of a
    # step (never across steps), and a restart from a checkpoint must plan the same windows.
    straight = windowed_straight.steps()
    for it, step in straight.items():
        assert step["vision"] == step["language"] == _contiguous(it)
    crossed = [(it, m) for dp_rank in (0, 1) for it, micros in windowed_straight.replica("vision", dp_rank).items()
               for m, ids in enumerate(micros)
               if not set(ids) <= set(range((it - 1) * GBS + m * MBS, (it - 1) * GBS + (m + 1) * MBS))]
    assert crossed, "the step-wide plan never moved a sample to the other micro-batch of its step"

    argv = ("--varied", "--save-interval", "2")
    started = time.monotonic()
    with pytest.raises(RankFailure, match=r"rank 1 was killed by signal SIGKILL") as failure:
        _train_run(workdir, "windowed-killed", 2, 1, WINDOWED, *argv, iters=6,
                   env={"TRAIN_MIMO_KILL": "1:5"}, checkpoint="ckpt-windowed")
    assert time.monotonic() - started < 60, "the job took too long to notice the dead rank"
    assert str(failure.value).startswith("rank 1 of 3 failed")
    killed = Run(_read(workdir / "windowed-killed.jsonl"), [], workdir / "ckpt-windowed")
    assert killed.saved_iteration() == 4
    # the killed rank trained iterations 1-4 exactly as the uninterrupted run did, then died
    assert killed.replica("vision", 1) == {it: windowed_straight.replica("vision", 1)[it] for it in range(1, 5)}

    restarted = _train_run(workdir, "windowed-restarted", 2, 1, WINDOWED, *argv, "--load",
                           str(workdir / "ckpt-windowed"), iters=6, checkpoint="ckpt-windowed")
    _assert_resumed(restarted, windowed_straight, [5, 6])
    assert restarted.saved_iteration() == 6
