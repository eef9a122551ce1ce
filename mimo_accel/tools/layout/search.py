"""Every non-colocated layout of a model within a GPU budget that fits, and the ones worth pricing.

A layout (:func:`layouts`): per module a TP that divides the GPUs of a node and the module's heads
and query groups (a TP group stays inside a node), the language model's PP dividing its layers
(an encoder is one stage), DPs whose lcm G divides the global micro-batch (each of the
micro-batch sizes tried divides the global batch), every module's memory per GPU within the
GPU's usable memory, and all of them within the budget. Modules are placed on consecutive ranks,
widest TP first (the language model first among equals, as the tutorial places it), so that
each TP group starts on a multiple of its size; a layout whose TP groups would straddle a node
is left out.

Pricing every layout with the step model would take minutes, so :func:`best_first` prices them
in order of an optimistic figure from a lower bound on the step (:class:`Bound`) and stops when
no layout left can reach the ones found.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from itertools import product
from typing import Optional

import numpy as np

from mimo_accel.costs.memory import Footprint
from mimo_accel.modules import LANGUAGE, Modules, module
from mimo_accel.tools.layout.draws import Draws
from mimo_accel.tools.layout.footprint import MemoryModel
from mimo_accel.tools.layout.models import ModelSpec
from mimo_accel.tools.layout.spec import LayoutSpec, spec_text

__all__ = ["Bound", "Candidate", "best_first", "divisors", "layouts", "rank_offsets"]


def divisors(n: int) -> list[int]:
    return [d for d in range(1, int(n) + 1) if n % d == 0]


def rank_offsets(modules: Modules) -> dict[str, int]:
    """Each module's first rank: widest TP first, the language model first among equals."""
    order = sorted(modules, key=lambda m: (-m.tp, m.name != LANGUAGE))
    out, at = {}, 0
    for m in order:
        out[m.name] = at
        at += m.size
    return out


def aligned(modules: Modules, gpus_per_node: int) -> bool:
    """Whether every TP group of the placement lies inside one node."""
    return all(off % m.tp == 0 and gpus_per_node % m.tp == 0 for m in modules
               for off in (rank_offsets(modules)[m.name],))


@dataclass
class Candidate:
    """A layout that fits (or, listed on request, one that does not: ``why_not``)."""

    layout: LayoutSpec
    memory: dict[str, Footprint]
    why_not: Optional[str] = None
    optimistic: float = 0.0


def layouts(model: ModelSpec, memory: MemoryModel, *, budget: int, gbs: int, mbs: Iterable[int],
            frozen: tuple[str, ...] = (), seq_length: Optional[int] = None,
            unfit: Optional[list] = None, tp_held: Optional[dict[str, int]] = None) -> list[Candidate]:
    """Every layout that fits (module docstring); ``unfit``, where given, collects those left out
    by memory or placement (over budget or divisibility: never); ``tp_held``: modules whose TP is
    not searched (held at the given size)."""
    gpn = memory.machine.gpus_per_node
    lang = model.modules[LANGUAGE]
    encoders = list(model.encoders)
    held = tp_held or {}
    tps = {n: [held[n]] if n in held else [t for t in divisors(gpn) if m.tp_fits(t)] for n, m in model.modules.items()}
    out = []
    for b in sorted(set(mbs)):
        w = gbs // b
        dps = divisors(b)
        smallest_encoders = len(encoders)  # one GPU each, at least
        lang_options = [(t, p, d) for t, p, d in product(tps[LANGUAGE], divisors(lang.layers), dps)
                        if t * p * d + smallest_encoders <= budget]
        for t, p, d in lang_options:
            lmem = memory.memory(LANGUAGE, t, p, d, b, w, p)
            if unfit is None and memory.why_not({LANGUAGE: lmem}) is not None:
                continue  # no encoder makes it fit
            left = budget - t * p * d
            per_encoder = [[(te, de) for te, de in product(tps[e], dps) if te * de <= left and (
                unfit is not None or memory.why_not({e: memory.memory(e, te, 1, de, b, w, p)}) is None)]
                for e in encoders]
            for combo in product(*per_encoder):
                if t * p * d + sum(te * de for te, de in combo) > budget:
                    continue
                mods = Modules(tuple(module(e, de, tp=te) for e, (te, de) in zip(encoders, combo))
                               + (module(LANGUAGE, d, tp=t, pp=p),))
                foot = {e: memory.memory(e, te, 1, de, b, w, p) for e, (te, de) in zip(encoders, combo)}
                foot[LANGUAGE] = lmem
                why = memory.why_not(foot)
                if why is None and not aligned(mods, gpn):
                    why = f"a TP group would straddle a node of {gpn} GPUs"
                layout = LayoutSpec(spec_text(mods, b, gbs, frozen, seq_length), mods, b, gbs, tuple(frozen), seq_length)
                if why is None:
                    out.append(Candidate(layout, foot))
                elif unfit is not None:
                    unfit.append(Candidate(layout, foot, why))
    return out


