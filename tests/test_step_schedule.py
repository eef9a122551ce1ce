"""The step model of the 1F1B pipeline and the plan that shortens it (mimo_accel.balance.step_schedule)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mimo_accel.balance import balance_modules, plan_step, step_time
from tests._hypothesis import examples

# The plan decides on costs rounded to 2**-24 of the largest sample; compared in seconds, a tie
# there may differ by that rounding.
REL = 1e-6

ONE_TO_ONE = {"images": 1, "language": 1}


# ------------------------------------------------------------------------------ hand-worked schedules


def test_one_encoder_replica_one_language_stage_two_micro_batches():
    # encoder 3 then 6, language 6 then 12 (forward 1/3, backward 2/3 of each).
    # encoder (1 stage after it: one warm-up forward): F0 0-1, F1 1-3, B0 7-9, B1 19-23
    # language (last stage: no warm-up):             F0 1-3, B0 3-7, F1 7-11, B1 11-19
    costs = {"images": [3, 6], "language": [6, 12]}
    assert step_time(costs, ONE_TO_ONE, [0, 1], 2) == 23
    # the heavy micro-batch first: encoder F0 0-2, F1 2-3, B0 14-18, B1 20-22; language F0 2-6,
    # B0 6-14, F1 14-16, B1 16-20
    assert step_time(costs, ONE_TO_ONE, [1, 0], 2) == 22


def test_a_frozen_encoder_runs_its_forwards_back_to_back():
    # encoder F0 0-3, F1 3-9 (nothing comes back); language F0 3-5, B0 5-9, F1 9-13, B1 13-21
    costs = {"images": [3, 6], "language": [6, 12]}
    assert step_time(costs, ONE_TO_ONE, [0, 1], 2, frozen=["images"]) == 21
    assert step_time(costs, ONE_TO_ONE, [0, 1], 2, frozen="images") == 21


@pytest.mark.parametrize("stages", [1, 2, 3, 4])
@pytest.mark.parametrize("micro_batches", [1, 2, 3, 8, 16])
def test_uniform_costs_give_the_textbook_1f1b_makespan(stages, micro_batches):
    # the encoder is stage 0 and each language stage as long as it: P + 1 equal stages of
    # forward f and backward b take (W + P) (f + b)
    x = 3.0  # one stage's forward + backward of one micro-batch
    n = 2 * micro_batches  # two samples a micro-batch, one per language replica
    costs = {"images": np.full(n, x / 2), "language": np.full(n, x * stages)}
    got = step_time(costs, {"images": 1, "language": 2}, list(range(n)), micro_batches,
                    stages={"language": stages})
    assert got == pytest.approx((micro_batches + stages) * x, rel=1e-12)


def test_uniform_language_stages_alone():
    # no encoder: P equal stages, (W + P - 1) (f + b)
    costs = {"language": np.full(8, 4.0)}
    assert step_time(costs, {"language": 1}, list(range(8)), 8, stages={"language": 4}) == pytest.approx(11.0)


def test_fan_in_a_language_replica_waits_for_every_encoder_replica_it_holds():
    # images dp2 -> language dp1; one micro-batch. Encoder 0: F 0-1; encoder 1: F 0-3.
    # language F 3-5 (after the slower), B 5-9; encoder 0 B 9-11, encoder 1 B 9-15
    costs = {"images": [3, 9], "language": [3, 3]}
    assert step_time(costs, {"images": 2, "language": 1}, [0, 1], 1) == 15
    assert step_time(costs, {"images": 2, "language": 1}, [1, 0], 1) == 15  # the same replicas, swapped


def test_fan_out_an_encoder_backward_waits_for_every_language_replica_it_feeds():
    # images dp1 -> language dp2. Encoder F 0-2; language 0: F 2-3, B 3-5; language 1: F 2-5,
    # B 5-11; encoder B 11-15
    costs = {"images": [3, 3], "language": [3, 9]}
    assert step_time(costs, {"images": 1, "language": 2}, [0, 1], 1) == 15


def test_fan_out_pairs_each_encoder_replica_with_its_own_language_replicas():
    # images dp2 -> language dp4: encoder replica 0 feeds language 0 and 1, replica 1 feeds 2, 3.
    # Encoder 0 is slow (F 0-10); language 2 and 3 start at 1 (after encoder 1), language 0, 1 at 10.
    costs = {"images": [15, 15, 1.5, 1.5], "language": [3, 3, 3, 3]}
    dps = {"images": 2, "language": 4}
    # encoder 0: F 0-10, B after language 0/1 (B ends 10+1+2=13): 13-33
    assert step_time(costs, dps, [0, 1, 2, 3], 1) == 33
    # put a slow image with each encoder replica: encoder F 0-5.5 each, language B ends 8.5, encoder B 8.5-19.5
    assert step_time(costs, dps, [0, 2, 1, 3], 1) == pytest.approx(19.5)


def test_step_time_of_many_orders_at_once():
    rng = np.random.default_rng(3)
    costs = {"images": rng.uniform(0.1, 2, 16), "language": rng.uniform(0.1, 2, 16)}
    orders = np.stack([rng.permutation(16) for _ in range(5)])
    dps = {"images": 1, "language": 2}
    many = step_time(costs, dps, orders, 4, stages={"language": 2})
    assert many.shape == (5,)
    assert many.tolist() == [step_time(costs, dps, o.tolist(), 4, stages={"language": 2}) for o in orders]


# --------------------------------------------------------------------------------------- bad input


GOOD = {"images": [1.0, 2.0, 3.0, 4.0], "language": [1.0, 1.0, 2.0, 2.0]}
DPS = {"images": 1, "language": 2}


@pytest.mark.parametrize("costs, dps, kw, words", [
    ({"images": [1.0] * 4}, DPS, {}, "must name the same modules"),
    ({"images": [1.0] * 4, "audio": [1.0] * 4}, {"images": 1, "audio": 2}, {}, "needs the language module"),
    ({"images": [0.0] * 4, "language": [1.0] * 4}, DPS, {}, "costs in different units (a module with no time)"),
    ({"images": [1.0, float("nan"), 1.0, 1.0], "language": [1.0] * 4}, DPS, {}, "finite and >= 0"),
    ({"images": [1.0, -1.0, 1.0, 1.0], "language": [1.0] * 4}, DPS, {}, "finite and >= 0"),
    ({"images": [1.0] * 3, "language": [1.0] * 3}, DPS, {}, "cannot be cut into 2 equal groups"),
    (GOOD, DPS, {"micro_batches": 3}, "cannot be cut into 6 equal groups"),
    (GOOD, DPS, {"stages": {"language": 0}}, "must be a positive integer (PP stages)"),
    (GOOD, DPS, {"stages": {"images": 2}}, "takes an encoder as one stage"),
    (GOOD, DPS, {"stages": {"audio": 1}}, "not a module of costs/dps"),
    (GOOD, DPS, {"frozen": ["language"]}, "only an encoder can be frozen"),
    (GOOD, DPS, {"frozen": ["audio"]}, "not a module of costs/dps"),
])
def test_bad_input_is_refused_naming_the_fix(costs, dps, kw, words):
    for call in (lambda: step_time(costs, dps, list(range(len(costs["images"]))), **kw),
                 lambda: plan_step(costs, dps, **kw)):
        with pytest.raises(ValueError) as err:
            call()
        assert words in str(err.value)


@pytest.mark.parametrize("order", [[0, 1, 2], [0, 0, 1, 2], [0, 1, 2, 5], [0.0, 1.0, 2.0, 3.0]])
def test_an_order_that_is_not_a_permutation_is_refused(order):
    with pytest.raises(ValueError, match="permutation of range"):
        step_time(GOOD, DPS, order)


# ------------------------------------------------------------------------------------------ the plan


def _reference(seed: int, micro_batches: int, ratio: float):
    """images dp1 -> language dp2 (2 PP stages), a global micro-batch of 2: the encoder stage
    ``ratio`` times the language model's per-stage time."""
    rng = np.random.default_rng(seed)
    n = 2 * micro_batches
    language = rng.lognormal(0, 0.6, n)
    images = rng.lognormal(0, 0.8, n)
    images *= ratio * language.sum() / 4 / images.sum()
    return {"images": images, "language": language}


