"""The report's replayed step (mimo_accel.profiler.replayed): each step's per-micro-batch
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


# ------------------------------------------------------------------------ who bounds the step

VALIDATED = {"dp": {"images": 1, "language": 2}, "pp": {"images": 1, "language": 2}}


def _validated(directory, encoder, language, *, micro=True, steps=3, w=2):
    """Upstream's validated layout in small: images dp1 (rank 0) -> language dp2 pp2 (ranks 1-4: rank
    1 + stage·2 + replica); ``w`` micro-batches a step of (forward, backward) seconds each (a
    language stage's), as tests/test_replay.py works them by hand."""
    ranks = {0: ("images", 0)} | {1 + p * 2 + r: ("language", r) for p in range(2) for r in range(2)}
    out = {}
    for rank, (m, r) in ranks.items():
        f, b = encoder if m == "images" else language
        line = {"step_time_s": 1.0, "samples": 1, f"{m}_fwd_s": w * f, f"{m}_bwd_s": w * b}
        if micro:
            line["micro"] = {f"{m}_fwd": [f] * w, f"{m}_bwd": [b] * w}
        out[rank] = {"module": m, "dp_rank": r, "dp_size": 2 if m == "language" else 1,
                     "steps": [dict(line) for _ in range(steps)]}
    return write_run(directory, out, layout=VALIDATED, fmt=FORMAT)


def test_each_modules_busy_share_and_the_module_that_bounds_the_step(tmp_path, capsys):
    # before: the padded language stages (2, 4) bound a 21 s step, each busy 12 s of it, the encoder
    # 6 s; after: the language work shrank to (1, 2), the encoder's grew to (2, 4): it bounds a 16 s
    # step busy 12 s, and the language ranks wait 10 s of it
    before = _validated(tmp_path / "b", (1.0, 2.0), (2.0, 4.0))
    after = _validated(tmp_path / "a", (2.0, 4.0), (1.0, 2.0))
    assert main([str(before), str(after), "--json", str(tmp_path / "r.json")]) == 0
    doc = json.loads((tmp_path / "r.json").read_text())
    b, a = doc["before"], doc["after"]
    assert b["step_time_replayed_p50"] == pytest.approx(21.0) and a["step_time_replayed_p50"] == pytest.approx(16.0)
    assert b["per_module"]["images"]["busy_share_p50"] == pytest.approx(6 / 21)
    assert b["per_module"]["language"]["busy_share_p50"] == pytest.approx(12 / 21)
    assert a["per_module"]["images"]["busy_share_max_p50"] == pytest.approx(0.75)
    assert a["per_module"]["language"]["busy_share_p50"] == pytest.approx(6 / 16)
    assert a["per_module"]["language"]["wait_share_p50"] == pytest.approx(10 / 16)
    assert (b["bound_module"], a["bound_module"]) == ("language", "images")
    assert a["bound_steps"] == {"images": 2}  # the counted steps (the first is warm-up)
    out = capsys.readouterr().out
    assert "Who bounds the step" in out
    row = next(ln for ln in out.splitlines() if "bounds the step" in ln and "│" in ln)
    assert [c.strip() for c in row.split("│")[1:-1]] == ["bounds the step", "language", "images"]
    # the language ranks wait more than a third of the after step: one line names the bound and the layout command
    line = " ".join(out[out.index("after: images bounds the step"):].split())
    assert line.startswith("after: images bounds the step (its busiest rank is busy 75.0% of the replayed step, "
                           "16.000 s p50); waiting more than a third of it: the language ranks 62.5%. The layout "
                           f"to run next: mimo-accel layout --from {after}")
    assert "images ranks" not in line  # the encoder waits 25%: under a third


def test_a_line_only_where_a_module_waits_a_third_and_no_shares_without_micro_batch_times(tmp_path):
    from mimo_accel.tools.report.console import bound_line, bound_table, sides_of

    # 8 micro-batches of (1, 2) everywhere: the textbook 1F1B step (8 + 3 - 1)·3 = 30 s, every device
    # busy 24 s of it, waiting 20%: no line; the tie names the encoder
    even = build(read_run(_validated(tmp_path / "even", (1.0, 2.0), (1.0, 2.0), w=8)))["before"]
    assert even["per_module"]["language"]["wait_share_p50"] == pytest.approx(0.2)
    assert even["bound_module"] == "images" and bound_line(sides_of(even)) is None
    assert bound_table(sides_of(even)).rows[-1][:2] == ["bounds the step", "images"]
    # a light encoder waits more than a third of a step the language stages bound: it is named
    light = build(read_run(_validated(tmp_path / "light", (0.5, 1.0), (1.0, 2.0))))["before"]
    assert light["bound_module"] == "language" and light["per_module"]["images"]["wait_share_p50"] > 1 / 3
    line = bound_line(sides_of(light))
    assert line.startswith("language bounds the step") and "the images ranks" in line
    older = build(read_run(_validated(tmp_path / "old", (1.0, 2.0), (2.0, 4.0), micro=False)))["before"]
    assert older["bound_module"] is None and older["per_module"]["images"]["busy_share_p50"] is None
    assert older["step_time_replayed_skipped"].startswith("no per-micro-batch times")
    assert bound_table(sides_of(older)) is None and bound_line(sides_of(older)) is None


def test_the_html_page_shows_who_bounds_the_step(tmp_path, monkeypatch):
    from mimo_accel.tools.report import charts
    from mimo_accel.tools.report.html import write_html

    def no_charts():  # the page's tables are under test, not its charts (a second of matplotlib)
        raise RuntimeError("no charts here")

    monkeypatch.setattr(charts, "pyplot", no_charts)

    doc = build(read_run(_validated(tmp_path / "b", (1.0, 2.0), (2.0, 4.0))),
                read_run(_validated(tmp_path / "a", (2.0, 4.0), (1.0, 2.0))))
    write_html(doc, tmp_path / "r.html")
    page = (tmp_path / "r.html").read_text()
    assert "<caption>Who bounds the step" in page
    assert '<td>bounds the step</td><td class="num">language</td><td class="num">images</td>' in page
    assert '<p class="bound">after: images bounds the step' in page and "mimo-accel layout --from" in page
