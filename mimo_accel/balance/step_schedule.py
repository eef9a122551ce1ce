"""The step the pipeline runs: its modelled time (:func:`step_time`) and a plan that shortens it
(:func:`plan_step`). Pure, numpy only.

The model is megatron-core's ``forward_backward_pipelining_without_interleaving`` over MegatronMIMO's
multi-module pipeline (``pipeline_parallel/schedules.py``, ``multimodule_communicator.py``):

- each encoder's DP replicas are the stage before the language model's first PP stage, joined by
  the canonical grid (fan-in: a language micro-batch needs every encoder replica holding one of its
  groups; fan-out: an encoder's backward needs every language replica it feeds);
- a language replica runs ``stages["language"]`` PP stages, a micro-batch's work split by
  ``stage_shares`` (evenly where not given; Megatron's first stage holds the embedding, its last
  the output layer and the loss);
- every stage runs 1F1B: ``min(W, stages after it)`` warm-up forwards, one forward / one backward,
  the cool-down backwards; a forward is 1/3 of a trained module's time, a backward 2/3; a frozen
  encoder runs its forwards back to back;
- an op starts when its stage is free and its inputs are there (no transfer time); the step ends
  when every stage's last op is done (the ranks meet at the gradient all-reduce; design.md, "The
  step's end").

Orders follow :func:`~mimo_accel.balance.balance_modules`' convention: micro-batch j is block j of
the order, cut into G = lcm(DPs) canonical groups; module m's replica r owns groups r·G/d_m …
(r+1)·G/d_m − 1.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from functools import lru_cache

import numpy as np

from mimo_accel.balance.joint import _validate, balance_modules
from mimo_accel.modules import LANGUAGE

__all__ = ["step_time", "plan_step", "stage_weights"]

_QUANT = float(1 << 24)  # the largest sample cost, in the plan's integer units
_SHARE_UNITS = 1 << 12  # a language stage's share of a micro-batch, in integer units
_CHUNK, _FIRST_CHUNK = 512, 32  # candidate moves evaluated at once, at most (in a round's first: the best-ranked)
_ROUNDS = 400  # moves a plan may make
_WORK = 3 << 20  # op evaluations a plan may spend: at 64 samples (320 ops) about 0.2 s on 2 vCPUs
_FULL_WORK_UP_TO = 64  # samples up to which a plan gets all of _WORK; above, a share falling as 1/N
_HOT = 64  # samples on the critical path a round moves, at most
_PARTNERS = 256  # samples they may swap with, at most
_SWAPS_KEPT = 8 * _CHUNK  # moves of each kind a round considers (the most promising by the critical path)


def _checked(costs, dps, micro_batches, stages, frozen):
    """(costs per module, names, language PP stages, frozen encoders); ValueError naming the fix."""
    arrays, _ = _validate(costs, dps, micro_batches)
    names = sorted(arrays)
    if LANGUAGE not in arrays:
        raise ValueError(f"the step model needs the language module {LANGUAGE!r} (modules: {names}): its "
                         "stages are the pipeline the encoders feed")
    for name, c in arrays.items():
        if not c.size or not c[c.argmax()] > 0:
            raise ValueError(f"module {name!r} has no time in these samples (every cost is 0): costs in different "
                             "units (a module with no time)? Price every module in seconds with the cost model, "
                             "or leave a module with no work out of costs and dps")
    stages = dict(stages or {})
    for name, s in stages.items():
        if name not in arrays:
            raise ValueError(f"stages names {name!r}, which is not a module of costs/dps ({names})")
        if isinstance(s, bool) or not isinstance(s, (int, np.integer)) or s < 1:
            raise ValueError(f"stages[{name!r}] must be a positive integer (PP stages), got {s!r}")
        if name != LANGUAGE and s > 1:
            raise ValueError(f"stages[{name!r}] = {s}: the step model takes an encoder as one stage; give its "
                             "PP as 1 (its time per sample is the whole replica's)")
    frozen = frozenset((frozen,) if isinstance(frozen, str) else frozen)
    for name in sorted(frozen):
        if name not in arrays:
            raise ValueError(f"frozen names {name!r}, which is not a module of costs/dps ({names})")
        if name == LANGUAGE:
            raise ValueError(f"frozen names the language module {LANGUAGE!r}: only an encoder can be frozen in "
                             "the step model; train the language model or leave it out of frozen")
    return arrays, names, int(stages.get(LANGUAGE, 1)), frozen


def _depths(preds: list[list[int]]) -> np.ndarray:
    """Each op's depth in the DAG (0: waits on nothing), level by level (Kahn)."""
    succ = [[] for _ in preds]
    for v, ps in enumerate(preds):
        for u in ps:
            succ[u].append(v)
    waiting, depth = [len(p) for p in preds], [0] * len(preds)
    level, seen = [v for v, k in enumerate(waiting) if not k], 0
    while level:
        seen += len(level)
        nxt = []
        for u in level:
            for v in succ[u]:
                depth[v], waiting[v] = max(depth[v], depth[u] + 1), waiting[v] - 1
                if not waiting[v]:
                    nxt.append(v)
        level = nxt
    if seen != len(preds):  # pragma: no cover - 1F1B never waits on itself
        raise RuntimeError("the step model's schedule has a cycle")
    return np.array(depth, dtype=np.int64)


