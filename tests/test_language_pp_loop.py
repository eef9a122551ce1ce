"""The language model on two pipeline stages, on Bridge's own loop: ``examples/train_mimo.py
--language-pp 2`` (vision tp1 dp1 on rank 0, language tp1 pp2 dp2 on ranks 1-4, MBS 2, GBS 8:
four micro-batches a step through megatron-core's multi-module 1F1B schedule), with evaluation
and a torch_dist checkpoint.

Every language stage of a replica must train the same samples (the first stage embeds the
input_ids, the last takes labels and loss_mask): the trace lists the ids on every stage and the
loss on the last stage only. mimo_accel's step-wide plan (``reorder_window="step"``) moves samples
between the step's micro-batches and replicas; with the per-token loss each step's loss stays
upstream's, and a resume from the checkpoint trains what the uninterrupted run trains. The default
window (a plan per micro-batch) trains upstream's steps too.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from mimo_accel_dev.rehearse.ranks import run_ranks

from ._example import LANGUAGE_PP_DP, train_rank

pytestmark = [pytest.mark.distributed, LANGUAGE_PP_DP]

MBS, GBS, ITERS, WORLD = 2, 8, 4, 5
ALL = dict(sharded_reads=True, reorder=True, packing=True, calibrate_online=False)
WINDOWED = dict(ALL, reorder_window="step")
DEADLINE_S = 150.0
RTOL = 1e-4  # reordering and packing change summation order
RESUME_RTOL = 1e-9  # a resume repeats the same float operations


def _train(workdir: Path, name: str, features: dict, *extra: str, iters: int = ITERS) -> list:
    """The example on 5 ranks; its trace, one dict per rank and iteration."""
    trace = workdir / f"{name}.jsonl"
    argv = ["--cpu", "--varied", "--vision-dp", "1", "--language-dp", "2", "--language-pp", "2",
            "--mbs", str(MBS), "--gbs", str(GBS), "--train-iters", str(iters), "--eval-interval", "2",
            "--eval-iters", "1", "--trace", str(trace), *extra]
    active = run_ranks(train_rank, WORLD, argv, features, {}, deadline_s=DEADLINE_S)
    assert all(a == active[0] for a in active)
    assert active[0][:3] == (["sharded_reads", "reorder", "packing"] if features else [])
    return [json.loads(line) for line in trace.read_text().splitlines()]


def _steps(records: list) -> dict:
    """iteration -> {"vision"/"language": sorted ids the module trained (once per sample, counted on
    its first stage), "loss": the global per-token loss (the last language stage's)}."""
    out: dict = {}
    for r in records:
        s = out.setdefault(r["iteration"], {"vision": [], "language": [], "sum": 0.0, "tokens": 0.0})
        if r["pp_rank"] == 0:
            s[r["module"]] += [i for micro in r["ids"] for i in micro]
        if r["loss_sum"] is not None:
            s["sum"] += r["loss_sum"]
            s["tokens"] += r["tokens"]
    return {it: {"vision": sorted(s["vision"]), "language": sorted(s["language"]), "loss": s["sum"] / s["tokens"]}
            for it, s in sorted(out.items())}


def _by_place(records: list) -> dict:
    """(iteration, module, dp_rank, pp_rank) -> the record."""
    out = {(r["iteration"], r["module"], r["dp_rank"], r["pp_rank"]): r for r in records}
    assert len(out) == len(records), "a rank traced an iteration twice"
    return out


def _assert_stages_and_pairing(records: list, iterations) -> None:
    """Both language stages of a replica trained the same micro-batches; only the last one has the
    loss; the vision replica's micro-batch k is language replica 0's then replica 1's (fan-out)."""
    at = _by_place(records)
    for it in iterations:
        vision = at[(it, "vision", 0, 0)]["ids"]
        for stage in (0, 1):
            language = [at[(it, "language", dp, stage)] for dp in (0, 1)]
            assert all((r["loss_sum"] is not None) == (stage == 1) for r in language), f"iteration {it}"
            assert [a + b for a, b in zip(language[0]["ids"], language[1]["ids"])] == vision, (
                f"iteration {it}, language stage {stage}: the samples do not pair with the encoder's")
        assert len(vision) == GBS // MBS


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("language-pp")


@pytest.fixture(scope="module")
def upstream(workdir):
    return _train(workdir, "upstream", {}, "--save", str(workdir / "ckpt-upstream"))


@pytest.fixture(scope="module")
def windowed(workdir):
    # saves at 3 (and at 4 where Bridge saves when training ends): the resume from 3 trains iteration
    # 4, whose step plan moves samples (the plan keeps iterations 2 and 3 as the sampler reads them)
    return _train(workdir, "windowed", WINDOWED, "--save", str(workdir / "ckpt-windowed"), "--save-interval", "3")


@pytest.fixture(scope="module")
def one_micro_batch(workdir):
    # the default window: a plan per micro-batch (which cannot move anything in this shape)
    return _train(workdir, "one-micro-batch", ALL, iters=2)


def _saved(ckpt: Path) -> int:
    return int((ckpt / "latest_checkpointed_iteration.txt").read_text())


def test_upstream_trains_every_sample_once_per_iteration_on_both_stages(workdir, upstream):
    steps = _steps(upstream)
    assert list(steps) == list(range(1, ITERS + 1))
    for it, step in steps.items():
        assert step["vision"] == step["language"] == list(range((it - 1) * GBS, it * GBS)), f"iteration {it}"
        assert 0 < step["loss"] < 20
    _assert_stages_and_pairing(upstream, steps)
    assert _saved(workdir / "ckpt-upstream") == ITERS


def test_the_step_plan_trains_upstreams_samples_and_losses(upstream, windowed):
    got, want = _steps(windowed), _steps(upstream)
    assert list(got) == list(want)
    for it in got:
        assert got[it]["vision"] == got[it]["language"] == want[it]["vision"], f"iteration {it}"
        assert got[it]["loss"] == pytest.approx(want[it]["loss"], rel=RTOL), f"iteration {it}: the step differs"
    _assert_stages_and_pairing(windowed, got)
    # without a step plan, language replica r of micro-batch k holds sample (it-1)·GBS + k·MBS + r
    crossed = [(r["iteration"], k) for r in windowed if r["module"] == "language"
               for k, ids in enumerate(r["ids"]) if ids != [(r["iteration"] - 1) * GBS + k * MBS + r["dp_rank"]]]
    assert crossed, "the step plan left every sample where the sampler put it"


def test_the_default_window_trains_upstreams_samples_and_losses(upstream, one_micro_batch):
    got, want = _steps(one_micro_batch), _steps(upstream)
    assert list(got) == [1, 2]
    for it in got:
        assert got[it]["vision"] == got[it]["language"] == want[it]["vision"], f"iteration {it}"
        assert got[it]["loss"] == pytest.approx(want[it]["loss"], rel=RTOL), f"iteration {it}: the step differs"
    _assert_stages_and_pairing(one_micro_batch, got)


def _interrupted_after(ckpt: Path, iteration: int) -> Path:
    """A copy of ``ckpt`` holding only the checkpoint of ``iteration``, as a job that died in the
    next iteration leaves it."""
    kept = ckpt.parent / f"{ckpt.name}-after-{iteration}"
    name = f"iter_{iteration:07d}"
    shutil.copytree(ckpt / name, kept / name)
    (kept / "latest_checkpointed_iteration.txt").write_text(str(iteration))
    return kept


def test_a_resume_trains_what_the_uninterrupted_run_trains(workdir, windowed):
    ckpt = _interrupted_after(workdir / "ckpt-windowed", 3)
    resumed = _train(workdir, "resumed", WINDOWED, "--load", str(ckpt), "--save", str(workdir / "ckpt-resumed"))
    assert sorted({r["iteration"] for r in resumed}) == [4]
    moved = _by_place(resumed)[(4, "vision", 0, 0)]["ids"] != [[24 + 2 * k, 25 + 2 * k] for k in range(GBS // MBS)]
    assert moved, "the resumed iteration's plan moved nothing: the check would not see a different plan"
    straight = _by_place(windowed)
    for place, r in _by_place(resumed).items():
        want = straight[place]
        assert r["ids"] == want["ids"], f"{place}: other samples than the uninterrupted run"
        if want["loss_sum"] is None:
            assert r["loss_sum"] is None
        else:
            assert r["loss_sum"] == pytest.approx(want["loss_sum"], rel=RESUME_RTOL), place
            assert r["tokens"] == want["tokens"]
    assert _saved(workdir / "ckpt-resumed") == ITERS
