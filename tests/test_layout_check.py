"""``make demo-reference``'s layout check (:mod:`mimo_accel_dev.commands.layout_check`): from a CPU
profile, the advisor's recommendation and a third layout of its list become the example's flags, and
the check compares the advisor's order and prediction with the replayed runs."""

from __future__ import annotations

from typing import Optional

import pytest
from rich.console import Console

from mimo_accel.modules import LANGUAGE
from mimo_accel.tools.layout import DataRequest, Request, Search, advise, build
from mimo_accel.tools.layout.spec import parse_layout
from mimo_accel_dev.commands import layout_check as lc
from mimo_accel_dev.rehearse.rehearsal import InvariantViolation
from tests.test_layout import _profile


@pytest.fixture
def advice(tmp_path):
    problem = build(Request(profile=str(_profile(tmp_path)), data=DataRequest("receipts", rehearsal=True, steps=1)))
    return advise(problem, Search(2 + lc.EXTRA_RANKS, top=4))


def test_the_third_layout_is_neither_the_recommended_nor_the_reference(advice):
    third = lc.third_layout(advice, advice.current.spec)
    assert third is not None and third.spec not in (lc.to_check(advice).spec, advice.current.spec)
    assert third.gpus <= 2 + lc.EXTRA_RANKS


def test_the_check_rehearses_only_layouts_the_stack_builds(advice):
    # the rehearsal's stack splits the language layers evenly: a first/last split is not rehearsed
    import dataclasses

    uneven = next(r for r in advice.ranked["mimo_accel"] if r.spec != advice.current.spec)
    moved = dataclasses.replace(uneven, layout=dataclasses.replace(uneven.layout, first=1, last=1))
    advice.ranked["mimo_accel"].insert(0, moved)
    advice.recommended, advice.keep_current = moved, False
    checked = lc.to_check(advice)
    assert checked is not moved and checked.layout.first is None and checked.layout.last is None
    third = lc.third_layout(advice, advice.current.spec)
    assert third is None or third.layout.first is None


def test_a_layout_becomes_the_examples_flags():
    layout = parse_layout("vision=tp1,pp1,dp2 language=tp2,pp4,dp1 mbs=2 gbs=32")
    vdp, ldp, mbs, argv, ranks = lc.run_argv(layout, {"language_layers": 8, "vision_layers": 2})
    assert (vdp, ldp, mbs, ranks) == (2, 1, 2, 8)
    flags = dict(zip(argv[::2], argv[1::2]))
    assert flags["--gbs"] == "32" and flags["--language-tp"] == "2" and flags["--language-pp"] == "4"
    with pytest.raises(ValueError, match="encoder at TP 1"):
        lc.run_argv(parse_layout("vision=tp2,pp1,dp1 language=tp1,pp1,dp1 mbs=2 gbs=32"), {"language_layers": 8,
                                                                                          "vision_layers": 2})


def _check(advice, tmp_path, monkeypatch, replayed_s: dict, diffs: Optional[dict] = None):
    """The check over the reference, the recommended and the third layout, their replayed steps (seconds,
    by role) and ranks given."""
    rec, ref = lc.to_check(advice), advice.current
    third = lc.third_layout(advice, ref.spec)
    dirs = {rec.spec: tmp_path / "rec", ref.spec: tmp_path / "ref", third.spec: tmp_path / "third"}
    replayed = {tmp_path / role: value for role, value in replayed_s.items()}
    monkeypatch.setattr(lc, "_replayed", lambda path: replayed[path])
    diffs = {rec.spec: 1e-7, third.spec: 2e-7} if diffs is None else diffs
    return lc.layout_check(advice, tmp_path / "ref", dirs, 4, diffs), rec, ref, third


def test_the_check_orders_and_scores_the_rehearsed_layouts(advice, tmp_path, monkeypatch):
    # the recommended fastest, then the reference, then the third
    check, rec, ref, third = _check(advice, tmp_path, monkeypatch,
                                    {"rec": (0.5, 4), "ref": (1.0, 2), "third": (2.0, 3)})
    gbs = advice.problem.gbs
    assert check["samples_per_s"] == {"reference": gbs / 1.0, "recommended": gbs / 0.5}
    assert check["gain"]["samples_per_s"] == pytest.approx(2.0)
    assert check["gain"]["samples_per_s_per_rank"] == pytest.approx(1.0)  # twice the samples on twice the ranks
    assert check["replayed_step_s"] == 0.5 and check["predicted_step_s"] == rec.accelerated.step_time_s
    assert check["order"]["replayed"] == [rec.spec, third.spec]
    assert check["order"]["same"] == (check["order"]["predicted"] == check["order"]["replayed"])
    assert check["loss_max_rel_diff"] == {rec.spec: 1e-7, third.spec: 2e-7}
    assert "x2.00 the reference's" in lc.verdict(check) and "within 2e-07 of the reference's" in lc.verdict(check)
    assert LANGUAGE in rec.spec


