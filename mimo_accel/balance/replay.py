"""The step each rank would see on a device of its own, from measured work. Pure, numpy only.

Measured forward and backward times per (module, replica, PP stage, micro-batch) run through the
dependencies of :mod:`~mimo_accel.balance.step_schedule`'s step model (the same DAG, 1F1B per
stage, encoders the stage before the language model's first), fed measured times in place of
predicted ones. Ranks that share a CPU show no pipeline wait in their wall clock; the replay does.

From ranks (the report's profile, the metrics' gathered figures alike): :func:`places` puts each
rank on its (module, replica, stage), :func:`replay_ranks` replays a step of their times. From a
replay: :func:`module_shares` (each module's busy share of the step) and :func:`bound_module`.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from mimo_accel.balance.step_schedule import _model, _orders, _pipeline, stage_weights
from mimo_accel.modules import LANGUAGE

__all__ = ["Replay", "Shares", "bound_module", "module_shares", "places", "replay", "replay_plan", "replay_ranks"]


@dataclass(frozen=True)
class Replay:
    """``makespan``: the step (the last stage's last op); per rank (module, replica, stage):
    ``busy`` (its ops' summed time), ``wait`` (idle before its last op ends: waiting on inputs),
    ``idle`` (makespan − busy: its wait and its wait at the step's end); per stage (module, stage):
    ``bubble``, its replicas' mean idle share of the step."""

    makespan: float
    busy: dict
    wait: dict
    idle: dict
    bubble: dict


def _times(name, table, shape):
    a = np.asarray(table.get(name), dtype=np.float64) if name in table else None
    if a is None or a.shape != shape:
        got = None if a is None else a.shape
        raise ValueError(f"measured times of module {name!r} must be an array (replicas, stages, micro-batches) "
                         f"= {shape}, got {got}: one time per rank and micro-batch")
    if not np.isfinite(a).all() or (a < 0).any():
        raise ValueError(f"measured times of module {name!r} must be finite and >= 0 (seconds)")
    return a


@dataclass(frozen=True)
class _OpTable:
    """A pipeline's ops as arrays (one entry an op): its row in the DAG, the device that runs it
    (an index into ``devices``), its module, replica, stage, micro-batch, and whether a backward."""

    rows: np.ndarray
    device: np.ndarray
    module: np.ndarray
    replica: np.ndarray
    stage: np.ndarray
    micro: np.ndarray
    backward: np.ndarray


@lru_cache(maxsize=16)  # beside step_schedule's cache of the pipelines: a run replays one layout
def _op_table(pipe) -> _OpTable:
    device_of = {d: i for i, d in enumerate(pipe.devices)}
    keys = list(pipe.op)
    cols = np.array([(m, r, p, j, kind == "B") for m, r, p, kind, j in keys], dtype=np.int64).reshape(-1, 5)
    return _OpTable(np.fromiter(pipe.op.values(), dtype=np.int64, count=len(keys)),
                    np.array([device_of[k[:3]] for k in keys], dtype=np.int64),
                    cols[:, 0], cols[:, 1], cols[:, 2], cols[:, 3], cols[:, 4].astype(bool))


def replay(forward: Mapping[str, np.ndarray], backward: Mapping[str, np.ndarray], dps: Mapping[str, int],
           micro_batches: int, *, stages: Mapping[str, int] | None = None,
           frozen: Collection[str] = ()) -> Replay:
    """Replay measured times through the step model's schedule.

    ``forward[m]`` / ``backward[m]``: arrays (DP replicas, PP stages, W micro-batches) of seconds;
    an encoder has one stage; a ``frozen`` encoder needs no backward. ``dps``, ``stages``,
    ``frozen`` as in :func:`~mimo_accel.balance.step_schedule.step_time`.
    Raises ValueError naming the fix: no language module, shapes that differ from the layout,
    times that are not finite and >= 0."""
    names = sorted(dps)
    if LANGUAGE not in names:
        raise ValueError(f"the replay needs the language module {LANGUAGE!r} (modules: {names})")
    w = int(micro_batches)
    if w < 1:
        raise ValueError(f"micro_batches must be >= 1, got {micro_batches!r}")
    stages = dict(stages or {})
    pp = int(stages.get(LANGUAGE, 1))
    if any(int(s) != 1 for m, s in stages.items() if m != LANGUAGE) or pp < 1:
        raise ValueError(f"stages {stages}: an encoder is one stage and the language model's PP is >= 1")
    frozen = frozenset((frozen,) if isinstance(frozen, str) else frozen)
    ds = tuple(int(dps[m]) for m in names)
    grid = math.lcm(*ds)
    # one sample per canonical group: the layout alone decides the DAG
    pipe = _pipeline(tuple(names), ds, w, stage_weights(pp), frozen, w * grid)
    measured = []
    for m, name in enumerate(names):
        shape = (ds[m], pp if name == LANGUAGE else 1, w)
        f = _times(name, forward, shape)
        measured.append((f, np.zeros(shape) if name in frozen else _times(name, backward, shape)))
    table = _op_table(pipe)
    times = np.zeros(table.rows.size)
    for m, (f, b) in enumerate(measured):
        at = table.module == m
        r, p, j = table.replica[at], table.stage[at], table.micro[at]
        times[at] = np.where(table.backward[at], b[r, p, j], f[r, p, j])
    work = np.zeros(pipe.cell.size)
    work[table.rows] = times
    return _replayed(pipe, names, work)


def replay_plan(costs: Mapping[str, Sequence[float]], dps: Mapping[str, int], order: Sequence[int],
                micro_batches: int = 1, *, stages: Mapping[str, int] | None = None, frozen: Collection[str] = (),
                stage_shares: Sequence[float] | None = None) -> Replay:
    """The step model's own op times for ``order`` (arguments as
    :func:`~mimo_accel.balance.step_schedule.step_time`'s), replayed: its makespan is that step
    time, and each device's busy and wait as :func:`replay` gives them for measured times."""
    pipe, c, n = _model(costs, dps, micro_batches, stages, frozen, stage_shares)
    loads = pipe.loads(c, _orders(order, n))[:, 0]
    return _replayed(pipe, sorted(dps), pipe.coef * loads[pipe.cell] / pipe.scale)


def _replayed(pipe, names: Sequence[str], work: np.ndarray) -> Replay:
    """:class:`Replay` of ``pipe`` whose ops take ``work`` (one time per op row)."""
    table = _op_table(pipe)
    per_device = np.bincount(table.device, weights=work[table.rows], minlength=len(pipe.devices))
    _, _, fin = pipe.propagate(work[:, None], keep=True)
    ends = fin[pipe.last, 0]
    span = float(ends.max())
    busy, wait, idle = {}, {}, {}
    for (m, r, p), end, spent in zip(pipe.devices, ends, per_device):
        key = (names[m], r, p)
        busy[key] = float(spent)
        wait[key] = float(end) - busy[key]
        idle[key] = span - busy[key]
    bubble = {}
    for (name, r, p), v in idle.items():
        bubble.setdefault((name, p), []).append(v / span if span > 0 else 0.0)
    return Replay(span, busy, wait, idle, {k: float(np.mean(v)) for k, v in bubble.items()})


# ------------------------------------------------------------------------------ from ranks


def places(ranks: Iterable[tuple[int, str, int]], stages: Mapping[str, int]) -> dict[int, tuple[str, int, int]]:
    """Each rank's (module, DP replica, PP stage), from its ``(rank, module, replica)``: a stage's
    ranks are consecutive within the replica (Bridge's MegatronMIMO grids order tp, cp, dp, pp: pp
    slowest), so stage = the rank's position among its replica's ranks over the ranks per stage.
    ``stages``: each module's PP (1 where absent)."""
    replicas: dict[tuple[str, int], list[int]] = defaultdict(list)
    for rank, module, replica in ranks:
        replicas[module, int(replica)].append(int(rank))
    out = {}
    for (module, replica), members in replicas.items():
        pp = int(stages.get(module, 1) or 1)
        per = max(1, len(members) // pp)
        for i, rank in enumerate(sorted(members)):
            out[rank] = (module, replica, min(i // per, pp - 1))
    return out


def replay_ranks(times: Mapping[int, tuple[Sequence[float], Sequence[float] | None]],
                 placed: Mapping[int, tuple[str, int, int]], dps: Mapping[str, int], stages: Mapping[str, int],
                 frozen: Collection[str] = ()) -> Replay:
    """One step replayed from its ranks' measured times: ``times[rank]`` = (forward, backward) time
    per micro-batch, in any one unit (a frozen encoder's backward is not read); ``placed``:
    :func:`places`.
    A stage's TP/CP ranks run each op together: the slowest of them times it. ValueError naming
    why not: ranks that timed different numbers of micro-batches, a stage no rank timed, or what
    :func:`replay` refuses."""
    frozen = frozenset((frozen,) if isinstance(frozen, str) else frozen)
    tables: dict[str, dict[tuple[str, int, int], np.ndarray]] = {"F": {}, "B": {}}
    for rank, (forward, backward) in times.items():
        where = placed[rank]
        for kind, got in (("F", forward), ("B", backward)):
            if kind == "B" and where[0] in frozen:
                continue
            got = np.asarray(got if got is not None else [], dtype=np.float64)
            seen = tables[kind].get(where)
            if seen is not None and seen.shape != got.shape:
                m, r, p = where
                raise ValueError(f"the ranks of {m} replica {r} stage {p} timed {seen.size} and {got.size} "
                                 "micro-batches")
            tables[kind][where] = got if seen is None else np.maximum(seen, got)
    counts = {v.size for table in tables.values() for v in table.values()}
    if len(counts) != 1 or 0 in counts:
        raise ValueError(f"the ranks timed different numbers of micro-batches in a step ({sorted(counts)})")
    w = counts.pop()
    pp = {m: int(stages.get(m, 1) or 1) for m in dps}
    arrays: dict[str, dict[str, np.ndarray]] = {"F": {}, "B": {}}
    for kind, table in tables.items():
        for m in dps:
            if kind == "B" and m in frozen:
                continue
            a = np.zeros((int(dps[m]), pp[m], w))
            for r in range(a.shape[0]):
                for p in range(a.shape[1]):
                    if (m, r, p) not in table:
                        raise ValueError(f"no rank of {m} replica {r} stage {p} is in the profile")
                    a[r, p] = table[m, r, p]
            arrays[kind][m] = a
    return replay(arrays["F"], arrays["B"], dps, w, stages=pp, frozen=frozen)


# ------------------------------------------------------------------------------ who bounds it


@dataclass(frozen=True)
class Shares:
    """A module's part of a replayed step: ``busy`` the mean over its devices (replica × PP stage)
    of busy / makespan, ``busy_max`` its busiest device's; ``wait`` = 1 − busy, the rest of the
    step (waiting on its inputs, the pipeline's fill and drain, the step's end)."""

    busy: float
    busy_max: float

    @property
    def wait(self) -> float:
        return 1.0 - self.busy


def module_shares(r: Replay) -> dict[str, Shares]:
    """Each module's :class:`Shares` of the step ``r`` (0 everywhere in a step of no time)."""
    of: dict[str, list[float]] = defaultdict(list)
    for (module, _, _), spent in r.busy.items():
        of[module].append(spent / r.makespan if r.makespan > 0 else 0.0)
    return {m: Shares(float(np.mean(v)), float(max(v))) for m, v in sorted(of.items())}


def bound_module(shares: Mapping[str, Shares], tolerance: float = 1e-9) -> str | None:
    """The module that bounds the step: the one whose busiest device is busy the largest share of
    it. Ties (within ``tolerance`` of the step) go to an encoder, the first by name, the language
    model last: a fixed rule, so every report of the same times names the same module. None where
    nothing was busy."""
    if not shares or max(s.busy_max for s in shares.values()) <= 0:
        return None
    top = max(s.busy_max for s in shares.values())
    tied = sorted(m for m, s in shares.items() if s.busy_max >= top - tolerance)
    return next((m for m in tied if m != LANGUAGE), tied[0])