REF = {"images": 1, "language": 2}
PP2 = {"language": 2}


@pytest.mark.parametrize("ratio", [0.25, 1.0, 2.0])
def test_the_plan_shortens_the_reference_step_where_a_cell_holds_one_sample(ratio):
    costs = _reference(0, 16, ratio)
    original = step_time(costs, REF, list(range(32)), 16, stages=PP2)
    order = plan_step(costs, REF, 16, stages=PP2)
    assert sorted(order) == list(range(32))
    assert balance_modules(costs, REF, 16) == list(range(32))  # today's plan has nothing to move here
    assert step_time(costs, REF, order, 16, stages=PP2) < 0.95 * original


def test_the_plan_moves_samples_between_micro_batches_and_reorders_them():
    costs = _reference(1, 8, 0.5)
    order = np.array(plan_step(costs, REF, 8, stages=PP2)).reshape(8, 2)
    assert any(set(mb) not in ({2 * j, 2 * j + 1} for j in range(8)) for mb in order.tolist())


def test_a_balanced_step_is_left_as_it_is():
    costs = {"images": np.ones(16), "language": np.ones(16)}
    assert plan_step(costs, REF, 8, stages=PP2) == list(range(16))


def test_a_frozen_encoder_is_planned_for_forwards_only():
    costs = _reference(2, 16, 2.0)  # the encoder is the bottleneck
    trained = plan_step(costs, REF, 16, stages=PP2)
    frozen = plan_step(costs, REF, 16, stages=PP2, frozen=["images"])
    for order, kw in ((trained, {}), (frozen, {"frozen": ["images"]})):
        assert step_time(costs, REF, order, 16, stages=PP2, **kw) < step_time(costs, REF, list(range(32)), 16,
                                                                              stages=PP2, **kw)


