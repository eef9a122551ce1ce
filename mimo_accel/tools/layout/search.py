"""Every non-colocated layout of a model within a GPU budget that fits, and the ones worth pricing.

A layout (:func:`layouts`): per module a TP that divides the GPUs of a node and the module's heads
and query groups (a TP group stays inside a node), the language model's PP dividing its layers
(an encoder is one stage) or split as megatron-core splits them unevenly (:func:`splits`), DPs
whose lcm G divides the global micro-batch (each of the micro-batch sizes tried divides the global
batch), every module's memory per GPU within the GPU's usable memory, and all of them within the
budget. Modules are placed on consecutive ranks, widest TP first (the language model first among
equals, as the tutorial places it), so that each TP group starts on a multiple of its size; a
layout whose TP groups would straddle a node is left out.

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

from mimo_accel.modules import LANGUAGE, Modules, module
from mimo_accel.tools.layout.memory import Footprint
from mimo_accel.tools.layout.pricing import padded_cost
from mimo_accel.tools.layout.spec import LayoutSpec, stage_layers

__all__ = ["Bound", "Candidate", "best_first", "divisors", "layouts", "rank_offsets", "splits"]


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


def splits(problem, pp: int) -> list[tuple[Optional[int], Optional[int]]]:
    """The language model's splits over ``pp`` stages worth pricing, as ``(first, last)`` layers
    (None: megatron-core's even split): the even one where ``pp`` divides the layers, and of every
    split megatron-core offers (the first and last stage's own counts, the stages between even) the
    one whose busiest stage does the least work per token (its layers, the first stage's embedding,
    the last's output layer and loss), where it differs; of equals, the one with the fewest layers
    on the first stage (which holds the most micro-batches' activations)."""
    layers = problem.model.modules[LANGUAGE].layers
    out = [(None, None)] if layers % pp == 0 else []
    if pp == 1:
        return out
    best, best_work = None, math.inf
    for middle in range(1, layers // max(1, pp - 2) + 1) if pp > 2 else (0,):
        rest = layers - (pp - 2) * middle
        for first in range(1, rest):
            candidate = stage_layers(layers, pp, first, rest - first) if rest - first >= 1 else None
            if candidate is None:
                continue
            work = problem.seconds.stage_token_work(candidate)
            if work < best_work - 1e-12:
                best, best_work = (first, rest - first), work
    if best is not None and not (layers % pp == 0 and best == (layers // pp,) * 2):
        out.append(best)
    return out


@dataclass
class Candidate:
    """A layout that fits (or, listed on request, one that does not: ``why_not``)."""

    layout: LayoutSpec
    memory: dict[str, Footprint]
    why_not: Optional[str] = None
    optimistic: float = 0.0


def layouts(problem, *, budget: int, mbs: Iterable[int], unfit: Optional[list] = None) -> list[Candidate]:
    """Every layout of ``problem`` that fits (module docstring); ``unfit``, where given, collects
    those left out by memory or placement (over budget or divisibility: never)."""
    memory, model, gbs = problem.memory, problem.model, problem.gbs
    gpn = problem.machine.gpus_per_node
    lang = model.modules[LANGUAGE]
    encoders = list(model.encoders)
    held = problem.tp_held
    tps = {n: [held[n]] if n in held else [t for t in divisors(gpn) if m.tp_fits(t)] for n, m in model.modules.items()}
    # PP sizes megatron-core splits the layers over: evenly, or with the embedding and the loss
    # counted as layers (account_for_{embedding,loss}_in_pipeline_split), each at its best split
    sizes = {p for n in (lang.layers, lang.layers + 1, lang.layers + 2) for p in divisors(n) if p <= lang.layers}
    options = {p: splits(problem, p) for p in sorted(sizes) if p + len(encoders) <= budget}
    out = []
    for b in sorted(set(mbs)):
        w = gbs // b
        dps = divisors(b)
        lang_options = [(t, p, d, s) for t, (p, ways) in product(tps[LANGUAGE], options.items()) for d in dps
                        if t * p * d + len(encoders) <= budget for s in ways]
        for t, p, d, (first, last) in lang_options:
            language = module(LANGUAGE, d, tp=t, pp=p)
            lmem = memory.language(language, b, w, stage_layers(lang.layers, p, first, last))
            if unfit is None and memory.why_not({LANGUAGE: lmem}) is not None:
                continue  # no encoder makes it fit
            left = budget - t * p * d
            per_encoder = [[x for te, de in product(tps[e], dps) if te * de <= left
                            for x in [module(e, de, tp=te)]
                            if unfit is not None or memory.why_not({e: memory.encoder(x, b, w, p)}) is None]
                           for e in encoders]
            for combo in product(*per_encoder):
                if t * p * d + sum(x.size for x in combo) > budget:
                    continue
                mods = Modules((*combo, language))
                foot = {x.name: memory.encoder(x, b, w, p) for x in combo}
                foot[LANGUAGE] = lmem
                why = memory.why_not(foot)
                if why is None and not aligned(mods, gpn):
                    why = f"a TP group would straddle a node of {gpn} GPUs"
                layout = LayoutSpec(mods, b, gbs, problem.frozen, first=first, last=last)
                if why is None:
                    out.append(Candidate(layout, foot))
                elif unfit is not None:
                    unfit.append(Candidate(layout, foot, why))
    return out


class Bound:
    """A lower bound on a layout's modelled step, per plan: the mean over the drawn steps of the
    busiest module's work over its GPUs, or the language model's last stage's (its share of the
    work over the replicas) plus the pipeline's fill and drain of its lightest cell through the
    stages before it, plus the step's end. No op of a GPU overlaps another, so a GPU is busy for at
    least its share; the last stage cannot start before the first micro-batch has crossed the
    stages before it, nor end before the last one's gradient has crossed them back."""

    def __init__(self, problem):
        draws = problem.draws
        self.draws, self.seconds = draws, problem.seconds
        n, s = draws.steps * draws.gbs, draws.steps
        idx = np.arange(n)
        tok = draws.index.tokens(idx).astype(np.float64)
        encoders = list(problem.model.encoders)
        self.features = {LANGUAGE: (tok, tok * tok, np.ones(n))}  # k: per sample
        for e in encoders:
            col = draws.index.column_for(e, encoders, lambda *_: None)
            self.features[e] = tuple(np.asarray(f(col, idx), dtype=np.float64)
                                     for f in (draws.index.rows, draws.index.sq_rows, draws.index.items))
        self.shape = (s, draws.gbs)
        self.mean_tokens = (tok.sum() / s, (tok * tok).sum() / s)
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
        seq, gbs = self.draws.seq_length, self.draws.gbs
        for m in layout.modules:
            cost = model.of(m.name)
            if m.name == LANGUAGE and padded:
                c = padded_cost(model, seq)
                total, lightest = np.full(self.shape[0], c * gbs), np.full(self.shape[0], c)
            else:
                total, lightest = self._module(m.name, cost)
            mine = total / (m.dp * m.pp)
            if m.name == LANGUAGE and m.pp > 1:
                per = layout.micro_batches * m.dp
                t, q = (gbs * seq, gbs * seq * seq) if padded else self.mean_tokens
                shares = self.seconds.stage_shares(layout, t / per, q / per) or [1.0 / m.pp] * m.pp
                last = shares[-1] * total / m.dp + (1 - shares[-1]) * (layout.mbs // m.dp) * lightest
                mine = np.maximum(max(shares) * total / m.dp, last)
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