def test_the_reference_is_fitted_and_left_out_of_the_order(advice, tmp_path, monkeypatch):
    """The advisor scales its costs so that the reference prices at its replay: its row cannot be out of
    place, so the order holds only the layouts priced before they ran, whatever the reference replayed."""
    for ref_step in (0.1, 1.0, 9.0):  # fastest, between, slowest of the three
        check, rec, ref, third = _check(advice, tmp_path, monkeypatch,
                                        {"rec": (0.5, 4), "ref": (ref_step, 2), "third": (2.0, 3)})
        assert check["reference_fitted"] is True
        assert ref.spec not in check["order"]["predicted"] and ref.spec not in check["order"]["replayed"]
        assert sorted(check["order"]["predicted"]) == sorted([rec.spec, third.spec])
        assert check["layouts"][ref.spec]["fitted"] and not check["layouts"][rec.spec]["fitted"]
        assert check["reference_replayed_step_s"] == ref_step
    # the third replayed faster than the recommended: the two priced layouts are out of order, said
    check, rec, ref, third = _check(advice, tmp_path, monkeypatch,
                                    {"rec": (2.0, 4), "ref": (1.0, 2), "third": (0.5, 3)})
    assert check["order"]["replayed"] == [third.spec, rec.spec] and not check["order"]["same"]
    assert "NOT the order of the replay" in lc.verdict(check)
    console = Console(width=250, record=True)
    console.print(lc.table(check))
    text = console.export_text()
    ref_line = next(line for line in text.splitlines() if "(reference, fitted)" in line)
    assert ref_line.count(" s*") == 1 and ref_line.count("*") == 2 and "* fitted: the advisor scales its costs so the reference" in text
    assert all("*" not in line for line in text.splitlines() if "(recommended)" in line or "(third)" in line)


def _steps(*losses_tokens):
    return [{"loss_sum": loss * tokens, "tokens": tokens} for loss, tokens in losses_tokens]


def test_a_layout_whose_losses_differ_past_the_tolerance_fails_loudly():
    reference = _steps((7.6805, 727.0), (6.6640, 787.0), (6.0606, 724.0))
    same = _steps((7.6805, 727.0), (6.66401, 787.0), (6.0606, 724.0))
    diffs = lc.compare_losses(reference, {"same": same})
    assert diffs["same"] == pytest.approx(1e-5 / 6.664, rel=1e-3)
    # another start (Bridge seeds each pipeline stage apart): 1.2e-2 apart in the second step
    apart = _steps((7.6278, 727.0), (6.5840, 787.0), (6.0606, 724.0))
    with pytest.raises(InvariantViolation, match=r"1\.2e-02 \(apart\) relative, past 1e-02: not the same computation"):
        lc.compare_losses(reference, {"same": same, "apart": apart})
    # fewer tokens computed: refused whatever the loss
    fewer = _steps((7.6805, 727.0), (6.6640, 780.0), (6.0606, 724.0))
    with pytest.raises(InvariantViolation, match="iteration 2: 780 loss tokens against the reference's 787"):
        lc.compare_losses(reference, {"fewer": fewer})
    with pytest.raises(InvariantViolation, match="2 steps against the reference's 3"):
        lc.compare_losses(reference, {"short": same[:2]})
    console = Console(width=120, record=True)
    console.print(lc.loss_table("ref", {"ref": reference, "same": same}, {"ref": "reference", "same": "recommended"}))
    text = console.export_text()
    assert "reference" in text and "recommended" in text and "6.664010" in text and "787" in text


@pytest.mark.distributed
def test_layouts_of_other_pipeline_depths_start_from_the_same_weights(tmp_path):
    """Bridge seeds each pipeline stage apart; the rehearsal seeds each language layer by its number, so
    the same samples on one stage or two give the same per-step losses (the layout check relies on it)."""
    from rich.console import Console as Quiet

    from mimo_accel_dev.commands.rehearsal_output import progress_bar
    from mimo_accel_dev.rehearse import rehearsal

    steps, runs = 2, {}
    with progress_bar(Quiet(file=open(tmp_path / "progress.txt", "w"))) as progress:
        for pp, mbs in ((1, 4), (2, 2)):
            argv = ["--gbs", "4", "--language-pp", str(pp), "--language-layers", "2", "--vision-layers", "1"]
            task = progress.add_task(f"pp{pp}", total=steps)
            records = rehearsal.run_bridge(f"pp{pp}", {}, 1, 1, steps, mbs, tmp_path, tmp_path / "images", None, 0,
                                           progress, task, tmp_path / "log.txt", extra_argv=argv, language_ranks=pp)
            runs[pp] = rehearsal.bridge_steps(records, steps, 4, f"pp{pp}")
    assert lc.compare_losses(runs[1], {"pp2": runs[2]})["pp2"] < 1e-5
