"""Properties and quality of the equal-size balanced partitioner (mimo_accel.balance)."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mimo_accel.balance import partition as balance
from mimo_accel.balance import (
    balanced_order,
    contiguous_order,
    group_costs,
    lower_bound,
    lpt_order,
    spread,
)
from mimo_accel.workloads import list_profiles, load_profile
from tests._hypothesis import examples
from tests._scripts import load_script

ROOT = Path(__file__).resolve().parents[1]
_kk = balance._kk_groups

# Relative slack for comparing float sums that were added up in different orders.
REL = 1e-9


def _load_bench():
    return load_script("benchmarks/bench_balance.py", "bench_balance")


@st.composite
def batches(draw, max_groups: int = 20, max_size: int = 8):
    """(costs, n_groups): skewed, tied, zero-heavy and tiny/huge cost mixes."""
    n_groups = draw(st.integers(1, max_groups))
    size = draw(st.integers(1, max_size))
    n = n_groups * size
    kind = draw(st.sampled_from(["floats", "ties", "zeros", "one_huge"]))
    if kind == "floats":
        costs = draw(st.lists(st.floats(0, 1e6, allow_nan=False), min_size=n, max_size=n))
    elif kind == "ties":
        costs = [float(x) for x in draw(st.lists(st.integers(0, 3), min_size=n, max_size=n))]
    elif kind == "zeros":
        costs = draw(st.lists(st.sampled_from([0.0, 0.0, 0.0, 1.5, 7.25]), min_size=n, max_size=n))
    else:
        costs = draw(st.lists(st.floats(0, 10, allow_nan=False), min_size=n, max_size=n))
        costs[draw(st.integers(0, n - 1))] = 1e9
    return costs, n_groups


# --------------------------------------------------------------------------------------------
# Properties
# --------------------------------------------------------------------------------------------


def _assert_never_worse(costs, order, k, others) -> None:
    """Never worse than each of ``others``, compared exactly on the whole units the planner ranks
    candidates by (each cost rounded to 2**-32 of the largest, so every rank sums alike); on the
    float costs, never worse by more than that rounding over one group."""
    n = len(costs)
    units = balance._exact(np.asarray(costs, dtype=np.float64))
    slack = (n // k) * max(costs, default=0.0) * 2.0**-32
    heaviest = group_costs(costs, order, k).max()
    for other in others:
        assert group_costs(units, order, k).max() <= group_costs(units, other, k).max()
        assert heaviest <= group_costs(costs, other, k).max() + slack


@settings(max_examples=examples(250), deadline=None)
@given(batches())
def test_balanced_order_properties(batch):
    costs, k = batch
    n = len(costs)
    order = balanced_order(costs, k)
    assert sorted(order) == list(range(n))  # every sample exactly once
    assert order == balanced_order([x * 2.0**600 for x in costs], k)  # only the ratios matter, exactly
    assert all(type(i) is int for i in order)
    blocks = [order[g * (n // k) : (g + 1) * (n // k)] for g in range(k)]
    assert all(len(b) == n // k for b in blocks)  # equal cardinality
    assert all(b == sorted(b) for b in blocks)  # ascending position inside a group
    assert [b[0] for b in blocks] == sorted(b[0] for b in blocks)  # groups by first sample

    g = group_costs(costs, order, k)
    lpt = lpt_order(costs, k)
    assert sorted(lpt) == list(range(n))
    _assert_never_worse(costs, order, k, (contiguous_order(n), lpt))

    bound = lower_bound(costs, k)
    assert g.max() >= bound * (1 - REL)
    s = spread(costs, order, k)
    assert s >= 1.0 - REL
    if g.mean() > 0:
        assert s >= bound / g.mean() * (1 - REL)
    else:
        assert s == 1.0


@settings(max_examples=examples(100), deadline=None)
@given(batches(max_groups=40))
def test_both_starts_are_equal_size_partitions(batch):
    # The internal starts feed the swap pass; each must already be a valid equal-size split.
    costs, k = batch
    c = np.asarray(costs, dtype=float)
    for start in (balance._kk_groups(c, k), balance._lpt_groups(c, k)):
        assert start.shape == (k, len(costs) // k)
        assert sorted(start.ravel().tolist()) == list(range(len(costs)))


@settings(max_examples=examples(150), deadline=None)
@given(batches(max_groups=40, max_size=12))
def test_lower_bound_loop_and_vectorised_agree_to_the_bit(batch):
    costs, k = batch
    c = np.asarray(costs, dtype=float)
    old = balance._LOOP_BOUND_TERMS
    try:
        balance._LOOP_BOUND_TERMS = 0
        vectorised = balance.unchecked_lower_bound(c, k)
    finally:
        balance._LOOP_BOUND_TERMS = old
    assert vectorised == balance._lower_bound_loop(c, k)


@settings(max_examples=examples(150), deadline=None)
@given(batches(max_groups=40, max_size=12))
def test_batched_lpt_is_the_heap_lpt(batch):
    # The numpy-batched LPT must make exactly the heap's choices, ties and zeros included.
    costs, k = batch
    c = np.asarray(costs, dtype=float)
    assert np.array_equal(balance._lpt_batched(c, k), balance._lpt_heap(c, k))


@pytest.mark.parametrize("seed", range(6))
def test_batched_lpt_is_the_heap_lpt_at_cluster_scale(seed):
    rng = np.random.default_rng(seed)
    k = int(rng.choice([64, 256, 512]))
    c = [rng.lognormal(0, 1.5, 8 * k),  # skewed
         rng.integers(0, 4, 8 * k).astype(float),  # heavy ties
         np.where(rng.random(8 * k) < 0.6, 0.0, rng.lognormal(3, 1, 8 * k))][seed % 3]  # mostly zeros
    assert np.array_equal(balance._lpt_batched(c, k), balance._lpt_heap(c, k))
    # the planners plan on the costs in exact units (see test_plans_do_not_depend_on_float_rounding)
    assert lpt_order(c, k) == balance._canonical(balance._lpt_heap(balance._exact(c), k))


@settings(max_examples=examples(100), deadline=None)
@given(st.lists(st.floats(min_value=0, max_value=1e9, allow_nan=False), min_size=1, max_size=300),
       st.randoms(use_true_random=False))
def test_plans_do_not_depend_on_float_rounding(costs, rnd):
    """Every rank must compute the same plan on any CPU: float sums can round differently with the
    order of the terms (vector width, pairwise summation), so the planners work on the costs in
    whole units of the largest, whose sums are exact in any order."""
    exact = balance._exact(np.asarray(costs, dtype=float))
    assert np.all(exact == np.rint(exact))
    shuffled = list(exact)
    rnd.shuffle(shuffled)
    assert math.fsum(exact) == sum(shuffled) == float(np.sum(exact)) == float(np.cumsum(shuffled[::-1])[-1])
    # monotone: the order of the costs, and their ties, are kept
    c = np.asarray(costs, dtype=float)
    i, j = np.argsort(c, kind="stable")[[0, -1]]
    assert exact[i] <= exact[j]


@settings(max_examples=examples(100), deadline=None)
@given(st.integers(1, 30), st.integers(1, 40), st.integers(0, 2**32 - 1), st.sampled_from(["lognormal", "ties"]))
def test_sorted_search_finds_the_brute_force_best_swap(pairs, size, seed, kind):
    # Large groups search sorted columns instead of comparing all size² swaps; both must find a
    # swap of the same quality (ties may pick different slots).
    rng = np.random.default_rng(seed)
    shape = (size, 2 * pairs)
    vals = rng.lognormal(0, 1, shape) if kind == "lognormal" else rng.integers(0, 5, shape).astype(float)
    sums = vals.sum(axis=0)
    rank = np.argsort(sums, kind="stable")
    heavy, light = rank[::-1][:pairs], rank[:pairs]
    old = balance._BRUTE_FORCE_SIZE
    try:
        balance._BRUTE_FORCE_SIZE = 10**9
        a1, b1, g1 = balance._best_swaps(vals, sums, heavy, light)
        balance._BRUTE_FORCE_SIZE = 0
        a2, b2, g2 = balance._best_swaps(vals, sums, heavy, light)
    finally:
        balance._BRUTE_FORCE_SIZE = old
    assert g2 == pytest.approx(g1, rel=1e-9, abs=1e-9)
    half_gap = (sums[heavy] - sums[light]) / 2
    for a, b, gain in ((a1, b1, g1), (a2, b2, g2)):  # each reported gain is its swap's
        moved = vals[a, heavy] - vals[b, light]
        assert half_gap - np.abs(moved - half_gap) == pytest.approx(gain, rel=1e-9, abs=1e-9)


@st.composite
def wide_batches(draw):
    """The fast path's shapes: many groups (pair rounds), or large groups (sorted search)."""
    if draw(st.booleans()):
        k, size = draw(st.integers(16, 48)), draw(st.integers(1, 8))
    else:
        k, size = draw(st.integers(2, 20)), draw(st.integers(17, 24))
    seed = draw(st.integers(0, 2**32 - 1))
    kind = draw(st.sampled_from(["lognormal", "ties", "zeros", "one_huge"]))
    rng = np.random.default_rng(seed)
    n = k * size
    if kind == "lognormal":
        costs = rng.lognormal(0, 1.5, n)
    elif kind == "ties":
        costs = rng.integers(0, 4, n).astype(float)
    elif kind == "zeros":
        costs = np.where(rng.random(n) < 0.7, 0.0, rng.lognormal(0, 1, n))
    else:
        costs = rng.random(n) * 10
        costs[rng.integers(n)] = 1e9
    return costs.tolist(), k


