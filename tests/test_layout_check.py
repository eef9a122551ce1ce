"""``make demo-reference``'s layout check (:mod:`mimo_accel_dev.commands.layout_check`): from a CPU
profile, the advisor's recommendation and a third layout of its list become the example's flags, and
the check compares the advisor's order and prediction with the replayed runs."""

from __future__ import annotations

import pytest

from mimo_accel.modules import LANGUAGE
from mimo_accel.tools.layout import advise, build_problem
from mimo_accel.tools.layout.spec import parse_layout
from mimo_accel.workloads import load_profile
from mimo_accel_dev.commands import layout_check as lc
from tests.test_layout import _profile


@pytest.fixture
def advice(tmp_path):
    problem = build_problem(str(_profile(tmp_path)), workload=load_profile("receipts"), rehearsal=True, steps=1)
    return advise(problem, 2 + lc.EXTRA_RANKS, top=4)


def test_the_third_layout_is_neither_the_recommended_nor_the_reference(advice):
    third = lc.third_layout(advice, advice.current.spec)
    assert third is not None and third.spec not in (advice.recommended.spec, advice.current.spec)
    assert third.gpus <= 2 + lc.EXTRA_RANKS


def test_a_layout_becomes_the_examples_flags():
    layout = parse_layout("vision=tp1,pp1,dp2 language=tp2,pp4,dp1 mbs=2 gbs=32")
    vdp, ldp, mbs, argv, ranks = lc.run_argv(layout, {"language_layers": 8, "vision_layers": 2})
    assert (vdp, ldp, mbs, ranks) == (2, 1, 2, 8)
    flags = dict(zip(argv[::2], argv[1::2]))
    assert flags["--gbs"] == "32" and flags["--language-tp"] == "2" and flags["--language-pp"] == "4"
    with pytest.raises(ValueError, match="encoder at TP 1"):
        lc.run_argv(parse_layout("vision=tp2,pp1,dp1 language=tp1,pp1,dp1 mbs=2 gbs=32"), {"language_layers": 8,
                                                                                          "vision_layers": 2})


def test_the_check_orders_and_scores_the_rehearsed_layouts(advice, tmp_path, monkeypatch):
    rec, ref = advice.recommended, advice.current
    third = lc.third_layout(advice, ref.spec)
    dirs = {rec.spec: tmp_path / "rec", ref.spec: tmp_path / "ref", third.spec: tmp_path / "third"}
    # the replayed steps the runs gave (seconds) and their ranks: the recommended fastest, then the reference
    replayed = {dirs[rec.spec]: (0.5, 4), dirs[ref.spec]: (1.0, 2), dirs[third.spec]: (2.0, 3)}
    monkeypatch.setattr(lc, "_replayed", lambda path: replayed[path])
    check = lc.layout_check(advice, tmp_path / "ref", dirs, 4)
    gbs = advice.problem.gbs
    assert check["samples_per_s"] == {"reference": gbs / 1.0, "recommended": gbs / 0.5}
    assert check["gain"]["samples_per_s"] == pytest.approx(2.0)
    assert check["gain"]["samples_per_s_per_rank"] == pytest.approx(1.0)  # twice the samples on twice the ranks
    assert check["replayed_step_s"] == 0.5 and check["predicted_step_s"] == rec.accelerated.step_time_s
    assert check["order"]["replayed"] == [rec.spec, ref.spec, third.spec]
    assert check["order"]["same"] == (check["order"]["predicted"] == check["order"]["replayed"])
    assert "x2.00 the reference's" in lc.verdict(check)
    assert LANGUAGE in rec.spec
