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


def test_the_third_layout_is_neither_the_checked_nor_the_reference(advice):
    checked = lc.to_check(advice)
    third = lc.third_layout(advice, checked)
    assert third is not None and third.spec not in (checked.spec, advice.current.spec)
    assert third.gpus <= 2 + lc.EXTRA_RANKS


def _recommend(advice, row):
    advice.ranked["mimo_accel"].insert(0, row)
    advice.recommended, advice.keep_current = row, False
    return row


def _uneven(advice):
    """A row of the advice moved to language pp2 with megatron-core's first / last split."""
    import dataclasses

    row = next(r for r in advice.ranked["mimo_accel"] if r.spec != advice.current.spec)
    modules = type(row.layout.modules)(tuple(dataclasses.replace(m, pp=2, dp=1) if m.is_language else m
                                             for m in row.layout.modules))
    return dataclasses.replace(row, layout=dataclasses.replace(row.layout, modules=modules, first=3, last=1))


def test_the_check_rehearses_the_advisors_uneven_split_as_it_recommends_it(advice):
    uneven = _recommend(advice, _uneven(advice))
    checked = lc.to_check(advice)
    assert checked.row is uneven and checked.role == "recommended"
    _, _, _, argv, ranks = lc.run_argv(uneven.layout, {"language_layers": 4, "vision_layers": 1})
    flags = dict(zip(argv[::2], argv[1::2]))
    assert flags["--language-pp"] == "2" and ranks == 2
    assert (flags["--language-first-stage-layers"], flags["--language-last-stage-layers"]) == ("3", "1")
    assert lc.advised(advice)["advisor_recommended"] == uneven.spec and "first=3 last=1" in uneven.spec
    assert lc.advised(advice)["advisor_recommended_split"] == {"num_layers_in_first_pipeline_stage": 3,
                                                               "num_layers_in_last_pipeline_stage": 1}


def test_where_the_advisor_keeps_the_current_layout_its_best_found_is_checked_labelled_so(advice, tmp_path,
                                                                                         monkeypatch):
    advice.recommended, advice.keep_current, advice.margin = advice.current, True, "the best found is +1.0 %"
    checked = lc.to_check(advice)
    assert checked.role == "best found" and checked.spec == advice.ranked["mimo_accel"][0].spec
    assert checked.spec != advice.current.spec and "keeps the current layout" in checked.why
    check, *_ = _check(advice, tmp_path, monkeypatch, {"rec": (0.5, 4), "ref": (1.0, 2), "third": (2.0, 3)})
    assert check["keep_current"] is True and check["advisor_recommended"] == advice.current.spec
    assert check["checked_role"] == "best found" and check["layouts"][checked.spec]["role"] == "best found"
    assert "recommended" not in {row["role"] for row in check["layouts"].values()}
    said = lc.verdict(check)
    assert said.startswith("the advisor keeps the current layout (the best found is +1.0 %); checked its best found")
    assert "(not recommended)" in said


def test_a_layout_the_stack_cannot_build_is_replaced_by_a_labelled_stand_in(advice):
    import dataclasses

    row = next(r for r in advice.ranked["mimo_accel"] if r.spec != advice.current.spec)
    wide = dataclasses.replace(row, layout=dataclasses.replace(row.layout, modules=type(row.layout.modules)(
        tuple(dataclasses.replace(m, tp=2) if not m.is_language else m for m in row.layout.modules))))
    _recommend(advice, wide)
    checked = lc.to_check(advice)
    assert checked.role == "stand-in" and checked.spec != wide.spec
    assert f"stands in for the advisor's recommendation {wide.spec}" in checked.why and "encoder at TP 1" in checked.why


def test_with_nothing_the_stack_builds_the_check_says_so_rather_than_stop(advice):
    for row in advice.ranked["mimo_accel"]:
        row.why_not = "over the budget"
    advice.recommended, advice.keep_current = advice.current, True
    why = lc.to_check(advice)
    assert isinstance(why, str) and "no other layout it ranked can be rehearsed" in why
    check = lc.nothing_to_check(advice, 4, why)
    assert check["checked"] is None and check["keep_current"] is True and check["outcome"].startswith("nothing")
    assert lc.verdict(check) == f"nothing rehearsed: {why}" and why.startswith("the advisor keeps the current layout")