@settings(max_examples=examples(60), deadline=None)
@given(wide_batches())
def test_fast_path_properties(batch):
    costs, k = batch
    n = len(costs)
    order = balanced_order(costs, k)
    assert sorted(order) == list(range(n))
    blocks = [order[g * (n // k) : (g + 1) * (n // k)] for g in range(k)]
    assert all(b == sorted(b) for b in blocks)
    assert [b[0] for b in blocks] == sorted(b[0] for b in blocks)
    g = group_costs(costs, order, k)
    _assert_never_worse(costs, order, k, (lpt_order(costs, k), contiguous_order(n)))
    assert g.max() >= lower_bound(costs, k) * (1 - REL)
    # The swap pass alone, made to spend its whole budget (stop 0), never raises the heaviest
    # group and keeps an equal-size partition.
    c = np.asarray(costs)
    start = balance._lpt_groups(c, k)
    improved = balance._improve(c, start, 0.0)
    assert sorted(improved.ravel().tolist()) == list(range(n)) and improved.shape == start.shape
    assert c[improved].sum(axis=1).max() <= c[start].sum(axis=1).max() * (1 + REL)


def test_kk_start_is_used_when_lpt_leaves_many_groups_above_target(monkeypatch, pools):
    calls = []
    monkeypatch.setattr(balance, "_kk_groups", lambda c, k: calls.append(k) or _kk(c, k))
    costs = pools["documents"][: 64 * 8]
    order = balanced_order(costs, 64)
    assert calls == [64]
    assert spread(costs, order, 64) < spread(costs, lpt_order(costs, 64), 64)


def _optimum(costs: list[float], k: int) -> float:
    """Exact smallest largest-group cost by exhaustive search (tiny inputs only)."""
    size = len(costs) // k
    best = float("inf")

    def search(rest: tuple[int, ...], worst: float) -> None:
        nonlocal best
        if not rest:
            best = min(best, worst)
            return
        for others in itertools.combinations(rest[1:], size - 1):
            group = (rest[0], *others)
            w = max(worst, sum(costs[i] for i in group))
            if w < best:
                search(tuple(i for i in rest if i not in group), w)

    search(tuple(range(len(costs))), 0.0)
    return best


def test_lower_bound_is_valid_and_balanced_is_near_optimal_on_tiny_inputs():
    rng = np.random.default_rng(7)
    optimal = total = 0
    for trial in range(200):
        k, size = int(rng.integers(2, 5)), int(rng.integers(1, 4))
        if trial % 2:
            costs = rng.lognormal(0, 1.5, k * size)
        else:
            costs = rng.integers(0, 5, k * size).astype(float)
        opt = _optimum(costs.tolist(), k)
        got = group_costs(costs, balanced_order(costs, k), k).max()
        assert lower_bound(costs, k) <= opt * (1 + REL) + REL
        assert got >= opt * (1 - REL) - REL
        total += 1
        optimal += got <= opt * (1 + REL) + REL
    # Not a guarantee (the problem is NP-hard), a regression tripwire: today 199 of 200.
    assert optimal >= 0.97 * total


def test_two_per_group_lower_bound_is_the_sorted_pairing():
    # For two samples per group the optimum pairs the i-th largest with the i-th smallest.
    rng = np.random.default_rng(3)
    for _ in range(50):
        costs = rng.lognormal(0, 2, 12)
        s = np.sort(costs)
        assert lower_bound(costs, 6) == pytest.approx((s + s[::-1]).max(), rel=1e-12)


def test_deterministic_in_process_and_across_processes():
    rng = np.random.default_rng(11)
    costs = np.round(rng.lognormal(3, 1.2, 48), 3).tolist()
    expected = balanced_order(costs, 6)
    assert balanced_order(costs, 6) == expected
    assert balanced_order(np.asarray(costs), 6) == expected
    code = (
        "import json, sys; from mimo_accel.balance import balanced_order;"
        "print(json.dumps(balanced_order(json.loads(sys.argv[1]), 6)))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, json.dumps(costs)],
        capture_output=True, text=True, check=True, cwd=ROOT,
        env={"PYTHONHASHSEED": "12345", "PATH": ""},
    )
    assert json.loads(out.stdout) == expected


def test_deterministic_across_processes_at_cluster_scale():
    # The fast path (batched LPT, KK, pair rounds, budgets) bounds its work by counts, never by
    # time: every rank, fast or slow, computes the same plan.
    costs = np.round(load_profile("documents").sample_table(4096, 3).costs(), 2).tolist()
    expected = balanced_order(costs, 512)
    code = (
        "import json, sys; from mimo_accel.balance import balanced_order;"
        "print(json.dumps(balanced_order(json.loads(sys.stdin.read()), 512)))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], input=json.dumps(costs), capture_output=True, text=True, check=True,
        cwd=ROOT, env={"PYTHONHASHSEED": "999", "PATH": ""},
    )
    assert json.loads(out.stdout) == expected
    assert "import time" not in Path(balance.__file__).read_text()  # no clock anywhere in the planner


def test_ties_keep_the_contiguous_order():
    # Already balanced input (and all-equal or all-zero costs) is left exactly as it is.
    assert balanced_order([1.0] * 12, 4) == list(range(12))
    assert balanced_order([0.0] * 8, 2) == list(range(8))
    assert balanced_order([3, 1, 1, 3, 2, 2], 3) == list(range(6))


def test_trivial_splits():
    assert balanced_order([], 3) == []
    assert lpt_order([], 3) == []
    assert balanced_order([5.0, 1.0, 2.0], 1) == [0, 1, 2]
    assert balanced_order([5.0, 1.0, 2.0], 3) == [0, 1, 2]
    assert spread([], [], 2) == 1.0
    assert spread([0.0, 0.0], [1, 0], 2) == 1.0


def test_known_small_case():
    # Heavy samples 0 and 1 start in the same contiguous group; balancing separates them.
    costs = [10.0, 9.0, 1.0, 1.0, 2.0, 2.0, 1.0, 1.0]
    order = balanced_order(costs, 2)
    assert group_costs(costs, order, 2).max() == 14.0  # optimum: {10, 2, 1, 1} and {9, 2, 1, 1}
    assert spread(costs, contiguous_order(8), 2) == pytest.approx(21 / 13.5)


def test_window_of_micro_batches_is_one_bigger_split():
    rng = np.random.default_rng(5)
    costs = rng.lognormal(0, 1, 4 * 3 * 4)  # 4 micro-batches x 3 groups x 4 samples
    order = balanced_order(costs, 12)
    assert sorted(order) == list(range(costs.size))
    assert spread(costs, order, 12) <= spread(costs, lpt_order(costs, 12), 12)


# --------------------------------------------------------------------------------------------
# Bad input
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("costs", "k", "message"),
    [
        (
            [1.0] * 10,
            3,
            "10 samples cannot be split into 3 equal groups; make the global micro-batch size a multiple of 3",
        ),
        ([1.0] * 4, 0, "n_groups must be >= 1"),
        ([1.0] * 4, -2, "n_groups must be >= 1"),
        ([1.0] * 4, 2.0, "n_groups must be an integer"),
        ([1.0] * 4, True, "n_groups must be an integer"),
        ([1.0, float("nan"), 1.0, 1.0], 2, "cost of sample 1 is nan (NaN or infinite); fix the cost model"),
        ([1.0, 1.0, float("inf"), 1.0], 2, "cost of sample 2 is inf"),
        ([1.0, -0.5, 1.0, 1.0], 2, "cost of sample 1 is negative (-0.5); costs must be >= 0"),
        ([[1.0, 2.0], [3.0, 4.0]], 2, "costs must be 1-D (one cost per sample), got shape (2, 2)"),
        (["a", "b"], 2, "costs must be a 1-D sequence of numbers"),
    ],
)
def test_bad_input_is_refused_with_the_fix(costs, k, message):
    for fn in (balanced_order, lpt_order, lower_bound):
        with pytest.raises(ValueError) as err:
            fn(costs, k)
        assert message in str(err.value)


def test_group_costs_refuses_a_non_permutation():
    with pytest.raises(ValueError, match=r"order must be a permutation of range\(4\)"):
        group_costs([1, 2, 3, 4], [0, 0, 1, 2], 2)
    with pytest.raises(ValueError, match="permutation"):
        group_costs([1, 2, 3, 4], [0, 1, 2], 2)


# --------------------------------------------------------------------------------------------
# Quality on realistic workloads (a quality gate, not a timing)
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pools():
    bench = _load_bench()
    return {name: bench.workload_costs(name, 4000, seed=0) for name in bench.WORKLOADS}


@pytest.mark.parametrize("workload", ["receipts", "documents", "chat"])
def test_quality_on_realistic_workloads(pools, workload):
    """Median spread <= 1.02, or within 2% of the lower bound where the bound is above that.

    With few samples per group a single large sample (or the sorted-pairing bound for two per
    group) can put the lower bound itself above 1.02 x mean; no split can then reach 1.02, so
    the target becomes 1.02 x the bound. Either way: median(max group / (1.02 x bound)) <= 1,
    where bound >= mean, so where the bound equals the mean this is exactly spread <= 1.02.
    """
    pool = pools[workload]
    rng = np.random.default_rng(1)
    for k in (4, 8, 16, 32):
        for size in (2, 4, 8, 16):
            ratio, beats_lpt = [], 0
            for _ in range(30):
                costs = pool[rng.integers(pool.size, size=k * size)]
                g = group_costs(costs, balanced_order(costs, k), k)
                bound = lower_bound(costs, k)
                ratio.append(g.max() / bound if bound > 0 else 1.0)  # all text-only: nothing to balance
                beats_lpt += g.max() <= group_costs(costs, lpt_order(costs, k), k).max()
            assert np.median(ratio) <= 1.02, (workload, k, size, np.median(ratio))
            assert beats_lpt == 30
            if size >= 8:  # enough samples per group: the bound is the mean, spread itself <= 1.02
                assert np.median(ratio) <= 1.005, (workload, k, size, np.median(ratio))


@pytest.mark.parametrize("profile", ["receipts", "mixed_chat", "uniform", "documents"])
def test_quality_at_cluster_scale_on_the_shipped_profiles(profile):
    """4096 samples / 512 groups (a quality gate; the timing is benchmarks/bench_balance.py):
    median spread within 0.5% of the lower bound, and never above LPT. documents is the
    exception the bound's docstring names: whole pages at the resize cap come in near-multiples
    of one page cost, so group totals can only take a few values and the bound (the mean) is out
    of reach; there the gate is 2% and a clear gain over LPT."""
    costs = load_profile(profile).sample_table(4096 * 5, 1).costs().reshape(5, 4096)
    gaps, gains = [], []
    for c in costs:
        bound = lower_bound(c, 512)
        ours = group_costs(c, balanced_order(c, 512), 512).max()
        lpt = group_costs(c, lpt_order(c, 512), 512).max()
        assert ours <= lpt
        gaps.append(ours / bound - 1 if bound > 0 else 0.0)
        gains.append(lpt / ours - 1 if ours > 0 else 0.0)
    if profile == "documents":
        assert np.median(gaps) <= 0.02 and np.median(gains) > 0.002, (gaps, gains)
    else:
        assert np.median(gaps) <= 0.005, gaps


@pytest.mark.parametrize("workload", ["receipts", "documents", "chat"])
def test_quality_at_cluster_scale_on_synthetic_workloads(pools, workload):
    rng = np.random.default_rng(9)
    pool = pools[workload]
    gaps = []
    for _ in range(4):
        c = pool[rng.integers(pool.size, size=4096)]
        gaps.append(group_costs(c, balanced_order(c, 512), 512).max() / lower_bound(c, 512) - 1)
    assert np.median(gaps) <= 0.005, gaps


def test_shipped_profiles_are_the_benchmark_profiles():
    bench = _load_bench()
    assert list_profiles() == ["documents", "mixed_chat", "receipts", "uniform"]
    assert bench.SIZES == ((64, 8), (512, 64), (4096, 512))
    batches = bench.profile_batches("receipts", 64, 3, seed=0)
    assert len(batches) == 3 and all(b.shape == (64,) for b in batches)


def test_balancing_beats_the_contiguous_split_by_a_wide_margin(pools):
    rng = np.random.default_rng(2)
    pool = pools["receipts"]
    before, after = [], []
    for _ in range(50):
        costs = pool[rng.integers(pool.size, size=64)]
        before.append(spread(costs, contiguous_order(64), 8))
        after.append(spread(costs, balanced_order(costs, 8), 8))
    assert np.median(before) > 1.15
    assert np.median(after) < 1.01


# --------------------------------------------------------------------------------------------
# balance_modules: every module at once


@st.composite
def module_batches(draw):
    """(costs per module, DPs, micro_batches): chains and non-chains of DPs, an encoder that some
    samples lack, ties, zeros and one huge sample, tiny and subnormal costs."""
    from math import lcm

    dps = {"vision": draw(st.sampled_from([1, 2, 3, 4])), "language": draw(st.sampled_from([1, 2, 4, 6]))}
    if draw(st.booleans()):
        dps["audio"] = draw(st.sampled_from([1, 2, 3]))
    micro_batches = draw(st.sampled_from([1, 1, 2]))
    grid = lcm(*dps.values()) * micro_batches
    n = grid * draw(st.integers(1, 4))
    kind = draw(st.sampled_from(["floats", "ties", "zeros", "one_huge", "tiny"]))
    costs = {}
    for name in dps:
        if kind == "floats":
            c = draw(st.lists(st.floats(0, 1e6, allow_nan=False), min_size=n, max_size=n))
        elif kind == "ties":
            c = [float(x) for x in draw(st.lists(st.integers(0, 3), min_size=n, max_size=n))]
        elif kind == "zeros":
            c = draw(st.lists(st.sampled_from([0.0, 0.0, 1.5, 7.25]), min_size=n, max_size=n))
        elif kind == "tiny":
            c = draw(st.lists(st.sampled_from([0.0, 5e-324, 1e-320, 1e-300]), min_size=n, max_size=n))
        else:
            c = draw(st.lists(st.floats(0, 10, allow_nan=False), min_size=n, max_size=n))
            c[draw(st.integers(0, n - 1))] = 1e9
        costs[name] = c
    return costs, dps, micro_batches


@settings(max_examples=examples(40), deadline=None)
@given(module_batches(), st.integers(1, 3))
def test_swaps_searched_a_block_of_pairs_at_a_time_give_the_same_plan(batch, block):
    from mimo_accel.balance import balance_modules
    from mimo_accel.balance import joint

    costs, dps, micro_batches = batch
    whole = balance_modules(costs, dps, micro_batches)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(joint, "_PAIRS_PER_BLOCK", block)  # these small grids have a few pairs
        assert balance_modules(costs, dps, micro_batches) == whole


def test_swaps_in_blocks_at_the_size_that_blocks_give_the_same_plan():
    from mimo_accel.balance import balance_modules
    from mimo_accel.balance import joint

    rng = np.random.default_rng(7)
    dps, micro_batches = {"vision": 64, "language": 32}, 4  # 256 groups: over a block of pairs
    costs = {m: (rng.pareto(1.5, 256 * 8) + 0.1).tolist() for m in dps}
    whole = balance_modules(costs, dps, micro_batches)
    searched = []
    original = joint._best_swaps

    def counting(q, groups, under, reps, g, h, shift):
        searched.append(len(g))
        return original(q, groups, under, reps, g, h, shift)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(joint, "_PAIRS_PER_BLOCK", 16)
        mp.setattr(joint, "_best_swaps", counting)
        assert balance_modules(costs, dps, micro_batches) == whole
    assert max(searched) > 16  # some searches did run in several blocks


def _worst_over_bound(costs, dps, order, micro_batches):
    from mimo_accel.balance import module_bounds, module_spreads

    spreads = module_spreads(costs, dps, order, micro_batches)
    bounds = module_bounds(costs, dps, micro_batches)
    return max(spreads[m] / bounds[m] for m in dps)


@settings(max_examples=examples(200), deadline=None)
@given(module_batches())
def test_balance_modules_properties(batch):
    from mimo_accel.balance import balance_modules

    costs, dps, micro_batches = batch
    n = len(costs["vision"])
    order = balance_modules(costs, dps, micro_batches)
    assert sorted(order) == list(range(n)) and all(type(i) is int for i in order)  # each sample once
    from math import lcm

    g = lcm(*dps.values()) * micro_batches
    blocks = [order[i * (n // g):(i + 1) * (n // g)] for i in range(g)]
    assert all(b == sorted(b) for b in blocks)  # ascending position inside a group
    assert order == balance_modules(costs, dps, micro_batches)  # the same plan again
    # only the ratios of costs matter, and exactly so: a power-of-two scale (exact in floats) gives
    # the same plan, however tiny the costs (a subnormal largest cost included)
    assert order == balance_modules({m: [x * 2.0**600 for x in c] for m, c in costs.items()}, dps, micro_batches)
    # never worse than the contiguous split for the worst module, on its bound (within the
    # integer units the planner compares in: 2**-20 of a replica's mean load per sample)
    slack = 1e-6 + n * 2.0**-20
    assert _worst_over_bound(costs, dps, order, micro_batches) <= \
        _worst_over_bound(costs, dps, contiguous_order(n), micro_batches) * (1 + slack)
