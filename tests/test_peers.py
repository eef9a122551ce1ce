"""PR #4608's reorder_buffer (the peer ``reorder-buffer``), on cases worked by hand from its algorithm.

Per micro-batch, alone: most expensive first (ties: earlier position), each to the cheapest group
that still has room (ties: lower group id); the groups in group-id order, each group's samples in
the order they were placed. Group g goes to replica ``g // (G / dp)`` of a module with DP ``dp``,
G = lcm(module DPs).
"""

from __future__ import annotations

import numpy as np
import pytest

from mimo_accel.balance import module_loads
from mimo_accel.balance.peers import reorder_buffer_costs, reorder_buffer_order
from mimo_accel.grid import canonical_grid


def test_most_expensive_first_each_to_the_cheapest_group_with_room():
    # by cost: 1 (5), 3 (4), 2 (3), 0 (1). 1 -> g0 (both empty: lower id); 3 -> g1 (0 < 5);
    # 2 -> g1 (4 < 5), now full; 0 -> g0. Groups g0 [1, 0], g1 [3, 2], in placement order.
    assert reorder_buffer_order([1, 5, 3, 4], 2) == [1, 0, 3, 2]


def test_ties_go_by_position_then_to_the_lower_group():
    # all equal: placed 0, 1, 2, 3; 0 -> g0, 1 -> g1, 2 -> g0 (2 = 2: lower id), 3 -> g1
    assert reorder_buffer_order([2, 2, 2, 2], 2) == [0, 2, 1, 3]
    # 0 and 2 tie (3), 1 and 3 tie (1): placed 0, 2, 1, 3; 0 -> g0, 2 -> g1, 1 -> g0 (3 = 3), 3 -> g1
    assert reorder_buffer_order([3, 1, 3, 1], 2) == [0, 1, 2, 3]


PATCHES, TOKENS = [10, 0, 4, 6], [0, 100, 50, 20]


def test_the_defaults_price_patches_only():
    costs = reorder_buffer_costs(PATCHES, TOKENS)
    assert costs.tolist() == [10, 0, 4, 6]
    # by cost: 0 (10), 3 (6), 2 (4), 1 (0). 0 -> g0; 3 -> g1; 2 -> g1 (6 < 10), full; 1 -> g0
    assert reorder_buffer_order(costs, 2) == [0, 1, 3, 2]


def test_a_language_weight_prices_real_tokens_too():
    costs = reorder_buffer_costs(PATCHES, TOKENS, encoder_weight=1.0, language_weight=1.0)
    assert costs.tolist() == [10, 100, 54, 26]
    # by cost: 1 (100), 2 (54), 3 (26), 0 (10). 1 -> g0; 2 -> g1; 3 -> g1 (54 < 100), full; 0 -> g0
    assert reorder_buffer_order(costs, 2) == [1, 0, 2, 3]
    assert reorder_buffer_costs(PATCHES, TOKENS, encoder_weight=2.0, language_weight=0.5).tolist() == [20, 50, 33, 22]
    assert reorder_buffer_costs(PATCHES, TOKENS, encoder_weight=0.0, language_weight=1.0).tolist() == TOKENS


@pytest.mark.parametrize("weights", [(0.0, 0.0), (-1.0, 1.0), (1.0, float("nan")), (float("inf"), 0.0)])
def test_weights_upstream_refuses(weights):
    with pytest.raises(ValueError, match="at least one > 0"):
        reorder_buffer_costs(PATCHES, TOKENS, encoder_weight=weights[0], language_weight=weights[1])


def test_a_window_plans_each_micro_batch_alone():
    costs = [1, 5, 3, 4, 2, 2, 2, 2]
    # micro-batch 0 as in the first case; micro-batch 1 as the all-equal case, shifted by 4
    order = reorder_buffer_order(costs, 2, micro_batches=2)
    assert order == [1, 0, 3, 2, 4, 6, 5, 7]
    # no sample leaves its micro-batch, where one plan over the eight would move them: by cost
    # 1 (5), 3 (4), 2 (3), 4..7 (2), 0 (1); 1 -> g0, 3 -> g1, 2 -> g1 (4 < 5), 4 -> g0 (5 < 7),
    # 5 -> g0 (7 = 7: lower id), 6 -> g1 (7 < 9), 7 -> g0 (9 = 9), full; 0 -> g1
    assert reorder_buffer_order(costs, 2, micro_batches=1) == [1, 4, 5, 7, 3, 2, 6, 0]
    assert sorted(order[:4]) == [0, 1, 2, 3] and sorted(order[4:]) == [4, 5, 6, 7]


def test_fan_in_four_vision_replicas_into_two_language_replicas():
    dps = {"vision": 4, "language": 2}
    grid = canonical_grid(dps.values())
    assert grid == 4
    costs = [1, 8, 2, 7, 3, 6, 4, 5]
    # by cost: 1 (8), 3 (7), 5 (6), 7 (5), 6 (4), 4 (3), 2 (2), 0 (1); the first four open the four
    # groups, then 6 -> g3 (5), 4 -> g2 (6), 2 -> g1 (7), 0 -> g0 (8): every group 9
    order = reorder_buffer_order(costs, grid)
    assert order == [1, 0, 3, 2, 5, 4, 7, 6]
    loads = module_loads({m: np.asarray(costs, float) for m in dps}, dps, order)
    assert loads["vision"].tolist() == [[9, 9, 9, 9]] and loads["language"].tolist() == [[18, 18]]


def test_fan_out_balances_the_groups_not_the_replicas_that_own_several():
    dps = {"vision": 2, "language": 4}
    grid = canonical_grid(dps.values())
    costs = [3, 9, 1, 9]
    # one sample a group: by cost 1 (9), 3 (9), 0 (3), 2 (1), each to the next empty group
    order = reorder_buffer_order(costs, grid)
    assert order == [1, 3, 0, 2]
    # vision replica 0 owns groups 0 and 1: both heavy samples. Balancing G groups one micro-batch
    # at a time leaves the replicas that own several groups uneven.
    loads = module_loads({m: np.asarray(costs, float) for m in dps}, dps, order)
    assert loads["vision"].tolist() == [[18, 4]] and loads["language"].tolist() == [[9, 9, 3, 1]]


@pytest.mark.parametrize("costs, groups, micro_batches", [
    ([1, 2, 3], 2, 1),  # not a multiple of the groups
    ([1, 2, 3, 4], 2, 3),  # not whole micro-batches
    ([1, -2], 2, 1),
    ([1, float("nan")], 2, 1),
    ([1, 2], 0, 1),
])
def test_what_the_planner_refuses(costs, groups, micro_batches):
    with pytest.raises(ValueError):
        reorder_buffer_order(costs, groups, micro_batches)
