"""The report's replayed step (mimo_accel.tools.report.replayed): each step's per-micro-batch
times replayed through the schedule, beside the plan's predicted step; an older profile without
them is reported as before, the skip said once."""

from __future__ import annotations

import json

import pytest

from mimo_accel.profiler import FORMAT
from mimo_accel.profiler.run import read_run
from mimo_accel.tools.report import build, main

from .test_report import LAYOUT, write_run


def _run(directory, *, micro=True, plan=None, slow=5.0, steps=3):
    """vision dp2 -> language dp2, two micro-batches a step; vision replica 1's forwards take ``slow``."""
    ranks = {}
    for rank in range(4):
        m = "vision" if rank < 2 else "language"
        fwd = [slow, slow] if rank == 1 else [1.0, 1.0]
        line = {"step_time_s": 1.0, "samples": 2, f"{m}_fwd_s": sum(fwd), f"{m}_bwd_s": 4.0}
        if micro:
            line["micro"] = {f"{m}_fwd": fwd, f"{m}_bwd": [2.0, 2.0]}
        if plan is not None:
            line["predicted_step_s"] = plan
        ranks[rank] = {"module": m, "dp_rank": rank % 2, "dp_size": 2, "steps": [dict(line) for _ in range(steps)]}
    return read_run(write_run(directory, ranks, layout=LAYOUT, fmt=FORMAT))


def test_the_replayed_step_and_the_plans_step_before_and_after(tmp_path):
    doc = build(_run(tmp_path / "b"), _run(tmp_path / "a", plan=14.0, slow=1.0))
    # before: the slow encoder replica holds its language replica (the hand-made trace of
    # tests/test_replay.py: 15 s); after, every stage even: (m + p - 1)(f + b) = 9 s
    assert doc["before"]["step_time_replayed_p50"] == pytest.approx(15.0)
    assert doc["after"]["step_time_replayed_p50"] == pytest.approx(9.0)
    assert doc["after"]["step_time_predicted_p50"] == 14.0 and doc["before"]["step_time_predicted_p50"] is None
    assert doc["after"]["series"]["replayed"]["step_time_predicted_s"] == [14.0, 14.0]
    # step by step, 14 s predicted against 9 s replayed; the side without a plan has no error
    assert doc["after"]["step_time_predicted_error_p50_last_half"] == pytest.approx(14.0 / 9.0 - 1.0)
    assert doc["before"]["step_time_predicted_error_p50_last_half"] is None
    assert not any("replayed" in w for w in doc["warnings"])


def test_an_older_profile_skips_the_replay_said_once(tmp_path, capsys):
    before, after = _run(tmp_path / "b", micro=False), _run(tmp_path / "a")
    doc = build(before, after)
    assert doc["before"]["step_time_replayed_p50"] is None
    assert doc["after"]["step_time_replayed_p50"] == pytest.approx(15.0)
    assert doc["before"]["step_time_replayed_skipped"].startswith("no per-micro-batch times")
    assert doc["after"]["step_time_replayed_skipped"] is None
    assert main([str(tmp_path / "b"), str(tmp_path / "a"), "--json", str(tmp_path / "r.json")]) == 0
    out = capsys.readouterr().out
    assert "step time replayed" in out and out.count("no per-micro-batch times") == 1
    assert "Traceback" not in out
    assert json.loads((tmp_path / "r.json").read_text())["after"]["step_time_replayed_p50"] == pytest.approx(15.0)


def test_ranks_that_timed_different_micro_batch_counts_are_named(tmp_path):
    run = _run(tmp_path / "b")
    run.ranks[3].steps[-1]["micro"]["language_fwd"] = [1.0]
    doc = build(run)
    assert doc["before"]["step_time_replayed_p50"] is None
    assert "timed different numbers of micro-batches" in doc["before"]["step_time_replayed_skipped"]