def _one_f_one_b(micro_batches: int, warmup: int) -> list[tuple[str, int]]:
    """One stage's ops: ``warmup`` forwards, then 1F1B, then the cool-down backwards."""
    w = min(micro_batches, warmup)
    ops = [("F", j) for j in range(w)]
    for i in range(micro_batches - w):
        ops += [("F", w + i), ("B", i)]
    return ops + [("B", j) for j in range(micro_batches - w, micro_batches)]


class _Pipeline:
    """The step's ops as a DAG, in levels of independent ops, for one layout.

    Cells: (module, micro-batch, replica), module by module in name order, then micro-batch, then
    replica. Each op's time is ``coef × its cell's load``; coefficients are integers in units of
    1/(3·Σ weights) of a cost (language stage p's share is ``weights[p] / Σ weights``), so integer
    loads give exact (order-free) sums."""

    def __init__(self, names, dps, micro_batches, weights, frozen, n):
        w, pp, whole = micro_batches, len(weights), sum(weights)
        grid = math.lcm(*dps)
        self.n, self.w, self.scale = n, w, 3 * whole
        self.cell_base, base = [], 0  # each module's first cell
        for d in dps:
            self.cell_base.append(base)
            base += w * d
        self.n_cells = base
        pos = np.arange(n)
        j, g = pos // (n // w), (pos % (n // w)) // (n // w // grid)
        # (M, N): the cell of each position, per module
        self.cell_of = np.stack([b + j * d + g // (grid // d) for b, d in zip(self.cell_base, dps)])
        lang = names.index(LANGUAGE)
        encoders, dl = [m for m in range(len(names)) if m != lang], dps[lang]
        devices = []  # (module, replica, stage, its ops, forward coefficient, backward coefficient)
        for m in encoders:
            trained = names[m] not in frozen
            seq = _one_f_one_b(w, pp) if trained else [("F", j) for j in range(w)]
            # a trained encoder: forward 1/3 and backward 2/3 of its time; a frozen one: all forward
            devices += [(m, q, 0, seq, whole if trained else 3 * whole, 2 * whole) for q in range(dps[m])]
        devices += [(lang, r, p, _one_f_one_b(w, pp - 1 - p), weights[p], 2 * weights[p])
                    for r in range(dl) for p in range(pp)]
        cell, coef, ops, preds = [], [], {}, []
        for m, r, p, seq, forward, backward in devices:
            for k, (op, j) in enumerate(seq):
                ops[m, r, p, op, j] = len(cell)
                cell.append(self.cell_base[m] + j * dps[m] + r)
                coef.append(forward if op == "F" else backward)
                preds.append([len(cell) - 2] if k else [])  # the stage's previous op

        def feeds(m, q, r):  # encoder m's replica q holds a group of language replica r
            return q * grid // dps[m] < (r + 1) * grid // dl and r * grid // dl < (q + 1) * grid // dps[m]

        for r in range(dl):
            for jj in range(w):
                for m in encoders:
                    for q in range(dps[m]):
                        if feeds(m, q, r):
                            preds[ops[(lang, r, 0, "F", jj)]].append(ops[(m, q, 0, "F", jj)])
                            if names[m] not in frozen:
                                preds[ops[(m, q, 0, "B", jj)]].append(ops[(lang, r, 0, "B", jj)])
                for p in range(1, pp):
                    preds[ops[(lang, r, p, "F", jj)]].append(ops[(lang, r, p - 1, "F", jj)])
                    preds[ops[(lang, r, p - 1, "B", jj)]].append(ops[(lang, r, p, "B", jj)])
        # ops renumbered by depth (ops of one depth never wait on each other): each level is a
        # contiguous range, computed for every candidate at once
        depth = _depths(preds)
        new = np.empty(len(cell), dtype=np.int64)
        new[np.lexsort((np.arange(len(cell)), depth))] = np.arange(len(cell))
        self.cell = np.empty(len(cell), dtype=np.int64)
        self.cell[new] = cell
        self.coef = np.empty(len(cell))
        self.coef[new] = coef
        self.last = new[[ops[(m, r, p, *seq[-1])] for m, r, p, seq, _, _ in devices]]
        # for a replay of measured times: each op's row by (module, replica, stage, "F"/"B", micro-batch)
        self.op, self.devices = {key: int(new[v]) for key, v in ops.items()}, [d[:3] for d in devices]
        self.preds = [[] for _ in cell]
        for v, ps in enumerate(preds):
            self.preds[new[v]] = [int(new[u]) for u in ps]
        self.levels, none = [], len(cell)  # none: the always-0 row, a missing pred
        bounds = np.flatnonzero(np.diff(np.sort(depth))) + 1
        for lo, hi in zip([0, *bounds.tolist()], [*bounds.tolist(), len(cell)]):
            width = max(len(self.preds[v]) for v in range(lo, hi))
            cols = [np.array([self.preds[v][k] if k < len(self.preds[v]) else none for v in range(lo, hi)],
                             dtype=np.int64) for k in range(width)]
            self.levels.append((lo, hi, cols))

    def loads(self, q: np.ndarray, orders: np.ndarray) -> np.ndarray:
        """Cell loads (C, K) of the orders (K, N) for per-module costs q (M, N)."""
        k = orders.shape[0]
        out = np.zeros(k * self.n_cells)
        column = (np.arange(k) * self.n_cells)[:, None]
        for m in range(q.shape[0]):
            out += np.bincount((self.cell_of[m][None, :] + column).ravel(), weights=q[m][orders].ravel(),
                               minlength=out.size)
        return out.reshape(k, self.n_cells).T.copy()

    def run(self, loads: np.ndarray, keep: bool = False):
        """(makespan, sum of the stages' end times) per column of ``loads`` (C, K), in cost ×
        ``scale`` units; with ``keep``, also every op's finish time (for the critical path)."""
        return self.propagate(self.coef[:, None] * loads[self.cell], keep)

    def propagate(self, work: np.ndarray, keep: bool = False):  # each op's own time (ops, K): a replay
        fin = np.zeros((self.cell.size + 1, work.shape[1]))
        for lo, hi, cols in self.levels:
            if not cols:
                fin[lo:hi] = work[lo:hi]
                continue
            ready = fin[cols[0]]
            for c in cols[1:]:
                np.maximum(ready, fin[c], out=ready)
            np.add(ready, work[lo:hi], out=fin[lo:hi])
        ends = fin[self.last]
        return ends.max(axis=0), ends.sum(axis=0), (fin if keep else None)

    def critical_weights(self, loads: np.ndarray, fin: np.ndarray) -> np.ndarray:
        """Per cell, the summed coefficient of its ops on one critical path of the single column
        ``loads`` (C, 1): the path's length is this · loads."""
        a = np.zeros(self.n_cells)
        done = fin[:, 0].tolist()
        v = int(self.last[int(np.argmax(fin[self.last, 0]))])
        while v is not None:
            c, k = int(self.cell[v]), float(self.coef[v])
            a[c] += k
            start = done[v] - k * float(loads[c, 0])
            v = next((u for u in self.preds[v] if done[u] == start), None)
        return a


@lru_cache(maxsize=16)
def _pipeline(names, dps, micro_batches, weights, frozen, n) -> _Pipeline:
    return _Pipeline(names, dps, micro_batches, weights, frozen, n)


def stage_weights(pp: int, shares: Sequence[float] | None = None) -> tuple[int, ...]:
    """The language stages' integer weights: ``shares`` (each stage's share of a micro-batch's
    work) in units of 2**-12, at least 1 (a plan is decided in integers: the same on every CPU);
    all 1 (even) where ``shares`` is None."""
    if shares is None:
        return (1,) * pp
    s = np.asarray(shares, dtype=np.float64)
    if s.shape != (pp,) or not np.isfinite(s).all() or (s < 0).any() or not s.sum() > 0:
        raise ValueError(f"stage_shares must be {pp} finite shares >= 0 (one per language PP stage), got {shares!r}")
    return tuple(int(x) for x in np.maximum(np.rint(s / s.sum() * _SHARE_UNITS), 1))


def _model(costs, dps, micro_batches, stages, frozen, shares=None):
    arrays, names, pp, frozen = _checked(costs, dps, micro_batches, stages, frozen)
    n = arrays[names[0]].size
    pipe = _pipeline(tuple(names), tuple(int(dps[m]) for m in names), int(micro_batches), stage_weights(pp, shares),
                     frozenset(frozen), n)
    return pipe, np.stack([arrays[m] for m in names]), n


def _orders(order, n) -> np.ndarray:
    o = np.asarray(order)
    if o.ndim not in (1, 2) or o.shape[-1] != n or (o.size and o.dtype.kind not in "iu"):
        raise ValueError(f"order must be a permutation of range({n}) (or a 2-D array of them, one a row)")
    o = o.astype(np.int64).reshape(-1, n)
    if not np.array_equal(np.sort(o, axis=1), np.broadcast_to(np.arange(n), o.shape)):
        raise ValueError(f"order must be a permutation of range({n}): every sample once")
    return o


def step_time(costs: Mapping[str, Sequence[float]], dps: Mapping[str, int], order: Sequence[int],
              micro_batches: int = 1, *, stages: Mapping[str, int] | None = None,
              frozen: Collection[str] = (), stage_shares: Sequence[float] | None = None) -> float | np.ndarray:
    """The modelled time of one step that runs the samples in ``order`` (see the module docstring).

    ``costs[m]``: each sample's time on module m in the step (forward and backward where it
    trains, forward alone where it is ``frozen``), in seconds; ``dps[m]``: its DP size;
    ``stages[m]``: its PP stages (default 1; the language model only: an encoder is one stage);
    ``micro_batches``: W, the step's micro-batches (blocks of ``order``); ``stage_shares``: each
    language stage's share of a micro-batch's work (default even: :func:`stage_weights`). ``order``
    may also be a 2-D array of permutations, one a row: then an array of their step times.
    Raises ValueError naming the fix: modules that differ between ``costs`` and ``dps``, no
    ``"language"`` module, a module whose every cost is 0 (costs in different units), costs that
    are not finite and >= 0, N not a multiple of W·G, stages < 1, encoder stages > 1, a frozen
    module that is not an encoder, an order that is not a permutation.
    """
    pipe, c, n = _model(costs, dps, micro_batches, stages, frozen, stage_shares)
    orders = _orders(order, n)
    span, _, _ = pipe.run(pipe.loads(c, orders))
    times = span / pipe.scale
    return float(times[0]) if np.asarray(order).ndim == 1 else times


def _smallest(values: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k smallest values, ascending, ties by index (the same on every CPU)."""
    if values.size <= k:
        return np.argsort(values, kind="stable")
    cut = np.partition(values, k - 1)[k - 1]
    below = np.flatnonzero(values < cut)
    at = np.flatnonzero(values == cut)[:k - below.size]
    picked = np.concatenate((below, at))
    return picked[np.argsort(values[picked], kind="stable")]


def _improving(span, ends, now_span, now_ends) -> np.ndarray:
    """The candidates that shorten the step (or, as long, end the stages sooner in sum), best first."""
    ok = np.flatnonzero((span < now_span) | ((span == now_span) & (ends < now_ends)))
    return ok[np.lexsort((ok, ends[ok], span[ok]))]


class _Search:
    """A local search on the integer step model. Moves: a swap of two samples (between cells and
    micro-batches), and a reorder of whole micro-batches (two swapped, or one moved elsewhere).
    A move that does not shorten the current critical path cannot shorten the step, so only those
    are tried, the most shortening first, in growing chunks; the best of the first chunk that
    improves the step (ties: the stages' summed end times, so a second critical path can be worked
    on) is made. After a swap, the next improving swaps of that chunk that touch other positions
    are checked again and made while they still improve."""

    def __init__(self, pipe: _Pipeline, q: np.ndarray, order: np.ndarray):
        self.pipe, self.q = pipe, q
        self.order = order.copy()
        self.blocks = pipe.w
        self.work = 0

    def _run(self, loads, keep=False):
        self.work += loads.shape[1] * self.pipe.cell.size
        return self.pipe.run(loads, keep)

    def _swap_moves(self, a):
        """The sample swaps that shorten the critical path, most first: positions (p, q). Among
        many samples, one side is a sample on the path costing the path the most, the other a
        sample the path's modules price lowest (a bounded number of each)."""
        cells = self.pipe.cell_of  # (M, N)
        weight = a[cells]  # (M, N): the path's weight per unit of load at each position
        value = self.q[:, self.order]  # (M, N): each position's sample cost
        on_path = (weight * value).sum(axis=0)
        hot = np.flatnonzero(on_path > 0)
        if not hot.size:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        hot = np.sort(hot[_smallest(-on_path[hot], _HOT)])
        partners = np.arange(self.pipe.n)
        if partners.size > _PARTNERS:  # the cheapest samples of each module the path crosses
            crossed = np.flatnonzero(weight.any(axis=1))
            each = _PARTNERS // max(1, crossed.size)
            partners = np.unique(np.concatenate([hot, *(_smallest(value[m], each) for m in crossed)]))
        # samples at p and q swap: the path changes by sum_m (w[m,p] - w[m,q]) (v[m,q] - v[m,p])
        change = np.zeros((hot.size, partners.size))
        for m in np.flatnonzero(weight.any(axis=1)):
            change += (weight[m, hot][:, None] - weight[m, partners][None, :]) * (
                value[m, partners][None, :] - value[m, hot][:, None])
        is_hot = np.zeros(self.pipe.n, bool)
        is_hot[hot] = True
        change[is_hot[None, partners] & (hot[:, None] >= partners[None, :])] = 0  # each pair once
        flat = change.ravel()
        useful = np.flatnonzero(flat < 0)
        pick = useful[_smallest(flat[useful], _SWAPS_KEPT)]
        return hot[pick // partners.size], partners[pick % partners.size]

    def _block_moves(self, a, loads):
        """The micro-batch reorders that shorten the critical path, most first: (K, W) orders of
        the micro-batches (row k: the old micro-batch at each position), two swapped or one moved."""
        w = self.blocks
        # weight[j, k]: the path's weights at micro-batch j's cells times micro-batch k's loads
        weight = np.zeros((w, w))
        for lo, hi in zip(self.pipe.cell_base, [*self.pipe.cell_base[1:], self.pipe.n_cells]):
            weight += a[lo:hi].reshape(w, -1) @ loads[lo:hi, 0].reshape(w, -1).T
        diag = np.concatenate(([0.0], np.cumsum(np.diag(weight))))  # prefix sums
        later = np.concatenate(([0.0], np.cumsum(np.diag(weight, 1))))  # position k takes k + 1
        earlier = np.concatenate(([0.0], np.cumsum(np.diag(weight, -1))))  # position k + 1 takes k
        i, j = (x.ravel() for x in np.indices((w, w)))
        swap = i < j
        moved = np.abs(i - j) > 1  # micro-batch i moved to position j (next to it: a swap)
        kind = np.concatenate((np.zeros(int(swap.sum()), np.int64), np.ones(int(moved.sum()), np.int64)))
        si, sj, mi, mj = i[swap], j[swap], i[moved], j[moved]
        change = np.concatenate((
            weight[si, sj] + weight[sj, si] - weight[si, si] - weight[sj, sj],
            np.where(mi < mj, later[mj] - later[np.minimum(mi, mj)], earlier[mi] - earlier[np.minimum(mi, mj)])
            + weight[mj, mi] - (diag[np.maximum(mi, mj) + 1] - diag[np.minimum(mi, mj)])))
        keep = np.flatnonzero(change < 0)
        keep = keep[_smallest(change[keep], _SWAPS_KEPT)]
        i, j = np.concatenate((si, mi))[keep, None], np.concatenate((sj, mj))[keep, None]
        t = np.arange(w)[None, :]
        inside = (t >= np.minimum(i, j)) & (t <= np.maximum(i, j))
        moved_along = np.where(t == j, i, np.where(inside, np.where(i < j, t + 1, t - 1), t))
        swapped = np.where(t == i, j, np.where(t == j, i, t))
        return np.where(kind[keep, None] == 0, swapped, moved_along)

    def _cell_perm(self, perms):
        """(K, C): the old cell each new cell's load comes from, per micro-batch permutation."""
        pipe = self.pipe
        out = np.empty((perms.shape[0], pipe.n_cells), dtype=np.int64)
        bases = pipe.cell_base + [pipe.n_cells]
        for b, e in zip(bases, bases[1:]):
            d = (e - b) // self.blocks
            out[:, b:e] = (b + perms[:, :, None] * d + np.arange(d)[None, None, :]).reshape(perms.shape[0], e - b)
        return out

    def _swapped_loads(self, loads, sp, sq):
        """Cell loads (C, K) after each swap of positions sp[k], sq[k]."""
        out = np.repeat(loads, sp.size, axis=1)
        cols = np.arange(sp.size)
        for m in range(self.q.shape[0]):
            cells = self.pipe.cell_of[m]
            d = self.q[m, self.order[sq]] - self.q[m, self.order[sp]]
            out[cells[sp], cols] += d
            out[cells[sq], cols] -= d
        return out

    def run(self, budget: int = _WORK) -> np.ndarray:
        loads = self.pipe.loads(self.q, self.order[None, :])
        span, ends, fin = self._run(loads, keep=True)
        for _ in range(_ROUNDS):
            if self.work > budget:
                break
            a = self.pipe.critical_weights(loads, fin)
            pp, qq = self._swap_moves(a)
            perms = self._block_moves(a, loads)
            lo, size, made = 0, _FIRST_CHUNK, False
            while not made and lo < max(pp.size, len(perms)) and (lo == 0 or self.work <= budget):
                sub, sp, sq = perms[lo:lo + size], pp[lo:lo + size], qq[lo:lo + size]
                lo, size = lo + size, min(2 * size, _CHUNK)
                span_c, ends_c, _ = self._run(np.concatenate(
                    (loads[self._cell_perm(sub), 0].T, self._swapped_loads(loads, sp, sq)), axis=1))
                ok = _improving(span_c, ends_c, span[0], ends[0])
                if not ok.size:
                    continue
                made = True
                if ok[0] < len(sub):
                    self.order = self.order.reshape(self.blocks, -1)[sub[ok[0]]].ravel().copy()
                    continue
                # the best swap, then the chunk's next improving swaps apart from those made, each
                # checked again from the step as it now is and made while it still improves
                sp, sq = sp[ok[ok >= len(sub)] - len(sub)], sq[ok[ok >= len(sub)] - len(sub)]
                while sp.size:
                    p, q = int(sp[0]), int(sq[0])
                    self.order[[p, q]] = self.order[[q, p]]
                    apart = (sp != p) & (sp != q) & (sq != p) & (sq != q)
                    sp, sq = sp[apart], sq[apart]
                    if sp.size and self.work <= budget:
                        loads = self.pipe.loads(self.q, self.order[None, :])
                        span_c, ends_c, _ = self._run(np.concatenate((loads, self._swapped_loads(loads, sp, sq)), 1))
                        ok = _improving(span_c[1:], ends_c[1:], span_c[0], ends_c[0])
                        sp, sq = sp[ok], sq[ok]
                    else:
                        break
            if not made:
                break
            loads = self.pipe.loads(self.q, self.order[None, :])
            span, ends, fin = self._run(loads, keep=True)
        self.span = span[0]  # the step of the order returned
        return self.order


def _pyramid(q, pipe, lang, dl):
    """A start for the pipeline: the language model's samples dealt over its replicas by cost
    (serpentine: equal sums), each replica's samples ascending into its micro-batches (micro-batch
    k holds every replica's k-th lightest cell), the micro-batches then laid lightest at both ends
    and heaviest in the middle (a 1F1B pipeline fills and drains on its ends)."""
    n, w = pipe.n, pipe.w
    ranked = np.argsort(-q[lang], kind="stable")
    lap, seat = np.arange(n) // dl, np.arange(n) % dl
    replica = np.where(lap % 2 == 0, seat, dl - 1 - seat)
    ascending = ranked[np.argsort(replica, kind="stable")].reshape(dl, -1)[:, ::-1]  # each replica's samples
    cells = ascending.reshape(dl, w, -1).transpose(1, 0, 2)  # (W, dl, per): every replica's k-th lightest
    k = np.arange(w)
    out = np.empty_like(cells)
    out[np.where(k % 2 == 0, k // 2, w - 1 - k // 2)] = cells
    return out.ravel()


def plan_step(costs: Mapping[str, Sequence[float]], dps: Mapping[str, int], micro_batches: int = 1, *,
              stages: Mapping[str, int] | None = None, frozen: Collection[str] = (),
              stage_shares: Sequence[float] | None = None) -> list[int]:
    """A permutation of ``range(N)`` in :func:`balance_modules`' convention whose modelled step
    (:func:`step_time`, same arguments) is as short as the search finds.

    Samples move between micro-batches and replicas, and micro-batches are reordered. Starts: the
    original order, :func:`balance_modules`' plan (where a group holds more than one sample) and a
    pipeline start (:func:`_pyramid`); the best is improved by a local search (:class:`_Search`) in
    integer units (the largest sample is 2**24, exact in float64), so every rank plans the same on
    any CPU; ties go to the earlier candidate. The work is bounded by move and evaluation budgets,
    never a clock (up to 64 samples the whole budget, above a share falling as 1/N: at 4096
    samples, W 8, 1.2-1.5x balance_modules' time, docs/measurements.md). Never worse than the
    original order in the model (the original on ties); samples inside a group keep ascending
    position. Raises ValueError as :func:`step_time` does.
    """
    pipe, c, n = _model(costs, dps, micro_batches, stages, frozen, stage_shares)
    q = np.rint(c / c.max() * _QUANT)  # integers held in float64: every sum below is exact
    identity = np.arange(n, dtype=np.int64)
    starts = [identity]
    per_group = n // micro_batches // math.lcm(*(int(d) for d in dps.values()))
    if per_group > 1:  # groups of more than one sample: balance_modules evens the cells
        starts.append(np.asarray(balance_modules(costs, dps, micro_batches), dtype=np.int64))
    starts.append(_pyramid(q, pipe, sorted(costs).index(LANGUAGE), int(dps[LANGUAGE])))
    spans, ends, _ = pipe.run(pipe.loads(q, np.stack(starts)))
    first = min(range(len(starts)), key=lambda i: (spans[i], ends[i], i))
    search = _Search(pipe, q, starts[first])
    planned = search.run(int(_WORK * min(1.0, _FULL_WORK_UP_TO / n)))
    if not search.span < spans[0]:
        return identity.tolist()
    return np.sort(planned.reshape(-1, per_group), axis=1).ravel().tolist()
