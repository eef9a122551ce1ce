"""The advisor's answers: :func:`price` (one layout: its step with and without mimo_accel, its
memory, its figures) and :func:`advise` (every layout within a budget, ranked), and the settings
that run one (:func:`settings`).

"Without mimo_accel" is upstream as shipped: the samples as they come and padded language
batches; "with" is mimo_accel's step plan over packed real tokens. The objective (``throughput``)
is the job's samples per second within the budget, layouts within ``tie`` of each other ordered by
tokens/s per active GPU, and a layout using at most half the budget ranked after every one using
more (it leaves most of the budget idle); ``per-gpu`` ranks by tokens/s per active GPU (the
tutorial's metric), ties by throughput.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

from mimo_accel.costs.flops import throughput
from mimo_accel.costs.memory import GIB
from mimo_accel.modules import LANGUAGE
from mimo_accel.tools.layout.pricing import busy_shares, price_steps
from mimo_accel.tools.layout.problem import Problem, build_problem
from mimo_accel.tools.layout.search import (Bound, Candidate, aligned, best_first, divisors, layouts,
                                            rank_offsets)
from mimo_accel.tools.layout.spec import LayoutSpec, parse_layout

__all__ = ["ADVICE_FORMAT", "OBJECTIVES", "Advice", "Figures", "NoLayoutFits", "Row", "advise", "price", "settings"]

ADVICE_FORMAT = "mimo-accel-layout/1"
OBJECTIVES = ("throughput", "per-gpu")
PLANS = {"with": "mimo_accel", "without": "padded"}
TIE = 0.03


class NoLayoutFits(ValueError):
    """No layout of the model fits the budget (the message names the smallest budget that would)."""


@dataclass(frozen=True)
class Figures:
    """One plan's step: its time and what it gets through per second."""

    step_time_s: float
    samples_per_s: float
    tokens_per_s_per_gpu: float
    samples_per_s_per_gpu: float
    mfu: dict[str, Optional[float]]
    busy_share: dict[str, float]
    bound_module: str

    def to_doc(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class Row:
    """A layout: its GPUs, each module's memory per GPU, whether it fits (``why_not``), and its
    figures ``accelerated`` (with mimo_accel) and ``baseline`` (upstream as shipped)."""

    layout: LayoutSpec
    memory_gib_per_gpu: dict[str, float]
    why_not: Optional[str] = None
    accelerated: Optional[Figures] = None
    baseline: Optional[Figures] = None
    rank: dict[str, Optional[int]] = field(default_factory=lambda: {"with": None, "without": None})

    @property
    def spec(self) -> str:
        return self.layout.spec

    @property
    def gpus(self) -> int:
        return self.layout.gpus

    @property
    def fits(self) -> bool:
        return self.why_not is None

    @property
    def step_time_s(self) -> Optional[float]:
        return self.accelerated.step_time_s if self.accelerated else None

    def to_doc(self) -> dict[str, Any]:
        acc = self.accelerated
        return {"spec": self.spec, "gpus": self.gpus,
                "step_time_s": acc.step_time_s if acc else None,
                "tokens_per_s_per_gpu": acc.tokens_per_s_per_gpu if acc else None,
                "samples_per_s_per_gpu": acc.samples_per_s_per_gpu if acc else None,
                "samples_per_s": acc.samples_per_s if acc else None,
                "memory_gib_per_gpu": self.memory_gib_per_gpu,
                "bound_module": acc.bound_module if acc else None,
                "busy_share": acc.busy_share if acc else None,
                "mfu": acc.mfu if acc else None,
                "fits": self.fits, "why_not": self.why_not,
                "without": self.baseline.to_doc() if self.baseline else None,
                "rank": dict(self.rank), "settings": settings(self.layout)}


def settings(layout: LayoutSpec) -> dict[str, Any]:
    """What runs ``layout``: Bridge's ``MegatronMIMOParallelismConfig`` (each module's
    ``ModuleParallelismConfig``: ``src/megatron/bridge/models/megatron_mimo/megatron_mimo_config.py``)
    and the Qwen3.5-VL launcher's ``--component name=tp=N,pp=N,cp=N,dp=N,rank_offset=N`` strings
    (``examples/megatron_mimo/qwen35_vl/finetune_qwen35_vl.py``, ``slurm_sft.sh``), with its batch flags."""
    offsets = rank_offsets(layout.modules)
    order = sorted(layout.modules, key=lambda m: offsets[m.name])
    return {
        "module_parallelisms": {m.name: {"tensor_model_parallel_size": m.tp, "pipeline_model_parallel_size": m.pp,
                                         "context_parallel_size": 1, "data_parallel_size": m.dp,
                                         "rank_offset": offsets[m.name]} for m in order},
        "components": [f"{m.name}=tp={m.tp},pp={m.pp},cp=1,dp={m.dp},rank_offset={offsets[m.name]}" for m in order],
        "launcher": {"--micro-batch-size": layout.mbs, "--global-batch-size": layout.gbs, "world_size": layout.gpus},
    }


def _figures(layout: LayoutSpec, problem: Problem, prices, plan: str) -> Figures:
    step = prices.step_time[plan]
    gpus = layout.gpus
    mfu = {}
    for m in layout.modules:
        mm = problem.model.modules[m.name]
        tokens, sq = prices.work[m.name]
        mfu[m.name] = throughput(samples=None, tokens=tokens, sq_tokens=sq, step_time_s=step, ranks=m.size, shape=mm,
                                 trained=m.name not in layout.frozen, peak_tflops=problem.machine.peak_tflops)["mfu"]
    shares, bound = busy_shares(layout, prices, plan)
    return Figures(step, layout.gbs / step, prices.tokens / step / gpus, layout.gbs / step / gpus, mfu, shares, bound)


def _checked(layout: LayoutSpec, problem: Problem) -> LayoutSpec:
    names, have = set(layout.modules.names), set(problem.model.modules)
    if names != have:
        raise ValueError(f"the layout {layout.spec!r} names modules {sorted(names)}, the model {problem.model.name} has "
                         f"{sorted(have)}; give one NAME=tpT,ppP,dpD for each of the model's modules")
    if layout.gbs != problem.gbs:
        raise ValueError(f"the layout's gbs={layout.gbs} differs from the batch the steps were drawn for "
                         f"(gbs={problem.gbs}); give the same global batch")
    for m in layout.modules:
        mm = problem.model.modules[m.name]
        if not mm.tp_fits(m.tp):
            raise ValueError(f"{m.name}=tp{m.tp}: TP must divide the module's heads ({mm.heads}) and query groups "
                             f"({mm.query_groups}); give a TP that divides both")
        if m.name == LANGUAGE and mm.layers % m.pp:
            raise ValueError(f"{m.name}=pp{m.pp}: PP must divide the language model's {mm.layers} layers")
        if m.name in problem.tp_held and m.tp != problem.tp_held[m.name]:
            raise ValueError(f"{m.name}=tp{m.tp}: on CPU ranks a profile prices its module at the TP it ran "
                             f"(tp{problem.tp_held[m.name]}); give that TP, or --gpu to price a GPU machine")
    frozen = set(problem.frozen)
    if set(layout.frozen) != frozen:
        layout = LayoutSpec(layout.spec, layout.modules, layout.mbs, layout.gbs, tuple(sorted(frozen)),
                            layout.seq_length, layout.preset)
    return layout


def _prices(layout: LayoutSpec, problem: Problem, plan: str, cache: Optional[dict] = None):
    """The layout's steps under ``plan`` (kept for the busy shares), priced once per search."""
    cache = {} if cache is None else cache
    key = (layout.spec, plan)
    if key not in cache:
        cache[key] = price_steps(layout, problem.draws, problem.seconds, (plan,), keep=True, notify=problem.note)
    return cache[key]


def _row(layout: LayoutSpec, problem: Problem, memory=None, cache: Optional[dict] = None) -> Row:
    memory = memory or problem.memory.of_layout(layout)
    with_, without = (_prices(layout, problem, PLANS[side], cache) for side in ("with", "without"))
    gpn = problem.machine.gpus_per_node
    why = problem.memory.why_not(memory) or (None if aligned(layout.modules, gpn) else
                                             f"a TP group would straddle a node of {gpn} GPUs")
    return Row(layout, {m: f.total / GIB for m, f in memory.items()}, why,
               _figures(layout, problem, with_, "mimo_accel"), _figures(layout, problem, without, "padded"))


def price(spec: str | LayoutSpec, source=None, **options) -> Row:
    """One layout priced (module docstring). ``source``: a :class:`Problem`, or what
    :func:`~mimo_accel.tools.layout.problem.build_problem` takes (a model preset, model file or
    profile directory, with ``options``); the layout's own gbs (and seq=) are the data's."""
    layout = spec if isinstance(spec, LayoutSpec) else parse_layout(spec, "spec")
    if not isinstance(source, Problem):
        options.setdefault("gbs", layout.gbs)
        if layout.seq_length:
            options.setdefault("seq_length", layout.seq_length)
        source = build_problem(source if source is not None else "qwen35-vl-27b", **options)
    return _row(_checked(layout, source), source)


@dataclass
class Advice:
    """The ranked layouts (``with_mimo_accel``, ``without``), the recommendation of each, the
    current layout priced (or None), the layouts left out on request (``unfit``)."""

    problem: Problem
    budget: int
    objective: str
    with_mimo_accel: list[Row]
    without: list[Row]
    current: Optional[Row]
    unfit: list[Row]
    searched: dict[str, int]
    elapsed_s: float = 0.0

    @property
    def recommended(self) -> Row:
        return self.with_mimo_accel[0]

    @property
    def recommended_without(self) -> Row:
        return self.without[0]

    def to_doc(self) -> dict[str, Any]:
        p = self.problem
        rows = list({r.spec: r for r in [*self.with_mimo_accel, *self.without, *self.unfit]}.values())
        return {
            "format": ADVICE_FORMAT, "budget": self.budget, "objective": self.objective,
            "model": {"name": p.model.name, "source": p.model.source},
            "machine": {"name": p.machine.name, "peak_tflops": p.machine.peak_tflops,
                        "memory_gib": None if p.machine.memory_gib == float("inf") else p.machine.memory_gib,
                        "gpus_per_node": p.machine.gpus_per_node, "intra_node_gbps": p.machine.intra_node_gbps,
                        "inter_node_gbps": p.machine.inter_node_gbps, "communication": p.machine.communication,
                        "reserve": p.machine.reserve},
            "data": {"source": p.draws.source, "gbs": p.gbs, "seq_length": p.draws.seq_length,
                     "steps": p.draws.steps, "clipped": p.draws.clipped},
            "costs": {"source": p.seconds.describe(), "units": p.seconds.units},
            "rows": [r.to_doc() for r in rows],
            "recommended": self.recommended.spec, "recommended_without": self.recommended_without.spec,
            "current": self.current.to_doc() if self.current else None,
            "searched": dict(self.searched), "notes": list(p.notes), "elapsed_s": self.elapsed_s,
        }


def _smallest_budget(problem: Problem, mbs: Sequence[int], budget: int) -> Optional[int]:
    """The fewest GPUs any layout that fits memory needs (doubling the search's budget up to 4096)."""
    trial = max(budget, 1)
    while trial <= 4096:
        trial *= 2
        found = layouts(problem.model, problem.memory, budget=trial, gbs=problem.gbs, mbs=mbs, frozen=problem.frozen,
                        tp_held=problem.tp_held)
        if found:
            return min(c.layout.gpus for c in found)
    return None


def _ordered(entries: list[tuple[float, float, Candidate]], objective: str, budget: int, tie: float):
    """Candidates best first: by the objective, ``tie``-close ones by the other figure; for
    throughput, those using at most half the budget after the rest."""
    primary = 0 if objective == "throughput" else 1
    rest = sorted(entries, key=lambda e: -e[primary])
    out = []
    while rest:
        idle_last = objective == "throughput" and any(e[2].layout.gpus * 2 > budget for e in rest)
        pool = [e for e in rest if not idle_last or e[2].layout.gpus * 2 > budget]
        lead = pool[0][primary]
        close = [e for e in pool if e[primary] >= (1 - tie) * lead]
        pick = max(close, key=lambda e: (e[1 - primary], e[primary]))
        out.append(pick)
        rest.remove(pick)
    return out


def advise(source=None, budget: Optional[int] = None, *, mbs: Optional[Sequence[int]] = None,
           objective: str = "throughput", top: int = 5, tie: float = TIE, current: Optional[str | LayoutSpec] = None,
           include_unfit: bool = False, **options) -> Advice:
    """Every non-colocated layout of the model within ``budget`` GPUs that fits, ranked with and
    without mimo_accel (module docstring); ``top`` of each priced in full. ``source`` and
    ``options`` as :func:`price` takes them; ``mbs``: the global micro-batch sizes to try (default
    every divisor of the global batch); ``current``: a layout priced beside them."""
    t0 = time.perf_counter()
    if objective not in OBJECTIVES:
        raise ValueError(f"--objective {objective}: give one of {', '.join(OBJECTIVES)}")
    cur = current if isinstance(current, LayoutSpec) or current is None else parse_layout(current, "--current")
    if not isinstance(source, Problem):
        if cur is not None:
            options.setdefault("gbs", cur.gbs)
            if cur.seq_length:
                options.setdefault("seq_length", cur.seq_length)
        source = build_problem(source if source is not None else "qwen35-vl-27b", **options)
    problem = source
    if cur is None and problem.profiled is not None:
        cur = problem.profiled  # the run's own layout, priced beside the others
    cur = _checked(cur, problem) if cur is not None else None
    budget = budget or problem.gpus
    if not budget:
        raise ValueError("give --gpus N (the GPU budget): the model says nothing of the machine")
    sizes = sorted(set(mbs)) if mbs else divisors(problem.gbs)
    bad = [b for b in sizes if problem.gbs % b]
    if bad:
        raise ValueError(f"--mbs {bad[0]}: the global batch {problem.gbs} is not a whole number of micro-batches of "
                         f"{bad[0]}; give divisors of it ({', '.join(map(str, divisors(problem.gbs)))})")
    unfit: Optional[list] = [] if include_unfit else None
    found = layouts(problem.model, problem.memory, budget=budget, gbs=problem.gbs, mbs=sizes, tp_held=problem.tp_held,
                    frozen=problem.frozen, unfit=unfit)
    if not found:
        least = _smallest_budget(problem, sizes, budget)
        where = (f"the smallest budget a layout fits is {least} GPUs: give --gpus {least}" if least else
                 "none fits at any size up to 4096 GPUs: give a GPU with more memory, a smaller --mbs or --seq-length")
        each = "" if problem.machine.memory_gib == float("inf") else f" ({problem.machine.memory_gib:g} GiB each)"
        raise NoLayoutFits(f"no layout of {problem.model.name} fits {budget} GPUs of {problem.machine.name}{each}; "
                           f"{where}")
    bound = Bound(problem.draws, problem.seconds, problem.model.modules)
    cache: dict = {}

    def step(c: Candidate, plan: str) -> float:
        return _prices(c.layout, problem, plan, cache).step_time[plan]

    def value(t: float, c: Candidate) -> float:
        return problem.gbs / t if objective == "throughput" else 1.0 / (t * c.layout.gpus)

    group = (lambda c: 0 if c.layout.gpus * 2 > budget else 1) if objective == "throughput" else (lambda c: 0)
    ranked = {}
    for side, plan in PLANS.items():
        priced = best_first(found, lambda c: value(bound.of(c.layout, plan == "padded"), c),
                            lambda c: value(step(c, plan), c), top=top, tie=tie, group=group)
        entries = [(problem.gbs / step(c, plan), 1.0 / (step(c, plan) * c.layout.gpus), c) for _, c in priced]
        ranked[side] = [e[2] for e in _ordered(entries, objective, budget, tie)][:top]
    rows: dict[str, Row] = {}
    for side, cands in ranked.items():
        for i, c in enumerate(cands):
            if c.layout.spec not in rows:
                rows[c.layout.spec] = _row(c.layout, problem, c.memory, cache)
            rows[c.layout.spec].rank[side] = i + 1
    current_row = _row(cur, problem, cache=cache) if cur is not None else None
    if current_row is not None and current_row.gpus > budget:
        over = f"uses {current_row.gpus} GPUs, over the budget of {budget}"
        current_row.why_not = f"{current_row.why_not}; {over}" if current_row.why_not else over
    unfit_rows = [Row(c.layout, {m: f.total / GIB for m, f in c.memory.items()}, c.why_not)
                  for c in sorted(unfit or [], key=lambda c: -c.layout.gpus)]
    return Advice(problem, budget, objective, [rows[c.layout.spec] for c in ranked["with"]],
                  [rows[c.layout.spec] for c in ranked["without"]], current_row, unfit_rows,
                  {"layouts": len(found), "priced": len({s for s, _ in cache})}, time.perf_counter() - t0)
