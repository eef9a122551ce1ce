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


# ------------------------------------------------------------------------ who bounds the step
# Upstream's validated layout in small: one encoder replica (images dp1) feeding two language
# replicas of two PP stages each, two micro-batches. Worked by hand, op by op:


def _validated(encoder, language, slow_backward=None):
    """(forward, backward) tables: ``encoder`` / ``language`` = (f, b) seconds per micro-batch (a
    language stage's); ``slow_backward``: language replica 1 stage 1's backward instead."""
    dps = {"images": 1, "language": 2}
    fw = {"images": np.full((1, 1, 2), encoder[0]), "language": np.full((2, 2, 2), language[0])}
    bw = {"images": np.full((1, 1, 2), encoder[1]), "language": np.full((2, 2, 2), language[1])}
    if slow_backward is not None:
        bw["language"][1, 1, :] = slow_backward
    return fw, bw, dps


def test_a_heavy_encoder_bounds_the_step_and_the_language_ranks_wait():
    # encoder F0 [0,2] F1 [2,4]; each language replica: stage 0 F0 [2,3], stage 1 F0 [3,4] B0 [4,6],
    # stage 0 F1 [4,5] (its encoder forward) B0 [6,8], stage 1 F1 [6,7] B1 [7,9], stage 0 B1 [9,11];
    # encoder B0 [8,12] B1 [12,16]: a 16 s step, the encoder busy 12 s, each language stage 3 + 3 s
    from mimo_accel.balance.replay import bound_module, module_shares, replay

    fw, bw, dps = _validated((2.0, 4.0), (1.0, 2.0))
    out = replay(fw, bw, dps, 2, stages={"language": 2})
    assert out.makespan == pytest.approx(16.0)
    shares = module_shares(out)
    assert shares["images"].busy == pytest.approx(0.75) and shares["images"].busy_max == pytest.approx(0.75)
    assert shares["language"].busy == pytest.approx(6 / 16) and shares["language"].wait == pytest.approx(10 / 16)
    assert bound_module(shares) == "images"


def test_a_slow_language_stage_bounds_the_step_through_its_busiest_device():
    # as a 12 s step of (1, 2) everywhere, but replica 1's stage 1 backward takes 3 s: its B0 [3,6],
    # F1 [6,7], B1 [7,10]; its stage 0 B1 [10,12]; the encoder's B1 waits for it: [12,14]
    from mimo_accel.balance.replay import bound_module, module_shares, replay

    fw, bw, dps = _validated((1.0, 2.0), (1.0, 2.0), slow_backward=3.0)
    out = replay(fw, bw, dps, 2, stages={"language": 2})
    assert out.makespan == pytest.approx(14.0)
    shares = module_shares(out)
    assert shares["images"].busy == pytest.approx(6 / 14)
    assert shares["language"].busy == pytest.approx((6 + 6 + 6 + 8) / 4 / 14)  # the mean over its 4 devices
    assert shares["language"].busy_max == pytest.approx(8 / 14)
    assert bound_module(shares) == "language"


def test_a_tie_names_the_encoder_and_no_time_names_nobody():
    from mimo_accel.balance.replay import Shares, bound_module, module_shares, replay

    fw, bw, dps = _validated((1.0, 2.0), (1.0, 2.0))  # every device busy 6 of a 12 s step
    shares = module_shares(replay(fw, bw, dps, 2, stages={"language": 2}))
    assert shares["images"].busy_max == pytest.approx(shares["language"].busy_max) == pytest.approx(0.5)
    assert bound_module(shares) == "images"
    assert bound_module({"language": Shares(0.5, 0.5), "video": Shares(0.5, 0.5), "audio": Shares(0.5, 0.5)}) == "audio"
    assert bound_module({"language": Shares(0.0, 0.0)}) is None and bound_module({}) is None
    nothing = {m: np.zeros_like(a) for m, a in fw.items()}
    zero = module_shares(replay(nothing, nothing, dps, 2, stages={"language": 2}))
    assert all(s.busy == 0.0 for s in zero.values())


def test_ranks_are_placed_on_their_stages_and_a_stage_is_its_slowest_rank():
    # language dp2 pp2 tp2 after one encoder rank: rank = 1 + stage·4 + replica·2 + tp (pp slowest)
    from mimo_accel.balance.replay import places, replay, replay_ranks

    ranks = [(0, "images", 0)] + [(1 + p * 4 + r * 2 + t, "language", r)
                                  for p in range(2) for r in range(2) for t in range(2)]
    placed = places(ranks, {"language": 2})
    assert placed[0] == ("images", 0, 0)
    assert [placed[k] for k in (1, 2, 3, 5, 8)] == [("language", 0, 0), ("language", 0, 0), ("language", 1, 0),
                                                   ("language", 0, 1), ("language", 1, 1)]
    times = {0: ([2.0, 2.0], [4.0, 4.0])}
    # each TP pair: one rank as timed by hand, its peer faster: the op takes the slower's time
    times.update({rank: ([1.0, 1.0], [2.0, 2.0]) if rank % 2 else ([0.5, 0.2], [1.0, 1.5]) for rank in range(1, 9)})
    got = replay_ranks(times, placed, {"images": 1, "language": 2}, {"language": 2})
    fw, bw, dps = _validated((2.0, 4.0), (1.0, 2.0))
    assert got == replay(fw, bw, dps, 2, stages={"language": 2})
    times[8] = ([1.0], [2.0])
    with pytest.raises(ValueError, match="language replica 1 stage 1 timed 2 and 1 micro-batches"):
        replay_ranks(times, placed, {"images": 1, "language": 2}, {"language": 2})
    del times[8], times[7]
    with pytest.raises(ValueError, match="no rank of language replica 1 stage 1"):
        replay_ranks(times, placed, {"images": 1, "language": 2}, {"language": 2})
