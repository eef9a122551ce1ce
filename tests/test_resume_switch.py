"""A run moved to another layout on Bridge's own loop: saved on the reference layout, resumed on
layouts whose modules have other DP sizes (and other TP, PP and micro-batch sizes), it trains what
the uninterrupted run trains.

``examples/train_mimo.py`` (Bridge's ``pretrain_megatron_mimo``) with sharded reads, the step plan
(``reorder_window="step"``) and packing, the launcher's ``cyclic`` sampler, 0-3 images of varied
sizes per sample: the reference layout (images dp1 -> language tp2 pp2 dp2, 9 ranks, micro-batches
of 2, 12 samples a step) trains 4 iterations and saves at 2 and 4 (torch_dist). From the checkpoint
of iteration 2 (as a job that died in iteration 3 leaves it) it resumes to 4 on fan-in (vision dp2
-> language tp1 pp2 dp1, 4 ranks) and on 1:1 (vision dp3 -> language tp1 pp1 dp3, 6 ranks,
micro-batches of 6, the canonical grid 3). Per iteration each module trains the uninterrupted run's
samples, each language replica the samples its vision replicas encoded (fan-in: two into one), and
the global per-token loss stays within 1e-4 of that run's (another layout sums in another order).
The checkpoint holds each rank's RNG state by its TP/PP rank (``save_rng``, Bridge's default), which
Bridge's MegatronMIMO load does not reshard (it skips its TP/PP check and stops on a missing key deep
in torch's checkpoint reader): the resumes set ``load_rng=False`` (``--no-load-rng``; the model has no
dropout), and without it mimo_accel stops the resume before Bridge loads anything, in one line.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mimo_accel_dev.commands.layout_switch import interrupted_after
from mimo_accel_dev.rehearse.ranks import RankFailure, run_ranks

from ._example import LANGUAGE_PP_DP, steps_from_trace, train_rank

pytestmark = [pytest.mark.distributed, LANGUAGE_PP_DP]

GBS, ITERS, SAVED_AT = 12, 4, 2
WINDOWED = dict(sharded_reads=True, reorder=True, packing=True, reorder_window="step", calibrate_online=False)
DEADLINE_S = 180.0
RTOL = 1e-4  # the same samples from the same weights, summed in another order on another layout
REFERENCE = ("--vision-dp", "1", "--language-dp", "2", "--language-tp", "2", "--language-pp", "2", "--mbs", "2")
FAN_IN = ("--vision-dp", "2", "--language-dp", "1", "--language-tp", "1", "--language-pp", "2", "--mbs", "2")
ONE_TO_ONE = ("--vision-dp", "3", "--language-dp", "3", "--language-tp", "1", "--language-pp", "1", "--mbs", "6")


def _world(layout: tuple) -> int:
    a = dict(zip(layout[::2], layout[1::2]))
    return int(a["--vision-dp"]) + int(a["--language-dp"]) * int(a["--language-tp"]) * int(a["--language-pp"])


def _train(workdir: Path, name: str, layout: tuple, *extra: str, features: dict = WINDOWED) -> list:
    trace = workdir / f"{name}.jsonl"
    argv = ["--cpu", "--varied", "--gbs", str(GBS), "--train-iters", str(ITERS), "--eval-interval", "0",
            "--dataloader-type", "cyclic", "--language-layers", "2", "--trace", str(trace), *layout, *extra]
    active = run_ranks(train_rank, _world(layout), argv, features, {}, deadline_s=DEADLINE_S)
    assert all(a[:3] == ["sharded_reads", "reorder", "packing"] for a in active)
    return [json.loads(line) for line in trace.read_text().splitlines()]


def _assert_pairs(records: list) -> None:
    """Per iteration and micro-batch, the vision replicas' samples in DP order are the language
    replicas' (each replica's first stage, first TP rank): the canonical grid's contiguous groups."""
    for it in sorted({r["iteration"] for r in records}):
        rows = {m: sorted((r for r in records if r["iteration"] == it and r["module"] == m and not r["pp_rank"]
                           and not r.get("tp_rank")), key=lambda r: r["dp_rank"]) for m in ("vision", "language")}
        micro = [len(r["ids"]) for rs in rows.values() for r in rs]
        assert len(set(micro)) == 1, f"iteration {it}: replicas ran {micro} micro-batches"
        for k in range(micro[0]):
            vision = [i for r in rows["vision"] for i in r["ids"][k]]
            language = [i for r in rows["language"] for i in r["ids"][k]]
            assert vision == language, f"iteration {it}, micro-batch {k}: encoded {vision}, language holds {language}"


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("resume-switch")


