"""The step each rank would see on a device of its own, from measured work. Pure, numpy only.

Measured forward and backward times per (module, replica, PP stage, micro-batch) run through the
dependencies of :mod:`~mimo_accel.balance.step_schedule`'s step model (the same DAG, 1F1B per
stage, encoders the stage before the language model's first), fed measured times in place of
predicted ones. Ranks that share a CPU show no pipeline wait in their wall clock; the replay does.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass

import numpy as np

from mimo_accel.balance.step_schedule import _pipeline
from mimo_accel.modules import LANGUAGE

__all__ = ["Replay", "replay"]


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
    pipe = _pipeline(tuple(names), ds, w, pp, frozen, w * grid)
    work = np.zeros(pipe.cell.size)
    for m, name in enumerate(names):
        shape = (ds[m], pp if name == LANGUAGE else 1, w)
        f = _times(name, forward, shape)
        b = np.zeros(shape) if name in frozen else _times(name, backward, shape)
        for r in range(shape[0]):
            for p in range(shape[1]):
                for j in range(w):
                    work[pipe.op[m, r, p, "F", j]] = f[r, p, j]
                    if name not in frozen:
                        work[pipe.op[m, r, p, "B", j]] = b[r, p, j]
    _, _, fin = pipe.propagate(work[:, None], keep=True)
    ends = fin[pipe.last, 0]
    span = float(ends.max())
    busy, wait, idle = {}, {}, {}
    for (m, r, p), end in zip(pipe.devices, ends):
        ops = [v for (mm, rr, pq, _, _), v in pipe.op.items() if (mm, rr, pq) == (m, r, p)]
        key = (names[m], r, p)
        busy[key] = float(work[ops].sum())
        wait[key] = float(end) - busy[key]
        idle[key] = span - busy[key]
    bubble = {}
    for (name, r, p), v in idle.items():
        bubble.setdefault((name, p), []).append(v / span if span > 0 else 0.0)
    return Replay(span, busy, wait, idle, {k: float(np.mean(v)) for k, v in bubble.items()})
