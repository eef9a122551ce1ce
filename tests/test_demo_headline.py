"""What ``make demo`` closes with (:func:`mimo_accel_dev.commands.rehearsal_output.headline`): each
module's straggler beside the machine's floor, and the vision straggler in the steps before
mimo_accel's first calibrated plan, beside the other runs' in the same steps."""

from __future__ import annotations

import pytest

from mimo_accel_dev.commands.rehearsal_output import first_calibrated_plan, headline, headline_lines


def _side(vision: list[float], refits: list | None = None, p50: float = 1.0) -> dict:
    steps = list(range(1, len(vision) + 1))  # the profiler's steps: iteration - 1, the warm-up left out
    return {"module_order": ["vision", "language"],
            "per_module": {"vision": {"max_over_mean_p50": p50}, "language": {"max_over_mean_p50": 1.01}},
            "series": {"modules": {"vision": {"step": steps, "max_over_mean": vision}}},
            "online_calibration": {"refits": refits or []}}


def test_the_first_calibrated_plan_is_the_first_learnt_not_the_first_put_in_seconds():
    refits = [{"announced_for": 6, "reason": "in seconds: the model in use, scaled (not better ...)"},
              {"announced_for": 8, "reason": "better on the held-out steps"},
              {"announced_for": 11, "reason": "better on the held-out steps"}]
    assert first_calibrated_plan(refits) == 8
    assert first_calibrated_plan(refits[:1]) is None


def test_the_headline_compares_the_same_steps_and_names_the_gap_to_the_floor():
    refits = [{"announced_for": 6, "reason": "better on the held-out steps"}]
    after = _side([1.03, 1.01, 1.05, 1.02, 1.30, 1.01], refits, p50=1.02)
    peer = _side([1.04, 1.06, 1.02, 1.08, 1.00, 1.00])
    doc = {"before": _side([1.5, 1.4, 1.3, 1.2, 1.1, 1.0]), "after": after,
           "floor": {"modules": {"vision": 1.012, "language": 1.005}}}
    head = headline(doc, peer)
    first = head["first_steps"]
    assert first["first_calibrated_plan"] == 6 and first["iterations"] == [2, 3, 4, 5]  # step 5 is iteration 6
    assert first["straggler_p50"]["mimo_accel"] == pytest.approx(1.025)
    assert first["straggler_p50"]["peer"] == pytest.approx(1.05)
    assert first["straggler_p50"]["upstream"] == pytest.approx(1.35)
    assert head["modules"]["vision"]["gap"] == pytest.approx(0.008)
    text = "\n".join(headline_lines(head, "Bridge 0.7's reorder"))
    assert "+0.008 from this machine's floor (1.012)" in text
    assert "iterations 2-5" in text and "Bridge 0.7's reorder 1.050" in text


def test_without_a_floor_or_a_calibrated_plan_it_says_so():
    doc = {"before": _side([1.2, 1.2]), "after": _side([1.1, 1.0])}
    head = headline(doc, None)
    assert head["modules"]["vision"]["gap"] is None and head["first_steps"]["iterations"] == [2, 3]
    text = "\n".join(headline_lines(head, None))
    assert "no floor measured" in text and "with no calibrated plan" in text