def test_a_layout_becomes_the_examples_flags():
    layout = parse_layout("vision=tp1,pp1,dp2 language=tp2,pp4,dp1 mbs=2 gbs=32")
    vdp, ldp, mbs, argv, ranks = lc.run_argv(layout, {"language_layers": 8, "vision_layers": 2})
    assert (vdp, ldp, mbs, ranks) == (2, 1, 2, 8)
    flags = dict(zip(argv[::2], argv[1::2]))
    assert flags["--gbs"] == "32" and flags["--language-tp"] == "2" and flags["--language-pp"] == "4"
    assert "--language-first-stage-layers" not in flags  # an even split passes none
    with pytest.raises(ValueError, match="encoder at TP 1"):
        lc.run_argv(parse_layout("vision=tp2,pp1,dp1 language=tp1,pp1,dp1 mbs=2 gbs=32"), {"language_layers": 8,
                                                                                          "vision_layers": 2})


def test_the_example_takes_megatrons_uneven_split_and_refuses_one_that_does_not_add_up(capsys):
    from mimo_accel_dev.rehearse import bridge_script as script
    from mimo_accel_dev.rehearse import stack

    args = script.parse_args(["--language-pp", "3", "--language-layers", "7", "--language-first-stage-layers", "1",
                              "--language-last-stage-layers", "2"])
    config = stack._language_config(stack.StackConfig(layout=script.build_layout(args), language_layers=7,
                                                      language_first=1, language_last=2))
    assert (config.num_layers_in_first_pipeline_stage, config.num_layers_in_last_pipeline_stage) == (1, 2)
    for argv, fix in (
            (["--language-pp", "2", "--language-layers", "4", "--language-first-stage-layers", "5"], "leave -1"),
            (["--language-pp", "3", "--language-layers", "8", "--language-first-stage-layers", "1"],
             "positive multiple of 2"),
            (["--language-pp", "2", "--language-first-stage-layers", "1"], "give --language-layers too"),
            (["--language-pp", "2", "--language-layers", "3"], "or give --language-first/last-stage-layers")):
        with pytest.raises(SystemExit):
            script.parse_args(argv)
        assert fix in capsys.readouterr().err, argv


def _check(advice, tmp_path, monkeypatch, replayed_s: dict, diffs: Optional[dict] = None):
    """The check over the reference, the recommended and the third layout, their replayed steps (seconds,
    by role) and ranks given."""
    checked, ref = lc.to_check(advice), advice.current
    rec, third = checked.row, lc.third_layout(advice, checked)
    dirs = {rec.spec: tmp_path / "rec", ref.spec: tmp_path / "ref", third.spec: tmp_path / "third"}
    replayed = {tmp_path / role: value for role, value in replayed_s.items()}
    monkeypatch.setattr(lc, "_replayed", lambda path: replayed[path])
    diffs = {rec.spec: 1e-7, third.spec: 2e-7} if diffs is None else diffs
    return lc.layout_check(advice, checked, tmp_path / "ref", dirs, 4, diffs), rec, ref, third