@pytest.fixture(scope="module")
def straight(workdir):
    """The reference layout, uninterrupted, profiled (its header records the run's settings)."""
    records = _train(workdir, "reference", REFERENCE, "--save", str(workdir / "ckpt"), "--save-interval",
                     str(SAVED_AT), features=dict(WINDOWED, profile=str(workdir / "profile")))
    return steps_from_trace(records)


@pytest.fixture(scope="module")
def saved(workdir, straight):
    return interrupted_after(workdir / "ckpt", SAVED_AT)


def _assert_continues(resumed: list, straight: dict) -> None:
    got = steps_from_trace(resumed)
    assert list(got) == list(range(SAVED_AT + 1, ITERS + 1))
    for it, step in got.items():
        for module in ("vision", "language"):
            assert step[module] == straight[it][module], f"iteration {it}: {module} trained other samples"
        assert step["loss"] == pytest.approx(straight[it]["loss"], rel=RTOL), f"iteration {it}: the loss differs"
    _assert_pairs(resumed)


def test_the_reference_run_reads_every_sample_once_and_records_its_settings(workdir, straight):
    assert list(straight) == list(range(1, ITERS + 1))
    trained = [i for step in straight.values() for i in step["vision"]]
    assert sorted(trained) == sorted(set(trained)) and len(trained) == ITERS * GBS
    assert all(step["vision"] == step["language"] for step in straight.values())
    header = json.loads((workdir / "profile" / "rank0.jsonl").read_text().splitlines()[0])
    run = header["layout"]["run"]
    assert run["parallelism"] == {"vision": [1, 1, 1], "language": [2, 2, 2]}
    assert (run["global_batch"], run["micro_batch"], run["dataloader_type"], run["format"]) == (12, 2, "cyclic",
                                                                                                 "torch_dist")
    assert run["save"] == str(workdir / "ckpt") and run["optimizer_sharding"] is None


def test_a_resume_on_fan_in_trains_what_the_uninterrupted_run_trains(workdir, straight, saved):
    resumed = _train(workdir, "fan-in", FAN_IN, "--load", str(saved), "--no-load-rng", "--save",
                     str(workdir / "ckpt-fan-in"))
    _assert_continues(resumed, straight)
    assert {r["dp_size"] for r in resumed if r["module"] == "vision"} == {2}


def test_a_resume_on_one_to_one_with_another_micro_batch_trains_what_the_uninterrupted_run_trains(
        workdir, straight, saved):
    resumed = _train(workdir, "one-to-one", ONE_TO_ONE, "--load", str(saved), "--no-load-rng", "--save",
                     str(workdir / "ckpt-one-to-one"))
    _assert_continues(resumed, straight)
    assert {len(r["ids"]) for r in resumed} == {GBS // 6}  # two micro-batches of 6 a step


def test_rng_states_that_cannot_follow_the_new_tp_stop_the_resume_before_the_load(workdir, saved):
    with pytest.raises(RankFailure) as e:
        _train(workdir, "with-rng", FAN_IN, "--load", str(saved))
    text = str(e.value)
    line = next(x for x in text.splitlines() if "ResumeRefused:" in x)
    assert "cannot resume from" in line and "language tp2 pp2 -> tp1 pp2" in line
    assert "set checkpoint.load_rng=False" in line
    assert "Missing key" not in text  # stopped before Bridge's load
    assert not (workdir / "with-rng.jsonl").exists()  # no step trained