LAYOUTS = [
    ({"images": 1, "language": 2}, {"language": 2}),  # the reference: fan-out into a 2-stage language model
    ({"images": 2, "language": 2}, {}),  # 1:1
    ({"images": 2, "language": 1}, {}),  # fan-in
    ({"images": 1, "language": 2}, {}),  # fan-out
    ({"images": 2, "audio": 1, "language": 4}, {"language": 2}),  # three modules
]


@st.composite
def _problems(draw):
    dps, stages = draw(st.sampled_from(LAYOUTS))
    grid = max(dps.values())
    micro_batches = draw(st.integers(1, 4))
    per_group = draw(st.integers(1, 3))
    n = micro_batches * grid * per_group
    cost = st.floats(0.05, 50.0, allow_nan=False, allow_infinity=False)
    costs = {m: draw(st.lists(cost, min_size=n, max_size=n)) for m in dps}
    frozen = draw(st.sampled_from([(), ("images",)]))
    return costs, dps, micro_batches, {"stages": stages, "frozen": frozen}


@settings(max_examples=examples(30), deadline=None)
@given(_problems())
def test_the_plan_is_a_deterministic_permutation_no_worse_than_the_original_or_balance_modules(problem):
    costs, dps, micro_batches, kw = problem
    n = len(costs["language"])
    order = plan_step(costs, dps, micro_batches, **kw)
    assert sorted(order) == list(range(n))
    assert plan_step(costs, dps, micro_batches, **kw) == order
    planned = step_time(costs, dps, order, micro_batches, **kw)
    assert planned <= step_time(costs, dps, list(range(n)), micro_batches, **kw) * (1 + REL)
    today = balance_modules(costs, dps, micro_batches)
    assert planned <= step_time(costs, dps, today, micro_batches, **kw) * (1 + REL)


@pytest.mark.parametrize("dps", [{"vision": 8, "language": 8}, {"vision": 8, "language": 4},
                                 {"vision": 4, "language": 8}])
def test_many_samples_a_cell_keep_balance_modules_quality(dps):
    # 8-16 samples a replica: the cells balance_modules evens are the plan's start
    rng = np.random.default_rng(7)
    n = 2 * 8 * 12
    costs = {"vision": rng.lognormal(0, 0.9, n), "language": rng.lognormal(0, 0.6, n)}
    order = plan_step(costs, dps, 2)
    today = balance_modules(costs, dps, 2)
    assert step_time(costs, dps, order, 2) <= step_time(costs, dps, today, 2) * (1 + REL)
    assert step_time(costs, dps, today, 2) < step_time(costs, dps, list(range(n)), 2)


@settings(max_examples=examples(40), deadline=None)
@given(st.integers(2, 4), st.integers(1, 6), st.data())
def test_uneven_stages_are_the_same_schedule_fed_each_stages_share(pp, micro_batches, data):
    """One 1F1B model for even and uneven stages: a step whose language stages take ``stage_shares``
    of each micro-batch is the replay of the same schedule fed each cell split by those shares
    (forward 1/3, backward 2/3); even shares are the default."""
    from mimo_accel.balance.replay import replay, replay_plan
    from mimo_accel.balance.joint import module_loads

    dps = {"images": 1, "language": 2}
    n = 2 * micro_batches
    cost = st.floats(0.01, 10.0)
    costs = {m: np.array(data.draw(st.lists(cost, min_size=n, max_size=n))) for m in dps}
    shares = np.array(data.draw(st.lists(st.integers(1, 50), min_size=pp, max_size=pp)), dtype=float)
    shares /= shares.sum()
    order = list(range(n))
    kw = {"stages": {"language": pp}}
    fwd, bwd = {}, {}
    for m, load in module_loads(costs, dps, order, micro_batches).items():
        split = shares if m == "language" else np.ones(1)
        cell = load.T[:, None, :] * split[None, :, None]
        fwd[m], bwd[m] = cell / 3, cell * 2 / 3
    modelled = step_time(costs, dps, order, micro_batches, stage_shares=shares, **kw)
    assert modelled == pytest.approx(replay(fwd, bwd, dps, micro_batches, **kw).makespan, rel=1e-3)  # 2**-12 units
    assert replay_plan(costs, dps, order, micro_batches, stage_shares=shares, **kw).makespan == pytest.approx(modelled)
    even = np.full(pp, 1.0 / pp)
    assert step_time(costs, dps, order, micro_batches, stage_shares=even, **kw) == pytest.approx(
        step_time(costs, dps, order, micro_batches, **kw))
