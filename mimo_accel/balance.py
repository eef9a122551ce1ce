"""Equal-cardinality balanced partitioning of a micro-batch's samples into groups.

A global micro-batch of N samples is cut into ``n_groups`` contiguous, equal-size groups, one per
vision data-parallel group (canonical grid group). The group that draws the heavy images stalls
all others, so :func:`balanced_order` permutes the samples so every group carries about the same
cost. Every function here is pure and deterministic: the same costs give the same order on every
rank and in every process, with ties broken by sample position, so no plan needs broadcasting.

An order is a permutation of ``range(N)``; its consecutive blocks of ``N // n_groups`` entries
are the groups. Balancing a whole global batch (several micro-batches) is ``balanced_order`` over
the concatenated costs with ``n_groups = micro_batches * groups``.
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

# Bound on swap rounds (the pass converges long before in practice); the distance to the lower
# bound below which balancing stops, since no step time can tell 0.1% apart; the smallest relative
# gain worth a swap, so float noise in the running sums cannot keep the loop going. Candidates
# are compared on exact sums afterwards.
_MAX_ROUNDS_PER_GROUP = 4
_GOOD_ENOUGH = 1e-3
_MIN_GAIN = 1e-12
# Groups left above the stop by LPT beyond which a KK start pays for itself: each such group
# costs the swap pass about one round, and KK costs 5-8 rounds (measured at 64/8 and 512/64).
_KK_AFTER_GROUPS_ABOVE = 8


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

    With ``c_0 >= c_1 >= ...`` the costs and ``size`` samples per group, the largest of:

    - the mean group cost;
    - pigeonhole: of the t most expensive samples some group holds q = ceil(t / n_groups),
      costing at least the q cheapest of those t plus the ``size - q`` cheapest samples
      ("largest sample plus the cheapest fill" for q = 1, tight when one sample dominates);
    - for each i < n_groups, the smaller of two cases: two of the top i + 1 share a group
      (>= c_{i-1} + c_i + fill), or they sit in i + 1 groups whose (i + 1)(size - 1) other
      members are distinct samples (>= c_i + the largest of those + fill, and >= c_i + their
      mean per group). For two samples per group this is exact: the sorted pairing's cost.
    """
    return _lower_bound(_validate(costs, n_groups), n_groups)


def _lower_bound(c: np.ndarray, n_groups: int) -> float:
    n = c.size
    if n == 0:
        return 0.0
    size = n // n_groups
    asc = np.sort(c)
    prefix = [0.0, *np.cumsum(asc).tolist()]  # prefix[j]: sum of the j cheapest
    asc = asc.tolist()
    # Plain loops over size + n_groups terms: cheaper than numpy's per-call cost at these sizes.
    bound = prefix[n] / n_groups
    for q in range(1, size + 1):
        # Pigeonhole: largest at the smallest t = (q - 1) * n_groups + 1, where the q cheapest of
        # the top t are asc[lo : lo + q].
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
    """Equal-size LPT: most expensive first, each to the cheapest group that still has room."""
    c = _validate(costs, n_groups)
    if c.size == 0:
        return []
    return _canonical(_lpt_groups(c, n_groups))


def balanced_order(costs: _CostsLike, n_groups: int) -> list[int]:
    """A permutation of ``range(len(costs))`` whose equal-size blocks have near-equal cost.

    Equal-size LPT gives a first split; where it leaves many groups above target, largest
    differencing (Karmarkar-Karp generalised to k equal-size groups) gives a second. A swap pass
    then lowers the heaviest group of the better one until it is within 0.1% of
    :func:`lower_bound` or no swap helps. The result is compared with its start and the
    contiguous split on exact group sums and the best kept (contiguous on ties), so it is never
    worse than LPT or the contiguous split. Samples inside a group keep ascending position;
    groups are ordered by their first sample.

    Raises ValueError for costs that are not a 1-D sequence of finite numbers >= 0, or whose
    length is not a multiple of ``n_groups``.
    """
    c = _validate(costs, n_groups)
    n = c.size
    if n_groups == 1 or n <= n_groups:  # one group, one sample per group, or nothing to split
        return contiguous_order(n)
    stop = _lower_bound(c, n_groups) * (1.0 + _GOOD_ENOUGH)
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


def _kk_groups(c: np.ndarray, n_groups: int) -> np.ndarray:
    """k-way largest differencing with equal cardinality.

    A state is k partial groups with their sums, heaviest first. Start from blocks of k
    consecutive samples in descending cost order, one sample per group; repeatedly merge the two
    states with the largest spread, joining the heaviest partial group of one with the lightest
    of the other. Every merge adds one member to every group, so sizes stay equal. Plain lists:
    at these sizes numpy's per-call overhead costs more than it saves.
    """
    order = np.argsort(-c, kind="stable").tolist()
    values = c.tolist()
    heap = []
    for j in range(len(order) // n_groups):
        block = order[j * n_groups : (j + 1) * n_groups]
        sums = [values[i] for i in block]
        heap.append((sums[-1] - sums[0], j, sums, [[i] for i in block]))
    heapq.heapify(heap)
    serial = len(heap)
    ranks = range(n_groups)
    while len(heap) > 1:
        _, _, sums_a, rows_a = heapq.heappop(heap)
        _, _, sums_b, rows_b = heapq.heappop(heap)
        sums = [x + y for x, y in zip(sums_a, reversed(sums_b))]
        rows = [x + y for x, y in zip(rows_a, reversed(rows_b))]
        p = sorted(ranks, key=sums.__getitem__, reverse=True)  # stable: ties keep their rank
        sums = [sums[i] for i in p]
        heapq.heappush(heap, (sums[-1] - sums[0], serial, sums, [rows[i] for i in p]))
        serial += 1
    return np.sort(np.array(heap[0][3], dtype=np.int64), axis=1)


def _improve(c: np.ndarray, groups: np.ndarray, stop: float) -> np.ndarray:
    """Swap samples between the heaviest group and any other while that lowers the pair's max.

    Each round looks at every (sample of the heaviest group, sample elsewhere) pair at once and
    takes the swap that lowers the larger of the two groups the most, so the maximum never rises.
    Stops when no swap helps or the maximum is down to ``stop``.
    """
    groups = groups.copy()
    values = c[groups]
    sums = values.sum(axis=1)
    n_groups, size = groups.shape
    for _ in range(_MAX_ROUNDS_PER_GROUP * n_groups):
        g = int(sums.argmax())
        top = sums[g]
        if top <= stop:
            break
        # delta[a, h, b]: cost moved out of g when its slot a swaps with slot b of group h.
        delta = values[g][:, None, None] - values
        gain = np.minimum(delta, (top - sums)[:, None] - delta)  # <= 0 for h == g
        best = int(gain.argmax())
        if not gain.item(best) > top * _MIN_GAIN:
            break
        moved = delta.item(best)
        a, rest = divmod(best, n_groups * size)
        h, b = divmod(rest, size)
        groups[g, a], groups[h, b] = groups[h, b], groups[g, a]
        values[g, a], values[h, b] = values[h, b], values[g, a]
        sums[g] -= moved
        sums[h] += moved
    return np.sort(groups, axis=1)