def test_the_check_orders_and_scores_the_rehearsed_layouts(advice, tmp_path, monkeypatch):
    # the recommended fastest, then the reference, then the third
    check, rec, ref, third = _check(advice, tmp_path, monkeypatch,
                                    {"rec": (0.5, 4), "ref": (1.0, 2), "third": (2.0, 3)})
    gbs = advice.problem.gbs
    assert check["samples_per_s"] == {"reference": gbs / 1.0, "checked": gbs / 0.5}
    assert check["checked_role"] == "recommended" and check["advisor_recommended"] == rec.spec == check["checked"]
    assert check["keep_current"] is False
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
    with pytest.raises(InvariantViolation, match=r"1\.2e-02 \(apart\) relative, past 1e-04: not the same computation"):
        lc.compare_losses(reference, {"same": same, "apart": apart})
    # 1e-4 is past what the same computation in another order gives (2.5e-7 measured), and is refused
    near = _steps((7.6805, 727.0), (6.6640 * (1 + 2e-4), 787.0), (6.0606, 724.0))
    with pytest.raises(InvariantViolation, match=r"2\.0e-04 \(near\)"):
        lc.compare_losses(reference, {"near": near})
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
def test_layouts_of_other_pipeline_depths_and_splits_start_from_the_same_weights(tmp_path):
    """Bridge seeds each pipeline stage apart; the rehearsal seeds each language layer by its number in
    the whole model (megatron-core's offset, which reads the first / last split), so the same samples on
    one stage, two even stages or two uneven ones (megatron-core's num_layers_in_first/last_pipeline_stage,
    passed by the stack under Bridge's pretrain_megatron_mimo) give the same per-step losses: the same
    model math, only the placement differs (the layout check relies on it)."""
    from rich.console import Console as Quiet

    from mimo_accel_dev.commands.rehearsal_output import progress_bar
    from mimo_accel_dev.rehearse import rehearsal

    steps, runs, built = 2, {}, {}
    layouts = {"pp1": (1, 4, []), "pp2": (2, 2, []),
               "pp2 first=3 last=1": (2, 2, ["--language-first-stage-layers", "3", "--language-last-stage-layers", "1"])}
    with progress_bar(Quiet(file=open(tmp_path / "progress.txt", "w"))) as progress:
        for name, (pp, mbs, split) in layouts.items():
            argv = ["--gbs", "4", "--language-pp", str(pp), "--language-layers", "4", "--vision-layers", "1", *split]
            task = progress.add_task(name, total=steps)
            label = name.replace(" ", "-").replace("=", "")
            records = rehearsal.run_bridge(label, {}, 1, 1, steps, mbs, tmp_path, tmp_path / "images", None, 0,
                                           progress, task, tmp_path / "log.txt", extra_argv=argv, language_ranks=pp)
            runs[name] = rehearsal.bridge_steps(records, steps, 4, name)
            built[name] = {r["pp_rank"]: r["layer_numbers"] for r in records if r["module"] == LANGUAGE}
    # what each stage built: megatron-core's split, numbered in the whole model
    assert built == {"pp1": {0: [1, 2, 3, 4]}, "pp2": {0: [1, 2], 1: [3, 4]},
                     "pp2 first=3 last=1": {0: [1, 2, 3], 1: [4]}}
    diffs = lc.compare_losses(runs["pp1"], {k: v for k, v in runs.items() if k != "pp1"})  # raises past 1e-4
    assert set(diffs) == {"pp2", "pp2 first=3 last=1"} and max(diffs.values()) <= lc.LOSS_TOLERANCE
    assert lc.compare_losses(runs["pp2"], {"uneven": runs["pp2 first=3 last=1"]})["uneven"] <= lc.LOSS_TOLERANCE


def test_a_layout_whose_micro_batches_hold_other_samples_a_replica_says_its_cost_was_measured_at_the_runs():
    import dataclasses

    from mimo_accel.tools.layout.advice import _samples_a_micro_batch

    from tests._doc_commands import ROOT

    # a profile of Bridge's loop with mimo_accel on (its language micro-batches' tokens recorded)
    problem = build(Request(profile=str(ROOT / "tests" / "data" / "profiles" / "all"),
                            data=DataRequest("receipts", rehearsal=True, steps=1)))
    run = problem.profiled
    assert LANGUAGE in problem.seconds.micro_batch_overheads(run)  # the profile priced a micro-batch's own cost
    assert _samples_a_micro_batch(problem, run) is None
    more = dataclasses.replace(run, mbs=run.mbs * 2)
    note = _samples_a_micro_batch(problem, more)
    assert note is not None and f"holds {2 * run.mbs / run.language.dp:g}" in note and "not in the profile" in note
