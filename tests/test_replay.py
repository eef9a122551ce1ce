"""The replay of measured times through the step model's schedule (pure numpy)."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mimo_accel.balance.replay import replay
from mimo_accel.balance.step_schedule import step_time
from tests._hypothesis import examples


def _uniform(dps, pp, w, f, b):
    fw = {m: np.full((d, pp if m == "language" else 1, w), f) for m, d in dps.items()}
    bw = {m: np.full((d, pp if m == "language" else 1, w), b) for m, d in dps.items()}
    return fw, bw


@pytest.mark.parametrize("pp,w", [(1, 1), (2, 4), (4, 8), (3, 2)])
def test_uniform_1f1b_has_the_textbook_makespan(pp, w):
    # p pipeline stages (the language model's PP after one encoder stage), m micro-batches
    dps = {"vision": 1, "language": 1}
    fw, bw = _uniform(dps, pp, w, 1.0, 2.0)
    out = replay(fw, bw, dps, w, stages={"language": pp})
    p = pp + 1
    assert out.makespan == pytest.approx((w + p - 1) * 3.0)
    # each stage idles (p - 1)(f + b): the textbook bubble
    for key, idle in out.idle.items():
        assert idle == pytest.approx((p - 1) * 3.0), key
    assert out.bubble[("language", 0)] == pytest.approx((p - 1) / (w + p - 1))


def test_a_stage_fed_by_a_slow_encoder_shows_the_wait():
    dps = {"vision": 2, "language": 2}
    fw, bw = _uniform(dps, 1, 2, 1.0, 2.0)
    fw["vision"][1, 0, :] = 5.0  # replica 1 drew the heavy images
    out = replay(fw, bw, dps, 2)
    assert out.wait[("language", 1, 0)] > out.wait[("language", 0, 0)] + 3.9
    assert out.wait[("language", 0, 0)] == pytest.approx(1.0)  # its own encoder's first forward
    assert out.makespan == pytest.approx(15.0)  # F0 F1 on the encoder, then B1 after the LM's B1 (13)


def test_frozen_encoder_needs_no_backward_and_bad_shapes_are_named():
    dps = {"vision": 1, "language": 1}
    fw, bw = _uniform(dps, 1, 3, 1.0, 2.0)
    del bw["vision"]
    out = replay(fw, bw, dps, 3, frozen=("vision",))
    assert out.makespan == pytest.approx(1 + 3 * 3.0)
    with pytest.raises(ValueError, match="one time per rank and micro-batch"):
        replay(fw, bw, dps, 3)
    fw["language"] = fw["language"] * -1
    with pytest.raises(ValueError, match="finite and >= 0"):
        replay(fw, bw, dps, 3, frozen=("vision",))


layouts = st.sampled_from([({"vision": 1, "language": 2}, 2), ({"vision": 2, "language": 1}, 1),
                           ({"vision": 2, "audio": 1, "language": 2}, 2), ({"vision": 1, "language": 1}, 3)])


@settings(max_examples=examples(40), deadline=None)
@given(layouts, st.integers(1, 4), st.data())
def test_makespan_covers_every_rank_and_equals_step_time_on_the_models_own_times(layout, w, data):
    dps, pp = layout
    grid = math.lcm(*dps.values())
    n = w * grid
    costs = {m: np.array(data.draw(st.lists(st.integers(1, 50), min_size=n, max_size=n)), float) for m in dps}
    fw, bw = {}, {}
    for m, d in dps.items():
        s = pp if m == "language" else 1
        cell = costs[m].reshape(w, d, grid // d).sum(axis=2).T  # (replica, micro-batch) loads
        fw[m] = np.repeat(cell[:, None, :] / (3 * s), s, axis=1)
        bw[m] = 2 * fw[m]
    out = replay(fw, bw, dps, w, stages={"language": pp})
    assert all(out.makespan >= busy - 1e-9 for busy in out.busy.values())
    assert all(v >= -1e-9 for v in out.wait.values())
    expect = step_time(costs, dps, list(range(n)), w, stages={"language": pp})
    assert out.makespan == pytest.approx(expect, rel=1e-9)
