"""Equal-cardinality balanced partitioning of a micro-batch's samples into groups.

A global micro-batch of N samples is cut into ``n_groups`` contiguous equal-size groups (the
canonical grid's); :func:`balanced_order` permutes the samples so that every group carries about
the same cost. An order is a permutation of ``range(N)`` whose consecutive blocks of
``N // n_groups`` entries are the groups; a window of several micro-batches is ``balanced_order``
over the concatenated costs with ``n_groups = micro_batches * groups``. Pure and deterministic:
ties go to sample position and the work is bounded by round and candidate budgets, never a clock,
so every rank computes the same order. At 4096 samples and 512 groups
(``benchmarks/bench_balance.py``) LPT runs as numpy batches that reproduce the heap's choices, and
the swap pass improves up to ``n_groups / 2`` disjoint pairs per vectorised round.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

import numpy as np

__all__ = [
    "balanced_order",
    "contiguous_order",
    "group_costs",
    "lower_bound",
    "lpt_order",
    "spread",
]

_CostsLike = Sequence[float] | np.ndarray

# The distance to the lower bound below which balancing stops, since no step time can tell 0.1%
# apart; the smallest relative gain worth a swap, so float noise cannot keep a pass going.
# Candidates are compared on exact sums at the end.
_GOOD_ENOUGH = 1e-3
_MIN_GAIN = 1e-12
# Groups left above the stop by LPT beyond which a Karmarkar-Karp start is tried as well.
_KK_AFTER_GROUPS_ABOVE = 8
# Work bounds of the swap pass (rounds and candidate swaps, never time, so every rank stops at
# the same point). From _PAIR_FROM_GROUPS groups, up to _PAIR_ROUNDS rounds that each pair every
# group above the stop (at most half of them) with a lighter one; then rounds that move the
# heaviest group against every other, at most 4 per group and _TAIL_WORK candidate swaps in all.
# The budgets bind only where the stop is out of reach (e.g. whole-page document costs); at 4096
# samples / 512 groups the pass then takes 16 + 4 rounds.
_PAIR_FROM_GROUPS = 16
_PAIR_ROUNDS = 16
_TAIL_WORK = 1 << 17
# Groups up to this size compare all size² swaps of a pair at once; larger ones search sorted.
_BRUTE_FORCE_SIZE = 16
# Whole units a cost is rounded to, relative to the largest (sums stay exact below 2**53).
_EXACT_UNITS = float(1 << 32)
# Up to this many terms (samples per group + groups) the lower bound is a plain loop.
_LOOP_BOUND_TERMS = 64
# From this many samples LPT runs as numpy batches; below, the plain heap is as fast (heavy-tailed
# costs make short batches: receipts at 1024 samples take ~35 of them).
_LPT_BATCH_FROM = 2048


def _validate(costs: _CostsLike, n_groups: int) -> np.ndarray:
    if isinstance(n_groups, bool) or not isinstance(n_groups, (int, np.integer)):
        raise ValueError(f"n_groups must be an integer, got {n_groups!r}")
    if n_groups < 1:
        raise ValueError(f"n_groups must be >= 1, got {n_groups}; pass the number of data-parallel groups")
    try:
        c = np.asarray(costs, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError("costs must be a 1-D sequence of numbers, one per sample") from None
    if c.ndim != 1:
        raise ValueError(f"costs must be 1-D (one cost per sample), got shape {c.shape}; flatten or pass one batch")
    if c.size % n_groups:
        raise ValueError(
            f"{c.size} samples cannot be split into {n_groups} equal groups; make the global"
            f" micro-batch size a multiple of {n_groups} (the canonical grid size)"
        )
    # argmin/argmax stop at the first NaN, so one comparison each covers NaN, inf and < 0.
    if c.size and not (c[c.argmin()] >= 0 and c[c.argmax()] < np.inf):
        bad = ~np.isfinite(c)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise ValueError(f"cost of sample {i} is {c[i]} (NaN or infinite); fix the cost model or cost index")
        i = int(np.flatnonzero(c < 0)[0])
        raise ValueError(
            f"cost of sample {i} is negative ({c[i]}); costs must be >= 0, fix the cost model or cost index"
        )
    return c


def _exact(c: np.ndarray) -> np.ndarray:
    """The costs as whole numbers of a unit 2**-32 of the largest (still float64): every sum of
    them is then exact, so no float rounding — which can differ between CPUs and vector widths —
    decides a plan, and every rank computes the same one. Dividing, scaling and rounding each cost
    alone are correctly rounded IEEE operations; equal costs stay equal and the order of costs is kept."""
    if not c.size:
        return c
    top = c[c.argmax()]
    if not top > 0:
        return c
    return np.rint((c / top) * _EXACT_UNITS)  # divide first: 2**32 / a subnormal top overflows


def contiguous_order(n: int) -> list[int]:
    """The identity order: the upstream contiguous split."""
    return list(range(n))


def group_costs(costs: _CostsLike, order: Sequence[int] | np.ndarray, n_groups: int) -> np.ndarray:
    """Total cost of each group of ``order`` (float64 array of length ``n_groups``)."""
    c = _validate(costs, n_groups)
    o = np.asarray(order, dtype=np.int64)
    if o.shape != c.shape or not np.array_equal(np.sort(o), np.arange(c.size)):
        raise ValueError(f"order must be a permutation of range({c.size})")
    return c[o].reshape(n_groups, -1).sum(axis=1)


def spread(costs: _CostsLike, order: Sequence[int] | np.ndarray, n_groups: int) -> float:
    """Imbalance of ``order``: largest group cost over mean group cost (1.0 is perfect)."""
    g = group_costs(costs, order, n_groups)
    mean = g.mean() if g.size else 0.0
    return float(g.max() / mean) if mean > 0 else 1.0


def lower_bound(costs: _CostsLike, n_groups: int) -> float:
    """A lower bound on the largest group cost of any equal-size split.

    With ``c_0 >= c_1 >= ...`` the costs, ``k`` groups and ``size = N / k`` samples per group, the
    largest of:

    - the mean group cost, ``sum(c) / k``;
    - pigeonhole: of the t most expensive samples some group holds q = ceil(t / k), costing at
      least the q cheapest of those t plus the ``size - q`` cheapest samples. For q = 1 this is
      "the largest sample plus the ``size - 1`` cheapest": with equal cardinality a heavy sample
      cannot sit alone, so the bound is ``c_0 + cheapest fill``, not ``max(mean, c_0)``;
    - for each i < k, the smaller of two cases: two of the top i + 1 share a group
      (>= c_{i-1} + c_i + fill), or they sit in i + 1 groups whose (i + 1)(size - 1) other
      members are distinct samples (>= c_i + the largest of those + fill, and >= c_i + their
      mean per group). For two samples per group this is exact: the sorted pairing's cost.

    It ignores granularity: where costs come in near-multiples of a unit (whole pages at the resize
    cap) the best splits stay above it (0.5 % in the documents profile's median micro-batch)."""
    return unchecked_lower_bound(_validate(costs, n_groups), n_groups)


def unchecked_lower_bound(c: np.ndarray, n_groups: int) -> float:
    """:func:`lower_bound` of costs already checked (a 1-D float64 array)."""
    n = c.size
    if n == 0:
        return 0.0
    size = n // n_groups
    if size + n_groups <= _LOOP_BOUND_TERMS:
        return _lower_bound_loop(c, n_groups)
    asc = np.sort(c)
    prefix = np.concatenate(([0.0], np.cumsum(asc)))  # prefix[j]: sum of the j cheapest
    bound = float(prefix[n] / n_groups)
    # Pigeonhole, largest at the smallest t = (q - 1) * n_groups + 1, where the q cheapest of the
    # top t are asc[lo : lo + q].
    q = np.arange(1, size + 1)
    lo = n - (q - 1) * n_groups - 1
    bound = max(bound, float((prefix[lo + q] - prefix[lo] + prefix[size - q]).max()))
    if size >= 2:
        fill = prefix[size - 2]
        i = np.arange(n_groups)
        top = asc[n - 1 - i]
        partners = (i + 1) * (size - 1)
        apart = np.maximum(top + asc[partners - 1] + fill, top + prefix[partners] / (i + 1))
        together = apart.copy()
        together[1:] = asc[n - i[1:]] + top[1:] + fill
        bound = max(bound, float(np.minimum(apart, together).max()))
    return bound


def _lower_bound_loop(c: np.ndarray, n_groups: int) -> float:
    """:func:`unchecked_lower_bound` term by term in plain floats, the same operations in the same order
    (so the same value to the bit): cheaper than numpy's per-call cost for a few terms."""
    n = c.size
    size = n // n_groups
    asc = np.sort(c)
    prefix = [0.0, *np.cumsum(asc).tolist()]  # prefix[j]: sum of the j cheapest
    asc = asc.tolist()
    bound = prefix[n] / n_groups
    for q in range(1, size + 1):
        lo = n - (q - 1) * n_groups - 1
        bound = max(bound, prefix[lo + q] - prefix[lo] + prefix[size - q])
    if size >= 2:
        fill = prefix[size - 2]
        for i in range(n_groups):
            top = asc[n - 1 - i]
            partners = (i + 1) * (size - 1)
            apart = max(top + asc[partners - 1] + fill, top + prefix[partners] / (i + 1))
            together = asc[n - i] + top + fill if i else apart
            bound = max(bound, min(apart, together))
    return float(bound)


def lpt_order(costs: _CostsLike, n_groups: int) -> list[int]:
    """Equal-size LPT: most expensive first, each to the cheapest group that still has room.

    Ties go to the lower group id and to the earlier sample.
    """
    c = _exact(_validate(costs, n_groups))
    if c.size == 0:
        return []
    return _canonical(_lpt_groups(c, n_groups))


def balanced_order(costs: _CostsLike, n_groups: int) -> list[int]:
    """A permutation of ``range(len(costs))`` whose equal-size blocks have near-equal cost.

    Equal-size LPT gives a first split and, where it leaves many groups above target, Karmarkar-Karp
    generalised to k equal-size groups a second; a swap pass lowers the heavy groups of the better one
    (many disjoint pairs at a time, then the heaviest against every other) until the heaviest is within
    0.1% of :func:`lower_bound`, no swap helps, or its work budget is spent. The best of the result,
    its start and the contiguous split on exact sums is kept (contiguous on ties). Samples in a group
    keep ascending position; groups are ordered by their first sample. ValueError for costs that are
    not a 1-D sequence of finite numbers >= 0, or whose length is not a multiple of ``n_groups``."""
    c = _exact(_validate(costs, n_groups))
    n = c.size
    if n_groups == 1 or n <= n_groups:  # one group, one sample per group, or nothing to split
        return contiguous_order(n)
    stop = unchecked_lower_bound(c, n_groups) * (1.0 + _GOOD_ENOUGH)
    lpt = _lpt_groups(c, n_groups)
    sums = c[lpt].sum(axis=1)
    start, start_max = lpt, sums[sums.argmax()]
    if np.count_nonzero(sums > stop) > _KK_AFTER_GROUPS_ABOVE:
        kk = _kk_groups(c, n_groups)
        kk_max = _max_group(c, kk)
        if kk_max < start_max:
            start, start_max = kk, kk_max
    improved = _improve(c, start, stop)
    contiguous = np.arange(n).reshape(n_groups, -1)
    # min() keeps the first of equals: contiguous on ties, so balanced input is left alone.
    _, best = min(
        ((_max_group(c, contiguous), contiguous), (_max_group(c, improved), improved), (start_max, start)),
        key=lambda candidate: candidate[0],
    )
    return _canonical(best)


# Internally a split is a (n_groups, size) matrix of sample indices, one row per group, each row
# ascending: row sums then equal group_costs() bit for bit, so "never worse" comparisons are exact.


def _max_group(c: np.ndarray, groups: np.ndarray) -> float:
    sums = c[groups].sum(axis=1)
    return sums[sums.argmax()]  # argmax: far cheaper than a max reduction on small arrays


def _canonical(groups: np.ndarray) -> list[int]:
    """Flatten rows into an order, groups sorted by their first (smallest) sample."""
    return groups[np.argsort(groups[:, 0], kind="stable")].ravel().tolist()


def _lpt_groups(c: np.ndarray, n_groups: int) -> np.ndarray:
    if c.size < _LPT_BATCH_FROM:
        return _lpt_heap(c, n_groups)
    return _lpt_batched(c, n_groups)


def _lpt_heap(c: np.ndarray, n_groups: int) -> np.ndarray:
    """Equal-size LPT with a heap of (load, group): the definition :func:`_lpt_batched` follows."""
    size = c.size // n_groups
    rows: list[list[int]] = [[] for _ in range(n_groups)]
    heap = [(0.0, g) for g in range(n_groups)]  # (load, group): ties go to the lower group id
    order = np.argsort(-c, kind="stable")
    for i, value in zip(order.tolist(), c[order].tolist()):
        load, g = heap[0]
        row = rows[g]
        row.append(i)
        if len(row) < size:
            heapq.heapreplace(heap, (load + value, g))
        else:  # full: it takes no more samples
            heapq.heappop(heap)
    return np.sort(np.array(rows, dtype=np.int64), axis=1)


def _lpt_batched(c: np.ndarray, n_groups: int) -> np.ndarray:
    """Equal-size LPT, the same assignment as :func:`_lpt_heap`, many samples per numpy step.

    The open groups are kept sorted by (load, group id), the heap's order. The next samples go
    one each to the first open groups in that order for as long as the heap would pick them: the
    j-th sorted group is the heap's minimum while its load is below the new load of every open
    group that took a sample earlier in the batch (an equal load ends the batch, so ties are
    always settled by an exact re-sort). Zero costs sort last and fill the open groups in (load,
    id) order, as the heap does, since a zero leaves the minimum where it is.
    """
    n = c.size
    size = n // n_groups
    order = np.argsort(-c, kind="stable")
    values = c[order]
    positive = int(np.count_nonzero(values))
    load = np.zeros(n_groups)
    left = np.full(n_groups, size, dtype=np.int64)
    owner = np.empty(n, dtype=np.int64)
    queue = np.arange(n_groups)  # open groups by (load, id)
    i = 0
    while i < positive:
        head = queue[: min(queue.size, positive - i)]
        before = load[head]
        after = before + values[i : i + head.size]
        competing = np.where(left[head] > 1, after, np.inf)  # a group that fills up leaves the heap
        blocked = np.flatnonzero(before[1:] >= np.minimum.accumulate(competing)[:-1])
        take = head.size if blocked.size == 0 else int(blocked[0]) + 1
        taken = head[:take]
        owner[i : i + take] = taken
        load[taken] = after[:take]
        left[taken] -= 1
        i += take
        queue = np.flatnonzero(left)
        queue = queue[np.argsort(load[queue], kind="stable")]
    if i < n:
        owner[i:] = np.repeat(queue, left[queue])
    return order[np.argsort(owner * n + order)].reshape(n_groups, size)


def _kk_groups(c: np.ndarray, n_groups: int) -> np.ndarray:
    """k-way largest differencing with equal cardinality.

    A state is k partial groups with their sums, heaviest first. Start from blocks of k
    consecutive samples in descending cost order, one sample per group; repeatedly merge the two
    states with the largest spread, joining the heaviest partial group of one with the lightest
    of the other. Every merge adds one member to every group, so sizes stay equal.
    """
    blocks = np.argsort(-c, kind="stable").reshape(-1, n_groups)
    heap = []
    for j, block in enumerate(blocks):
        sums = c[block]
        heap.append((float(sums[-1] - sums[0]), j, sums, block[:, None]))
    heapq.heapify(heap)
    serial = len(heap)
    while len(heap) > 1:
        _, _, sums_a, rows_a = heapq.heappop(heap)
        _, _, sums_b, rows_b = heapq.heappop(heap)
        sums = sums_a + sums_b[::-1]
        p = np.argsort(-sums, kind="stable")  # stable: ties keep their rank
        rows = np.concatenate((rows_a, rows_b[::-1]), axis=1)[p]
        sums = sums[p]
        heapq.heappush(heap, (float(sums[-1] - sums[0]), serial, sums, rows))
        serial += 1
    return np.sort(heap[0][3], axis=1)


def _improve(c: np.ndarray, groups: np.ndarray, stop: float) -> np.ndarray:
    """Swap samples between groups while that lowers the heavier of the two; stop at ``stop``.

    Works on the transposed split (column g = group g), so every numpy step runs along the long
    axis. With many groups, first rounds over disjoint pairs at once: every group above the stop
    (at most half of the groups), heaviest first, against the lightest groups, or in alternate
    rounds against the groups half the ranking below it; each pair takes the swap that brings it
    closest to even. Then rounds that take the best swap between the heaviest group and any
    other. No swap raises the larger group of its pair, so the heaviest group never gets heavier.
    """
    cols = np.ascontiguousarray(groups.T)
    vals = c[cols]
    size, n_groups = cols.shape
    half = n_groups // 2
    idle = 0
    for r in range(_PAIR_ROUNDS if n_groups >= _PAIR_FROM_GROUPS else 0):
        sums = vals.sum(axis=0)
        rank = np.argsort(sums, kind="stable")
        above = min(half, int(np.count_nonzero(sums > stop)))
        if not above:
            return np.sort(cols.T, axis=1)
        # The groups above the stop, heaviest first, against the lightest groups (even rounds)
        # or the groups half the ranking below them (odd rounds).
        heavy = rank[: n_groups - above - 1 : -1]
        light = rank[:above] if r % 2 == 0 else rank[n_groups - 1 - half - np.arange(above)]
        a, b, gain = _best_swaps(vals, sums, heavy, light)
        ok = np.flatnonzero(gain > sums[heavy] * _MIN_GAIN)
        if ok.size:
            idle = 0
            _swap(cols, vals, heavy[ok], light[ok], a[ok], b[ok])
        else:
            idle += 1
            if idle == 2:  # neither pairing finds a swap: leave the rest to the tail
                break
    rounds = min(4 * n_groups, max(1, _TAIL_WORK // ((n_groups - 1) * size * size)))
    sums = vals.sum(axis=0)  # kept up to date swap by swap: a few ulps of drift only steer the search
    for _ in range(rounds):
        g = int(sums.argmax())
        top = sums[g]
        if not top > stop:
            break
        if size <= _BRUTE_FORCE_SIZE:
            # delta[a, b, h]: cost moved out of g when its slot a swaps with slot b of group h;
            # the gain is how much the larger of g and h drops (<= 0 for h == g).
            delta = np.subtract(vals[:, g][:, None, None], vals[None, :, :], order="C")
            gain = np.minimum(delta, (top - sums) - delta)
            best = int(gain.argmax())
            best_gain = gain.item(best)
            a, rest = divmod(best, size * n_groups)
            b, h = divmod(rest, n_groups)
        else:
            peers = np.delete(np.arange(n_groups), g)
            slots_a, slots_b, gains = _best_swaps(vals, sums, np.full(n_groups - 1, g), peers)
            j = int(gains.argmax())
            best_gain, a, b, h = gains[j], int(slots_a[j]), int(slots_b[j]), int(peers[j])
        if not best_gain > top * _MIN_GAIN:
            break
        moved = vals[a, g] - vals[b, h]
        cols[a, g], cols[b, h] = cols[b, h], cols[a, g]
        vals[a, g], vals[b, h] = vals[b, h], vals[a, g]
        sums[g] -= moved
        sums[h] += moved
    return np.sort(cols.T, axis=1)


def _best_swaps(vals: np.ndarray, sums: np.ndarray, heavy: np.ndarray, light: np.ndarray):
    """For each pair (heavy[p], light[p]): the swap of slot a[p] of the heavy group with slot b[p]
    of the light one that brings the pair's sums closest to even, and gain[p], how much the larger
    of the two drops (<= 0: no swap helps). ``vals`` is (size, n_groups), a column per group.

    A swap moving d = v_a - v_b leaves the pair's larger sum at mid + |d - gap / 2|, so the best
    swap minimises that distance and gains gap / 2 minus it. Ties go to the lowest (a, b) (the
    sorted search of large groups may settle exact ties differently: same gain, other slots).
    """
    size = vals.shape[0]
    half_gap = (sums[heavy] - sums[light]) * 0.5
    target = np.take(vals, heavy, axis=1) - half_gap  # (size, pairs): the light value that evens a pair
    light_vals = np.take(vals, light, axis=1)
    if size <= _BRUTE_FORCE_SIZE:
        # (b, a, pair), C order (broadcasting would pick a layout that makes the reductions slow)
        dist = np.subtract(target[None, :, :], light_vals[:, None, :], order="C")
        np.abs(dist, out=dist)
        per_a = dist.min(axis=0)
        err = per_a.min(axis=0)
        a = (per_a == err).argmax(axis=0)  # first a at the minimum ...
        b = (dist[:, a, np.arange(heavy.size)] == err).argmax(axis=0)  # ... and its first b
        return a, b, half_gap - err
    # Large groups: for each slot a, the nearest light value from a sorted copy of each column.
    by_value = np.argsort(light_vals, axis=0, kind="stable")
    sorted_vals = np.take_along_axis(light_vals, by_value, axis=0)
    lo = min(sorted_vals[0].min(), target.min())
    span = 2.0 * (max(sorted_vals[-1].max(), target.max()) - lo) + 1.0
    shift = np.arange(heavy.size) * span - lo  # columns laid end to end on one sorted axis
    pos = np.searchsorted((sorted_vals + shift).ravel(order="F"), (target + shift).ravel(order="F"))
    pos = pos.reshape(heavy.size, size).T - np.arange(heavy.size) * size
    above, below = np.minimum(pos, size - 1), np.maximum(pos - 1, 0)
    err_above = np.abs(target - np.take_along_axis(sorted_vals, above, axis=0))
    err_below = np.abs(target - np.take_along_axis(sorted_vals, below, axis=0))
    nearest = np.where(err_below <= err_above, below, above)
    dist = np.minimum(err_below, err_above)  # (a, pair)
    a = dist.argmin(axis=0)
    pairs = np.arange(heavy.size)
    b = by_value[nearest[a, pairs], pairs]
    return a, b, half_gap - dist[a, pairs]


def _swap(cols: np.ndarray, vals: np.ndarray, heavy, light, a, b) -> None:
    """Swap slot a of column heavy with slot b of column light, pairwise (disjoint pairs)."""
    n_groups = cols.shape[1]
    one, other = a * n_groups + heavy, b * n_groups + light  # flat positions
    for flat in (cols.reshape(-1), vals.reshape(-1)):  # views: both are C-contiguous
        moved = flat[one]
        flat[one] = flat[other]
        flat[other] = moved
