"""The online calibration keeps a step plan's modules at the machine's current pace (``keep_pace``).

A step plan prices every module in seconds and no overhead: a module learnt from early steps that
ran slower (or faster) than the later ones would mislead the predicted step. With ``keep_pace``, a
module already in seconds is rescaled, its shape kept, so that its work totals the newest steps'
measured time whenever it drifts past the tolerance (pure: no torch, no megatron).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mimo_accel.costs import CostModel, ModuleCost
from mimo_accel.costs.online import OnlineCalibration
from mimo_accel.costs.share_error import replica_share_error
from tests._hypothesis import examples

VISION, LANGUAGE = "vision", "language"
FLOPS = CostModel(fit={"start": "flops"})
# the one-replica tests: the start's own shape in seconds (only the pace is to be followed); the
# language model's shape, unlike its start's, is learnt from its replicas
TRUTH = {VISION: ModuleCost(*(2e-5 * v for v in (FLOPS.of(VISION).a, FLOPS.of(VISION).b, FLOPS.of(VISION).k))),
         LANGUAGE: ModuleCost(3e-5, 4e-9)}


def _step(cal, step, pace, rng, replicas):
    """One step of every module, its true time multiplied by the machine's ``pace`` then."""
    for module in cal.modules:
        rows = rng.integers(200, 4000, replicas).astype(float)
        f = np.column_stack([rows, rows * rng.uniform(50, 900, replicas), rng.integers(1, 20, replicas)])
        c = TRUTH[module]
        seconds = f[:, 0] * c.a + f[:, 1] * c.b + f[:, 2] * c.k
        cal.observe(step, module, f, pace * seconds)


def _run(paces, *, keep_pace, replicas=1, modules=(VISION,), seed=0):
    cal = OnlineCalibration(FLOPS, list(modules), min_steps=3, keep_pace=keep_pace, pace_steps=3)
    rng = np.random.default_rng(seed)
    for step, pace in enumerate(paces):
        _step(cal, step, pace, rng, replicas)
        cal.refit(step + 1)
    return cal


def _work_over_time(cal, module, steps):
    """The model in use's work over the measured time of ``steps`` (1: in step with the machine)."""
    cost = cal.model.of(module)
    w = np.array([cost.a, cost.b, cost.k])
    x = np.concatenate([cal._steps[module][s].features for s in steps])
    y = np.concatenate([cal._steps[module][s].seconds for s in steps])
    return float((x @ w).sum() / y.sum())


def _mean_share_error(steps, cost, module):
    w = np.array([cost.a, cost.b, cost.k])
    return float(np.mean([replica_share_error(o.features @ w, o.seconds) for o in steps]))


def test_one_replica_follows_the_machine_when_its_pace_drifts():
    # the first steps ran 30 % slower than the later ones (a CPU warming up, a neighbour leaving)
    paces = [1.3] * 4 + [1.0] * 8
    kept, pinned = _run(paces, keep_pace=0.05), _run(paces, keep_pace=None)
    assert _work_over_time(pinned, VISION, range(9, 12)) == pytest.approx(1.3, rel=0.02)
    assert _work_over_time(kept, VISION, range(9, 12)) == pytest.approx(1.0, abs=0.05)
    start, now = FLOPS.of(VISION), kept.model.of(VISION)
    assert now.b / now.a == pytest.approx(start.b / start.a)  # the shape is the start's: only the pace moved
    rescaled = [r for r in kept.refits if "at the pace of steps" in r.reason]
    assert rescaled and all(r.scale_only and r.overhead_s == 0.0 for r in rescaled)


def test_a_steady_machine_is_not_rescaled_at_every_step():
    cal = _run([1.0] * 12, keep_pace=0.05)
    # the first attempt puts the FLOPs start in seconds; the pace never drifts past 5 % after it
    assert [r.step for r in cal.refits] == [3]


def test_a_learnt_shape_is_kept_while_its_level_follows_the_pace():
    paces = [1.4] * 5 + [1.0] * 10
    cal = OnlineCalibration(FLOPS, [VISION, LANGUAGE], min_steps=3, keep_pace=0.05, pace_steps=3)
    rng = np.random.default_rng(2)
    rescaled = 0
    for step, pace in enumerate(paces):
        _step(cal, step, pace, rng, 3)  # fewer rows a step than a cost per item is fitted from
        before = {m: cal.model.of(m) for m in cal.modules}
        for refit in cal.refit(step + 1):
            pace, _, attempt = refit.reason.partition("; ")
            if pace.startswith("in seconds: at the pace of steps") and not attempt.startswith("better"):
                rescaled += 1  # no new shape taken, the level alone moved: the shape is the one before
                was, now = before[refit.module], refit.coefficients
                assert now.b / now.a == pytest.approx(was.b / was.a, rel=1e-9)
                # judged as the model in use prices the held-out steps, not by the dropped candidate
                steps = [cal._steps[refit.module][s] for s in refit.held_out_steps]
                assert refit.held_out_error_after == pytest.approx(_mean_share_error(steps, now, refit.module))
    assert rescaled
    for module in (VISION, LANGUAGE):
        assert _work_over_time(cal, module, range(12, 15)) == pytest.approx(1.0, abs=0.05)


@settings(max_examples=examples(30), deadline=None)
@given(paces=st.lists(st.floats(0.5, 2.0), min_size=4, max_size=10), tolerance=st.floats(0.0, 0.3))
def test_property_after_every_refit_a_module_is_within_the_tolerance_of_its_newest_steps(paces, tolerance):
    cal = OnlineCalibration(FLOPS, [VISION], min_steps=3, keep_pace=tolerance, pace_steps=3)
    rng = np.random.default_rng(0)
    for step, pace in enumerate(paces):
        _step(cal, step, pace, rng, 1)
        cal.refit(step + 1)
        if step >= 2:
            newest = sorted(cal._steps[VISION])[-3:]
            assert abs(_work_over_time(cal, VISION, newest) - 1.0) <= tolerance + 1e-9


