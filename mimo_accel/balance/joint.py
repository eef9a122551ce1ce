"""One plan for every module: each encoder's replicas and the language model's replicas together.

A global micro-batch is cut into G = lcm(module DPs) equal-size groups; module m's replica r owns
groups r·G/d_m … (r+1)·G/d_m − 1. Each module prices each sample with its own cost (0 where a
sample has nothing for it), and the step waits for the slowest replica of *any* module, so
:func:`balance_modules` returns the order whose worst module has the smallest replica spread it
finds. In integers, so every rank computes the same plan on any hardware:

1. each module scaled so its mean replica load is ``2**20`` units (one replica, or no cost: left out);
2. start from the equal-size partitioner over the modules whose replicas are groups (DP = G),
   the groups then dealt into every coarser module's replicas where the DPs form a chain;
3. rounds of swaps between disjoint pairs of groups (under the heaviest replicas against light
   ones, no two pairs touching one replica of any module), each taking the swap that lowers the
   heaviest replica it touches most (in units of each module's bound); then single swaps for the
   heaviest replica;
4. the best of the result, its start and the contiguous split kept (contiguous on ties).

Work is bounded by rounds and candidates (never a clock), ties go to the earlier sample or group,
and a group's samples keep ascending position.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from mimo_accel.balance.partition import unchecked_lower_bound, balanced_order
from mimo_accel.grid import canonical_grid
from mimo_accel.modules import LANGUAGE

__all__ = ["balance_modules", "module_spreads", "module_bounds"]

_UNIT = 1 << 20  # a module's mean replica load, in integer cost units
_QUANT = 1 << 30  # the largest sample cost of a module before normalisation
# A replica whose spread (load / mean) is within _CLOSE of its module's lower bound needs no more
# work: an absolute margin, as the straggler is judged, so a module whose bound is far above its
# mean (one sample larger than a replica's mean share) is held as close to it as any other.
_CLOSE = 0.005
_ROUNDS = 16  # swap rounds over disjoint pairs of groups
_CANDIDATES = 8  # samples per group a swap is searched among (all of them up to this size)
_PAIRS_PER_BLOCK = 256  # pairs whose swaps are searched at once (64 candidate swaps each: 128 KiB a temporary)
_MORE_STARTS_UP_TO = 1024  # samples x modules up to which every plan also tries two other starts
# a swap's score: how far it lowers the heaviest replica, then how even it leaves the pair; both
# clipped so the score stays an exact int64 (in the doubled load units it is scored in, a drop of
# 2**30 is 512 bounds)
_SCALE = 1 << 32
_DROP_CLIP = 1 << 30
_OPTIONS = 4  # candidate partners a heavy group is tried against in a round
_TAIL_PARTNERS = 16  # lightest groups the tail tries against the heaviest replica's groups
_TAIL_STEPS = 32  # swaps the tail may make


def _validate(costs: Mapping[str, Sequence[float]], dps: Mapping[str, int], micro_batches: int):
    if not isinstance(costs, Mapping) or not isinstance(dps, Mapping):
        raise ValueError("costs and dps must map module names to per-sample costs and DP sizes")
    if set(costs) != set(dps):
        raise ValueError(f"costs and dps must name the same modules: costs has {sorted(costs)}, "
                         f"dps has {sorted(dps)}")
    if not dps:
        raise ValueError("balance_modules needs at least one module")
    for name, d in dps.items():
        if isinstance(d, bool) or not isinstance(d, (int, np.integer)) or d < 1:
            raise ValueError(f"DP size of module {name!r} must be a positive integer, got {d!r}")
    if isinstance(micro_batches, bool) or not isinstance(micro_batches, (int, np.integer)) or micro_batches < 1:
        raise ValueError(f"micro_batches must be a positive integer, got {micro_batches!r}")
    arrays, n = {}, None
    for name in sorted(costs):
        try:
            c = np.asarray(costs[name], dtype=np.float64)
        except (TypeError, ValueError):
            raise ValueError(f"costs of module {name!r} must be a 1-D sequence of numbers") from None
        if c.ndim != 1:
            raise ValueError(f"costs of module {name!r} must be 1-D (one cost per sample), got shape {c.shape}")
        if n is not None and c.size != n:
            raise ValueError(f"every module must cost the same samples: {name!r} has {c.size}, others {n}")
        n = c.size
        if c.size and not (c[c.argmin()] >= 0 and c[c.argmax()] < np.inf):
            i = int(np.flatnonzero(~(np.isfinite(c) & (c >= 0)))[0])
            raise ValueError(f"cost of sample {i} for module {name!r} is {c[i]}; costs must be finite and >= 0")
        arrays[name] = c
    grid = canonical_grid(int(d) for d in dps.values()) * int(micro_batches)
    if n % grid:
        raise ValueError(f"{n} samples cannot be cut into {grid} equal groups (lcm of the DP sizes "
                         f"{dict(dps)} x {micro_batches} micro-batches); make the global micro-batch size "
                         "a multiple of the canonical grid")
    return arrays, grid


def _normalised(c: np.ndarray, replicas: int) -> np.ndarray:
    """Integer costs whose replica mean is about ``_UNIT``: scaled elementwise by the exact
    maximum, then by the exact integer total, so no float sum (whose rounding can differ between
    CPUs) decides anything."""
    top = c[c.argmax()]
    q = np.rint((c / top) * _QUANT).astype(np.int64)  # divide first: _QUANT / a subnormal top overflows
    total = int(q.sum())
    return (q * (replicas * _UNIT)) // total


def _prepared(costs, dps, micro_batches):
    """(module names, normalised costs (M, N), replicas per module, G) of the modules that constrain
    the plan: more than one replica and some cost."""
    arrays, grid = _validate(costs, dps, micro_batches)
    names, rows, replicas, stops = [], [], [], []
    for name, c in arrays.items():
        d = int(dps[name]) * int(micro_batches)
        if d == 1 or not c.size or not c[c.argmax()] > 0:
            continue
        q = _normalised(c, d)
        # in units of this module's own lower bound: every module's best possible heaviest replica
        # is then _UNIT, so one scale compares how far each module is from what it can reach
        bound = max(_UNIT, math.ceil(unchecked_lower_bound(q.astype(np.float64), d)))
        names.append(name)
        rows.append((q * _UNIT) // bound)
        replicas.append(d)
        # the stop in bound units: the bound plus _CLOSE of the mean (bound / _UNIT = the bound's spread)
        stops.append(_UNIT + int(_CLOSE * _UNIT * _UNIT / bound))
    n = next(iter(arrays.values())).size
    q = np.array(rows, dtype=np.int64).reshape(len(rows), n)
    return names, q, np.array(replicas, dtype=np.int64), grid, np.array(stops, dtype=np.int64)


def _replica_loads(q: np.ndarray, replicas: np.ndarray, grid: int, groups: np.ndarray) -> list[np.ndarray]:
    """Per module, the load of each of its replicas under ``groups`` (G, size)."""
    group_loads = q[:, groups].sum(axis=2)  # (M, G)
    return [group_loads[m].reshape(int(d), -1).sum(axis=1) for m, d in enumerate(replicas)]


def _excess(loads) -> np.ndarray:
    """How far replica loads are over their module's bound (0 at or under it)."""
    return np.maximum(np.asarray(loads, dtype=np.int64) - _UNIT, 0)