class Bound:
    """A lower bound on a layout's modelled step, per plan: the mean over the drawn steps of
    ``max(busiest module's work / (dp·pp), the language model's work / (dp·pp) + (pp−1)/pp ·
    its lightest cell)`` plus the step's end. No op of a GPU overlaps another, so a GPU is busy for
    at least its share; the language model's last stage cannot start before its first micro-batch
    has crossed the pp−1 stages before it, nor end before the last one's gradient has crossed them
    back, a cell's worth (at least its lightest) of pipeline fill and drain."""

    def __init__(self, draws: Draws, seconds, names: Iterable[str]):
        self.draws, self.seconds = draws, seconds
        n, s = draws.steps * draws.gbs, draws.steps
        idx = np.arange(n)
        tok = draws.index.tokens(idx).astype(np.float64)
        encoders = [m for m in names if m != LANGUAGE]
        self.features = {LANGUAGE: (tok, tok * tok, np.ones(n))}  # k: per sample
        for e in encoders:
            col = draws.index.column_for(e, encoders, lambda *_: None)
            self.features[e] = tuple(np.asarray(f(col, idx), dtype=np.float64)
                                     for f in (draws.index.rows, draws.index.sq_rows, draws.index.items))
        self.shape = (s, draws.gbs)
        self._sums: dict = {}

    def _module(self, name: str, cost) -> tuple[np.ndarray, np.ndarray]:
        key = (name, cost.a, cost.b, cost.k)
        if key not in self._sums:
            x, y, z = self.features[name]
            c = (cost.a * x + cost.b * y + cost.k * z).reshape(self.shape)
            self._sums[key] = (c.sum(axis=1), c.min(axis=1))
        return self._sums[key]

    def of(self, layout: LayoutSpec, padded: bool) -> float:
        model = self.seconds.cost_model(layout)
        worst = np.zeros(self.shape[0])
        for m in layout.modules:
            cost = model.of(m.name)
            if m.name == LANGUAGE and padded:
                c = float(cost.language_costs(np.array([self.draws.seq_length]))[0])
                total, lightest = np.full(self.shape[0], c * self.draws.gbs), np.full(self.shape[0], c)
            else:
                total, lightest = self._module(m.name, cost)
            mine = total / (m.dp * m.pp)
            if m.name == LANGUAGE:
                mine = mine + (m.pp - 1) / m.pp * (layout.mbs // m.dp) * lightest
            worst = np.maximum(worst, mine)
        return float(worst.mean()) + self.seconds.step_end(layout)


def best_first(candidates: list[Candidate], optimistic: Callable[[Candidate], float],
               actual: Callable[[Candidate], float], *, top: int, tie: float,
               group: Callable[[Candidate], int] = lambda c: 0) -> list[tuple[float, Candidate]]:
    """``(actual value, candidate)`` of the candidates priced, highest ``optimistic`` first, within
    each ``group`` (a group ranks after the ones before it: it is priced only while they hold fewer
    than ``top``) until ``top`` are priced and the next one's optimistic value is below
    ``(1 - tie)`` × the ``top``-th best actual value of its group (none left could enter the
    ``top``, nor tie with them)."""
    for c in candidates:
        c.optimistic = optimistic(c)
    done: list[tuple[float, Candidate]] = []
    for g in sorted({group(c) for c in candidates}):
        if len(done) >= top:
            break
        found: list[float] = []
        for c in sorted((c for c in candidates if group(c) == g), key=lambda c: -c.optimistic):
            if len(found) >= top and c.optimistic < (1 - tie) * sorted(found, reverse=True)[top - 1]:
                break
            value = actual(c)
            if math.isfinite(value):
                found.append(value)
                done.append((value, c))
    return done