@pytest.mark.parametrize("kwargs, match", [
    ({"keep_pace": 1.0}, "keep_pace must be None or a number in"),
    ({"keep_pace": -0.1}, "keep_pace must be None or a number in"),
    ({"keep_pace": True}, "keep_pace must be None or a number in"),
    ({"pace_steps": 0}, "pace_steps must be an integer >= 1"),
])
def test_bad_pace_options_are_clear_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        OnlineCalibration(CostModel(), [VISION], **kwargs)


def test_a_lone_encoders_micro_batches_teach_its_cost_per_item():
    """One vision replica observed per micro-batch (16 a step, 2 images each): each forward costs a
    fixed 8 ms per image beside its rows. The start has no such term and its work was put in
    seconds by rows alone; kept at the machine's pace, the model learns the cost per item from
    each micro-batch's level beside its rows, and prices a step's micro-batches as measured."""
    true = ModuleCost(2e-5, 1e-8, 8e-3)
    start = CostModel(modules={VISION: ModuleCost(2e-5, 1e-8, 0.0)})
    cal = OnlineCalibration(start, [VISION], min_steps=3, keep_pace=0.05, pace_steps=3)
    rng = np.random.default_rng(4)

    def micro_batches(pace):
        rows = rng.integers(50, 1500, size=(16, 2)).astype(float)
        f = np.column_stack([rows.sum(1), (rows * rows).sum(1), np.full(16, 2.0)])
        return f, pace * (f @ np.array([true.a, true.b, true.k])) * rng.normal(1.0, 0.02, 16)

    for step, pace in enumerate([1.0] * 4 + [1.3] * 5):  # the machine slows: a pace refit is due
        cal.observe(step, VISION, *micro_batches(pace))
        cal.refit(step + 1)
    learnt = cal.model.of(VISION)
    assert learnt.k == pytest.approx(1.3 * true.k, rel=0.15)
    assert learnt.b / learnt.a == pytest.approx(true.b / true.a, rel=0.2)
    f, seconds = micro_batches(1.3)
    w = np.array([learnt.a, learnt.b, learnt.k])
    assert replica_share_error(f @ w, seconds) < 0.1
    assert any("s per item" in r.reason and not r.scale_only for r in cal.refits)


@pytest.mark.parametrize("stalled", [False, True])
def test_a_flops_start_put_in_seconds_takes_its_cost_per_item_at_once(stalled):
    """The plans of the first steps after the first refit are made with it (the refits after it
    are announced several steps ahead): a lone encoder observed per micro-batch gets its cost per
    item when its FLOPs start is put in seconds, on a steady machine as well; one large
    micro-batch that stalled (3x its time) does not set the level of the rest."""
    shape = FLOPS.of(VISION)
    true = ModuleCost(2e-5 * shape.a, 2e-5 * shape.b, 6e-3)
    cal = OnlineCalibration(FLOPS, [VISION], min_steps=3, keep_pace=0.05, pace_steps=3)
    rng = np.random.default_rng(5)
    first = None
    for step in range(4):
        rows = rng.integers(50, 1500, size=(16, 2)).astype(float)
        f = np.column_stack([rows.sum(1), (rows * rows).sum(1), np.full(16, 2.0)])
        seconds = (f @ np.array([true.a, true.b, true.k])) * rng.normal(1.0, 0.02, 16)
        if stalled and step == 1:
            seconds[np.argmax(f[:, 0])] *= 3.0
        cal.observe(step, VISION, f, seconds)
        refits = cal.refit(step + 1)
        first = first or (refits[0] if refits else None)
    assert first is not None and first.accepted and "s per item" in first.reason
    assert first.coefficients.k == pytest.approx(true.k, rel=0.15)
    assert first.coefficients.b / first.coefficients.a == pytest.approx(shape.b / shape.a)


def test_the_language_models_cost_per_micro_batch_is_learnt_from_its_micro_batches():
    # a language replica's micro-batches (its stages summed), one sample each: a fixed cost per
    # micro-batch beside a small one per token, as on CPU ranks and launch-bound GPUs. The replicas
    # of a step hold as many samples, so only the micro-batches' level beside their tokens tells it
    per_sample, per_token = 0.04, 2e-5
    cal = OnlineCalibration(FLOPS, [LANGUAGE], min_steps=3, keep_pace=0.05, pace_steps=3)
    rng = np.random.default_rng(3)
    for step in range(10):
        tokens = rng.integers(20, 400, 32).astype(float)  # 2 replicas x 16 micro-batches
        f = np.column_stack([tokens, tokens ** 2, np.ones(32)])
        cal.observe(step, LANGUAGE, f, (per_sample + per_token * tokens) * rng.uniform(0.97, 1.03, 32))
        cal.refit(step + 1)
    learnt = cal.model.of(LANGUAGE)
    assert learnt.k == pytest.approx(per_sample, rel=0.15)
    # so a step of short samples is priced as measured, and one of long samples too (a model of
    # its tokens alone, scaled to the mean step, prices the first x0.15 and the second x1.7)
    for tokens in (np.full(16, 30.0), np.full(16, 380.0)):
        truth = (per_sample + per_token * tokens).sum()
        assert learnt.language_costs(tokens).sum() == pytest.approx(truth, rel=0.08)