def _quality(q, replicas, grid, groups) -> tuple[int, int]:
    """(heaviest replica of any module, summed excess over the bounds): lower is better."""
    loads = _replica_loads(q, replicas, grid, groups)
    return (max((int(r.max()) for r in loads), default=0), int(sum(int(_excess(r).sum()) for r in loads)))


def _at_stop(q, replicas, grid, groups, stop) -> bool:
    """Whether every replica of every module is at or under its stop."""
    return all(int(r.max()) <= int(st) for r, st in zip(_replica_loads(q, replicas, grid, groups), stop))


def _is_chain(sizes: list[int]) -> bool:
    return all(b % a == 0 for a, b in zip(sizes, sizes[1:]))


def _serpentine(blocks: np.ndarray, cost: np.ndarray, parts: int) -> np.ndarray:
    """Each block (B, s) of sample indices cut into ``parts`` equal sub-blocks: its samples by
    descending cost dealt 0, 1, …, parts-1, parts-1, …, 0, … (ties by position). (B·parts, s/parts)."""
    count, size = blocks.shape
    order = np.argsort(-cost[blocks], axis=1, kind="stable")
    ranked = np.take_along_axis(blocks, order, axis=1)
    lap = np.arange(size) // parts
    seat = np.arange(size) % parts
    seat = np.where(lap % 2 == 0, seat, parts - 1 - seat)
    by_seat = np.argsort(seat, kind="stable")  # rank positions of part 0, then part 1, ...
    return np.sort(ranked[:, by_seat].reshape(count * parts, size // parts), axis=1)


def _start(q: np.ndarray, replicas: np.ndarray, grid: int, encoders: np.ndarray) -> np.ndarray:
    """The first split. The equal-size partitioner cuts the samples at the finest encoder's DP size
    by the summed cost of the encoders that care there (the language model's where there is no
    encoder), so every encoder starts as balanced as the encoders-only plan; where the DP sizes
    form a chain, each part is then dealt down into the finer levels' parts, and the parts are
    dealt up into the coarser levels' replicas, each by the modules that care at that level. The
    swaps then bring the language model in under the encoders' caps. (G, N/G)"""
    n = q.shape[1]
    sizes = sorted(set(int(d) for d in replicas) | {grid})

    def driver(cares: np.ndarray) -> np.ndarray:
        chosen = cares & encoders if (cares & encoders).any() else cares
        return q[chosen].sum(axis=0)

    if not _is_chain(sizes):
        return np.array(balanced_order(driver(np.ones(len(q), bool)), grid), dtype=np.int64).reshape(grid, n // grid)
    pivot = max((int(d) for d, e in zip(replicas, encoders) if e), default=sizes[0])
    blocks = np.array(balanced_order(driver(replicas >= pivot), pivot), dtype=np.int64).reshape(pivot, n // pivot)
    for coarse, fine in zip(sizes, sizes[1:]):  # down: each part dealt into the finer level's parts
        if coarse >= pivot:
            blocks = _serpentine(blocks, driver(replicas >= fine), fine // coarse)
    per = grid // pivot  # groups per part at the pivot level
    for d in sorted((s for s in sizes if s < pivot), reverse=True):  # up: parts dealt into replicas
        loads = driver(replicas <= d)[blocks].sum(axis=1).reshape(-1, per).sum(axis=1)
        order = np.array(balanced_order(loads.astype(np.float64), d), dtype=np.int64)
        blocks = blocks.reshape(-1, per, blocks.shape[1])[order].reshape(grid, -1)
        per = grid // d
    return blocks


def _pairs(under: np.ndarray, stop: np.ndarray, reps: np.ndarray, alternate: bool):
    """Disjoint (heavy, light) pairs of groups. Heavy: the groups whose replicas are over the stop,
    most over first (at most half of the groups); each is paired with a group light in the module
    it is most over in — the lightest one left, or in alternate rounds one half the ranking below.
    A pair is kept only if, for every module where its two groups sit in different replicas, it is
    the first pair to touch those replicas (so no two swaps of a round move the same replica's
    load)."""
    m_count, grid = under.shape
    half = grid // 2
    over = np.maximum(under - stop[:, None], 0)
    worst = over.max(axis=0)
    above = min(half, int(np.count_nonzero(worst > 0)))
    if not above:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    heavy = np.argsort(-worst, kind="stable")[:above]
    dominant = over[:, heavy].argmax(axis=0)
    # each heavy group gets `options` candidate partners, no two heavy groups the same ones
    options = max(1, min(_OPTIONS, (grid - above) // above))
    light = np.empty((above, options), dtype=np.int64)
    taken = np.zeros(grid, dtype=bool)
    taken[heavy] = True
    for m in range(m_count):
        mine = np.flatnonzero(dominant == m)
        if not mine.size:
            continue
        free = np.flatnonzero(~taken)
        ranked = free[np.argsort(under[m, free], kind="stable")]
        if alternate:
            ranked = np.roll(ranked, -min(ranked.size // 2, max(ranked.size - mine.size * options, 0)))
        picks = np.minimum(np.arange(mine.size * options), ranked.size - 1).reshape(mine.size, options)
        light[mine] = ranked[picks]
        taken[light[mine].ravel()] = True
    return heavy, light


def _disjoint(heavy: np.ndarray, light: np.ndarray, reps: np.ndarray, useful: np.ndarray):
    """Which of the useful pairs (heavy[p], light[p]) to swap in one round: each group once, and
    for every module where the two groups sit in different replicas, only the first pair (heaviest
    first) that touches those replicas."""
    m_count, grid = reps.shape
    differ = reps[:, heavy] != reps[:, light]  # (M, P)
    keep = differ.any(axis=0) & (heavy != light) & useful
    keys = np.concatenate((np.where(differ, np.arange(m_count)[:, None] * grid + reps[:, heavy], -1),
                           np.where(differ, np.arange(m_count)[:, None] * grid + reps[:, light], -1)), axis=0).T
    # a group appears once: key it by itself too
    keys = np.concatenate((keys, (m_count * grid + heavy)[:, None], (m_count * grid + light)[:, None]), axis=1)
    pair_of = np.repeat(np.arange(keys.shape[0]), keys.shape[1])
    flat = keys.ravel()
    live = (flat >= 0) & keep[pair_of]
    if live.any():
        _, where = np.unique(flat[live], return_index=True)
        winner = np.full((m_count + 1) * grid, -1)
        winner[flat[live][where]] = pair_of[live][where]  # the first live pair touching each key
        clash = np.zeros(flat.shape, dtype=bool)
        clash[live] = winner[flat[live]] != pair_of[live]
        blocked = np.zeros(keys.shape[0], dtype=bool)
        np.logical_or.at(blocked, pair_of[clash], True)
        keep &= ~blocked
    return keep


def _candidates(key: np.ndarray, shift: int) -> np.ndarray:
    """The slots of each group (P, size) a swap is searched among: the ``_CANDIDATES`` with the
    largest ``key`` (the samples that move the most of the pair's dominant load; all of them in a
    small group), every other round spread evenly over the ranks instead."""
    count, size = key.shape
    if size <= _CANDIDATES:
        return np.broadcast_to(np.arange(size), key.shape).copy()
    ranks = np.argsort(-key, axis=1, kind="stable")
    if shift % 2 == 0:
        picks = np.arange(_CANDIDATES)
    else:
        picks = ((np.arange(_CANDIDATES) * size) // _CANDIDATES + shift // 2) % size
    return np.take_along_axis(ranks, np.broadcast_to(picks, (count, _CANDIDATES)), axis=1)


def _best_swaps(q, groups, under, reps, g, h, shift):
    """:func:`_swaps_of` for the pairs (g, h), a block of pairs at a time: each pair's best swap
    depends on that pair alone, and a block's (pairs × candidates²) temporaries stay in the core's
    own cache (all pairs at once, at 4 096 groups, they are megabytes per array, streamed through
    memory a dozen times per call beside the training thread)."""
    if len(g) <= _PAIRS_PER_BLOCK:
        return _swaps_of(q, groups, under, reps, g, h, shift)
    parts = [_swaps_of(q, groups, under, reps, g[lo:lo + _PAIRS_PER_BLOCK], h[lo:lo + _PAIRS_PER_BLOCK], shift)
             for lo in range(0, len(g), _PAIRS_PER_BLOCK)]
    return tuple(np.concatenate(column) for column in zip(*parts))


def _swaps_of(q, groups, under, reps, g, h, shift):
    """For each pair (g[p], h[p]): the swap of a sample of g with a sample of h that brings the
    heaviest replica the pair touches lowest (loads in units of each module's bound, so every module
    counts alike), ties going to the swap that leaves the pair's loads the most even over the
    modules it moves. (slot in g, slot in h, score; a score <= 0 means no swap lowers it)."""
    lg, lh = under[:, g], under[:, h]  # (M, P): load of each group's replica
    apart = reps[:, g] != reps[:, h]  # (M, P): the modules the swap moves load between
    top = np.where(apart, np.maximum(lg, lh), 0)
    mg, mh = groups[g], groups[h]  # (P, size)
    if mg.shape[1] <= _CANDIDATES:  # every slot is a candidate
        ca = cb = None
        sa, sb = mg, mh
    else:
        dominant = top.argmax(axis=0)  # (P,)
        ca = _candidates(q[dominant[:, None], mg], shift)  # heavy side: its samples heaviest in that module
        cb = _candidates(-q[dominant[:, None], mh], shift)  # light side: its lightest
        sa = np.take_along_axis(mg, ca, axis=1)  # candidate samples (P, A)
        sb = np.take_along_axis(mh, cb, axis=1)  # (P, B)
    # A swap moving d = qa - qb of a module from g to h leaves the heavier of the two at
    # ((lg + lh) + |lg - lh - 2d|) / 2: per module one broadcast sum of (lg - lh - 2 qa) and 2 qb,
    # everything below in twice the load units
    worst = np.zeros((len(g), sa.shape[1], sb.shape[1]), dtype=np.int64)
    uneven = np.zeros_like(worst)
    for m in np.flatnonzero(apart.any(axis=1)):
        gap = np.abs(((lg[m] - lh[m])[:, None] - 2 * q[m][sa])[:, :, None] + (2 * q[m][sb])[:, None, :])
        if not apart[m].all():  # where the two groups share this module's replica, its loads stay
            gap *= apart[m][:, None, None]
        uneven += gap
        # (such a module is counted in `top` as 0 and kept out of `worst` here)
        np.maximum(worst, gap + np.where(apart[m], lg[m] + lh[m], -(1 << 40))[:, None, None], out=worst)
    lowered = np.minimum(2 * top.max(axis=0)[:, None, None] - worst, _DROP_CLIP)
    score = np.where(lowered > 0, lowered * _SCALE - np.minimum(uneven, _SCALE - 1), -1).reshape(len(g), -1)
    best = score.argmax(axis=1)
    a, b = np.divmod(best, sb.shape[1])
    rows = np.arange(len(g))
    if ca is None:
        return a, b, score[rows, best]
    return ca[rows, a], cb[rows, b], score[rows, best]


def _improve(q: np.ndarray, replicas: np.ndarray, grid: int, groups: np.ndarray, stop: np.ndarray) -> np.ndarray:
    groups = groups.copy()
    per = grid // replicas  # groups per replica, per module
    reps = np.arange(grid)[None, :] // per[:, None]  # (M, G): the replica of each group, per module
    flat = bool((per == 1).all())
    group_loads = q[:, groups].sum(axis=2)  # (M, G)

    def under_each_group():  # (M, G): the load of each group's replica, per module
        if flat:
            return group_loads.copy()
        return np.stack([np.repeat(group_loads[m].reshape(int(d), -1).sum(axis=1), per[m])
                         for m, d in enumerate(replicas)])

    group_of = np.empty(q.shape[1], dtype=np.int64)
    group_of[groups] = np.arange(grid)[:, None]

    def swap(gi, hi, slot_a, slot_b):
        moved_a = groups[gi, slot_a].copy()
        moved_b = groups[hi, slot_b].copy()
        groups[gi, slot_a] = moved_b
        groups[hi, slot_b] = moved_a
        group_of[moved_b], group_of[moved_a] = gi, hi
        change = q[:, moved_a] - q[:, moved_b]  # (M, k)
        np.subtract.at(group_loads, (slice(None), gi), change)
        np.add.at(group_loads, (slice(None), hi), change)

    idle = 0
    for r in range(_ROUNDS):
        under = under_each_group()
        if (under <= stop[:, None]).all():
            return np.sort(groups, axis=1)
        heavy, light = _pairs(under, stop, reps, alternate=r % 2 == 1)
        ok = heavy[:0]
        if heavy.size:
            k = light.shape[1]
            slot_a, slot_b, gain = _best_swaps(q, groups, under, reps, np.repeat(heavy, k), light.ravel(), r)
            pick = gain.reshape(-1, k).argmax(axis=1) + np.arange(heavy.size) * k  # each heavy: its best partner
            g, h, slot_a, slot_b, gain = heavy, light.ravel()[pick], slot_a[pick], slot_b[pick], gain[pick]
            if flat:  # every replica is one group: the pairs are disjoint as drawn
                ok = np.flatnonzero(gain > 0)
            else:
                ok = np.flatnonzero(_disjoint(g, h, reps, gain > 0))
        if ok.size:
            idle = 0
            swap(g[ok], h[ok], slot_a[ok], slot_b[ok])
        else:
            idle += 1
            if idle == 2:
                break
    cheap = np.argsort(q, axis=1, kind="stable")  # each module's samples, cheapest first
    # Tail: each module's heaviest replica over its bound, heaviest first: its groups against the
    # lightest groups of that module outside it, one best swap at a time, while any such swap helps.
    for t in range(_TAIL_STEPS):
        under = under_each_group()
        if (under <= stop[:, None]).all():
            break
        swapped = False
        for m in np.argsort(-(under.max(axis=1) - stop), kind="stable"):
            top = int(under[m].max())
            if top <= stop[m]:
                break
            first = int(np.flatnonzero(under[m] == top)[0])
            heavy = np.flatnonzero(reps[m] == reps[m, first])  # the groups of that replica
            outside = reps[m] != reps[m, first]
            # partners: the lightest groups of that module, and the groups holding its cheapest
            # samples (what a heavy group with one large sample needs beside it)
            lightest = np.flatnonzero(outside)[np.argsort(under[m, outside], kind="stable")[:_TAIL_PARTNERS]]
            near = group_of[cheap[m][: 4 * _TAIL_PARTNERS]]
            holding = near[outside[near]][:_TAIL_PARTNERS]
            mark = np.zeros(grid, dtype=bool)
            mark[lightest] = True
            mark[holding] = True
            others = np.flatnonzero(mark)
            g = np.repeat(heavy, others.size)
            h = np.tile(others, heavy.size)
            slot_a, slot_b, gain = _best_swaps(q, groups, under, reps, g, h, t)
            j = int(gain.argmax())
            if gain[j] > 0:
                swap(g[j:j + 1], h[j:j + 1], slot_a[j:j + 1], slot_b[j:j + 1])
                swapped = True
                break
        if not swapped:
            break
    return np.sort(groups, axis=1)


def balance_modules(costs: Mapping[str, Sequence[float]], dps: Mapping[str, int], micro_batches: int = 1) -> list[int]:
    """A permutation of ``range(N)`` for every module at once.

    ``costs``: module name -> per-sample costs (1-D, the same N samples, finite, >= 0); ``dps``:
    module name -> DP size. G = lcm of the DPs (times ``micro_batches``: a window of consecutive
    micro-batches, each cut into its own G groups); module m's replica r owns groups r·G/d_m …
    (r+1)·G/d_m − 1. It minimises the worst module's replica spread; a group's samples keep ascending
    position. ValueError for bad costs, modules that differ between ``costs`` and ``dps``, or N not a
    multiple of G."""
    names, q, replicas, grid, stop = _prepared(costs, dps, micro_batches)
    n = q.shape[1]
    contiguous = np.arange(n, dtype=np.int64).reshape(grid, -1) if n else np.zeros((grid, 0), np.int64)
    if not names or n <= grid:
        return contiguous.ravel().tolist()
    encoders = np.array([name != LANGUAGE for name in names], dtype=bool)
    start = _start(q, replicas, grid, encoders)
    improved = _improve(q, replicas, grid, start, stop)
    candidates = [contiguous, improved, start]
    # A small micro-batch affords more starts (the local search can end in different places): the
    # other modules first, and every module's summed cost; no more once a search has brought every
    # replica to its stop.
    if q.shape[1] * len(q) <= _MORE_STARTS_UP_TO and encoders.any() and (~encoders).any():
        for drivers in (~encoders, np.ones(len(q), dtype=bool)):
            if _at_stop(q, replicas, grid, improved, stop):
                break
            improved = _improve(q, replicas, grid, _start(q, replicas, grid, drivers), stop)
            candidates.append(improved)
    # the lowest worst replica; the first of equals (contiguous on ties, so balanced input is left alone)
    best = min(range(len(candidates)), key=lambda i: (_quality(q, replicas, grid, candidates[i]), i))
    return np.sort(candidates[best], axis=1).ravel().tolist()


def module_loads(costs: Mapping[str, Sequence[float]], dps: Mapping[str, int], order: Sequence[int],
                 micro_batches: int = 1) -> dict[str, np.ndarray]:
    """Each module's load per micro-batch and replica under ``order``: ``[micro_batches, dp]``."""
    arrays, grid = _validate(costs, dps, micro_batches)
    o = np.asarray(order, dtype=np.int64)
    n = next(iter(arrays.values())).size
    if o.shape != (n,) or not np.array_equal(np.sort(o), np.arange(n)):
        raise ValueError(f"order must be a permutation of range({n})")
    out = {}
    for name, c in arrays.items():
        d = int(dps[name]) * int(micro_batches)
        loads = c[o].reshape(d, -1).sum(axis=1) if n else np.zeros(d)
        out[name] = loads.reshape(int(micro_batches), int(dps[name]))
    return out


def module_spreads(costs: Mapping[str, Sequence[float]], dps: Mapping[str, int], order: Sequence[int],
                   micro_batches: int = 1) -> dict[str, float]:
    """Each module's replica spread (max/mean of its replicas' loads, over every micro-batch and
    replica) under ``order``; 1.0 for a module with one replica or no cost."""
    out = {}
    for name, loads in module_loads(costs, dps, order, micro_batches).items():
        mean = loads.mean() if loads.size else 0.0
        out[name] = float(loads.max() / mean) if mean > 0 else 1.0
    return out


def module_bounds(costs: Mapping[str, Sequence[float]], dps: Mapping[str, int], micro_batches: int = 1) -> dict[str, float]:
    """Each module's lower bound on its spread (no equal-size split can go below it)."""
    arrays, _ = _validate(costs, dps, micro_batches)
    out = {}
    for name, c in arrays.items():
        d = int(dps[name]) * int(micro_batches)
        mean = c.sum() / d if d else 0.0
        out[name] = float(unchecked_lower_bound(c, d) / mean) if mean > 0 else 1.0
    return out
