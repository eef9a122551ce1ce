"""The advisor's answers: :func:`price` (one layout: its step under each plan on every draw, its
memory, its figures) and :func:`advise` (every layout within a budget, ranked), and the settings
that run one (:func:`settings`).

The plans (:data:`~mimo_accel.tools.layout.pricing.PLANS`): ``mimo_accel`` (its step plan over
packed real tokens), ``padded`` (upstream as shipped) and ``packed`` (upstream with its own
in-batch packing, where the Bridge priced has it). The objective (:class:`Objective`) ranks by the
job's samples per second within the budget, layouts within ``tie`` of each other ordered by
tokens/s per active GPU, a layout using at most half the budget after every one using more (it
leaves most of the budget idle); or by tokens/s per active GPU (the tutorial's metric), ties by
throughput. A change from the current layout is recommended only beyond what the model cannot
know (:mod:`~mimo_accel.tools.layout.change`); otherwise the answer is to keep it. Beside a
recommended uneven PP split, the best even split (what upstream's launcher runs with no line added).
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np

from mimo_accel.costs.flops import throughput
from mimo_accel.modules import LANGUAGE
from mimo_accel.tools.layout.change import TIE, Change, compare
from mimo_accel.tools.layout.memory import GIB
from mimo_accel.tools.layout.pricing import busy_shares, price_steps
from mimo_accel.tools.layout.problem import Problem
from mimo_accel.tools.layout.search import Bound, Candidate, aligned, best_first, divisors, layouts, rank_offsets
from mimo_accel.tools.layout.spec import LayoutSpec, stage_layers

__all__ = ["ADVICE_FORMAT", "Advice", "Figures", "NoLayoutFits", "Objective", "Row", "Search", "advise", "price",
           "settings"]

ADVICE_FORMAT = "mimo-accel-layout/3"
MAX_BUDGET = 4096
#: where upstream's Qwen3.5-VL launcher builds the language model's config, and the line the
#: settings it has no flag for go beside (``_build_mimo_provider``)
LAUNCHER = "examples/megatron_mimo/qwen35_vl/finetune_qwen35_vl.py"
BESIDE = "standard_provider.seq_length = args.seq_length"


class Objective(str, enum.Enum):
    """What a layout is ranked by."""

    THROUGHPUT = "throughput"  # the job's samples/s, ties by tokens/s per GPU
    PER_GPU = "per-gpu"  # tokens/s per active GPU, ties by samples/s

    def score(self, step_s, gpus: int, gbs: int):
        """Higher is better: samples/s or (in proportion to) tokens/s per GPU, of a step (or steps)."""
        return gbs / np.asarray(step_s) if self is Objective.THROUGHPUT else 1.0 / (np.asarray(step_s) * gpus)


class NoLayoutFits(ValueError):
    """No layout of the model fits the budget (the message names the smallest budget that would)."""


@dataclass(frozen=True)
class Figures:
    """One plan's step: its mean time, each draw's, what it gets through per second, and what it is
    made of (``parts``, seconds, summing to the mean: :data:`~mimo_accel.tools.layout.pricing.PARTS`);
    ``mfu_measured`` False where the MFU restates an assumed efficiency (FLOPs), not a measured one."""

    step_time_s: float
    step_time_s_draws: list[float]
    samples_per_s: float
    tokens_per_s_per_gpu: float
    samples_per_s_per_gpu: float
    mfu: dict[str, Optional[float]]
    busy_share: dict[str, float]
    bound_module: Optional[str]
    parts: dict[str, float] = field(default_factory=dict)
    mfu_measured: bool = False

    def to_doc(self) -> dict[str, Any]:
        doc = dict(self.__dict__)
        doc["step_parts"] = doc.pop("parts")
        return doc


@dataclass
class Row:
    """A layout: its GPUs, each module's memory per GPU, whether it fits (``why_not``), and its
    figures under each plan priced (``figures[plan]``)."""

    layout: LayoutSpec
    memory_gib_per_gpu: dict[str, float]
    why_not: Optional[str] = None
    figures: dict[str, Figures] = field(default_factory=dict)
    rank: dict[str, Optional[int]] = field(default_factory=dict)
    change: Optional[Change] = None  # against the current layout, where one is given

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
    def accelerated(self) -> Optional[Figures]:
        return self.figures.get("mimo_accel")

    @property
    def step_time_s(self) -> Optional[float]:
        return self.accelerated.step_time_s if self.accelerated else None

    def to_doc(self) -> dict[str, Any]:
        acc, f = self.accelerated, self.figures
        packed = f.get("packed")
        return {"spec": self.spec, "gpus": self.gpus, **(acc.to_doc() if acc else dict.fromkeys(
                    ("step_time_s", "step_time_s_draws", "tokens_per_s_per_gpu", "samples_per_s_per_gpu",
                     "samples_per_s", "bound_module", "busy_share", "mfu", "step_parts", "mfu_measured"))),
                "memory_gib_per_gpu": self.memory_gib_per_gpu, "fits": self.fits, "why_not": self.why_not,
                "without": f["padded"].to_doc() if "padded" in f else None,
                "upstream_packed": {"step_time_s": packed.step_time_s, "tokens_per_s_per_gpu":
                                    packed.tokens_per_s_per_gpu} if packed else None,
                "pipeline_split": self.layout.split, "rank": dict(self.rank), "settings": settings(self.layout),
                "against_current": self.change.to_doc() if self.change else None}


def settings(layout: LayoutSpec) -> dict[str, Any]:
    """What runs ``layout``: Bridge's ``MegatronMIMOParallelismConfig`` (each module's
    ``ModuleParallelismConfig``: ``src/megatron/bridge/models/megatron_mimo/megatron_mimo_config.py``),
    the Qwen3.5-VL launcher's ``--component name=tp=N,pp=N,cp=N,dp=N,rank_offset=N`` strings
    (``examples/megatron_mimo/qwen35_vl/finetune_qwen35_vl.py``, ``slurm_sft.sh``) with its batch
    flags, and the language model's uneven split (megatron-core's ``TransformerConfig`` fields),
    which the launcher has no flag for: ``launcher_lines``, the Python lines to add in its
    ``_build_mimo_provider`` beside :data:`BESIDE` (the standard provider is the language model's
    ``TransformerConfig``: Bridge's ``Qwen35VLModelProvider``, which megatron-core's
    ``get_num_layers_to_build`` reads at build time); ``runs_as_is``: whether it needs none."""
    offsets = rank_offsets(layout.modules)
    order = sorted(layout.modules, key=lambda m: offsets[m.name])
    return {
        "module_parallelisms": {m.name: {"tensor_model_parallel_size": m.tp, "pipeline_model_parallel_size": m.pp,
                                         "context_parallel_size": 1, "data_parallel_size": m.dp,
                                         "rank_offset": offsets[m.name]} for m in order},
        "components": [f"{m.name}=tp={m.tp},pp={m.pp},cp=1,dp={m.dp},rank_offset={offsets[m.name]}" for m in order],
        "launcher": {"--micro-batch-size": layout.mbs, "--global-batch-size": layout.gbs, "world_size": layout.gpus},
        "language_config": layout.split or {},
        "launcher_lines": [f"standard_provider.{k} = {v}" for k, v in (layout.split or {}).items()],
        "runs_as_is": layout.split is None,
    }


def _figures(layout: LayoutSpec, problem: Problem, prices, plan: str) -> Figures:
    step, gpus = prices.step_time[plan], layout.gpus
    mfu = {}
    for m in layout.modules:
        tokens, sq = prices.work[m.name]
        mfu[m.name] = throughput(samples=None, tokens=tokens, sq_tokens=sq, step_time_s=step, ranks=m.size,
                                 shape=problem.model.modules[m.name], trained=m.name not in layout.frozen,
                                 peak_tflops=problem.machine.peak_tflops)["mfu"]
    shares, bound, parts = busy_shares(layout, prices, plan, problem.seconds.comm_parts(layout))
    return Figures(step, prices.draws[plan], layout.gbs / step, prices.tokens / step / gpus, layout.gbs / step / gpus,
                   mfu, shares, bound, parts, problem.seconds.measured)


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
        if m.name in problem.tp_held and m.tp != problem.tp_held[m.name]:
            raise ValueError(f"{m.name}=tp{m.tp}: on CPU ranks a profile prices its module at the TP it ran "
                             f"(tp{problem.tp_held[m.name]}); give that TP, or --gpu to price a GPU machine")
    lang = layout.language
    layers = problem.model.modules[LANGUAGE].layers
    if layout.first is None and layout.last is None and layers % lang.pp:
        raise ValueError(f"{LANGUAGE}=pp{lang.pp}: {layers} layers do not split evenly over {lang.pp} stages; give "
                         "a PP that divides them, or first=N / last=N (the first / last stage's layers)")
    stage_layers(layers, lang.pp, layout.first, layout.last)  # refused, naming the fix, where they do not add up
    return LayoutSpec(layout.modules, layout.mbs, layout.gbs, problem.frozen, layout.seq_length, layout.first,
                      layout.last, layout.preset)


def _plans(problem: Problem) -> tuple[str, ...]:
    return ("mimo_accel", "padded", "packed") if problem.upstream_packing else ("mimo_accel", "padded")


def _row(layout: LayoutSpec, problem: Problem, memory=None, cache: Optional[dict] = None) -> Row:
    memory = memory or problem.memory.of_layout(layout)
    cache = {} if cache is None else cache
    gpn = problem.machine.gpus_per_node
    why = problem.memory.why_not(memory) or (None if aligned(layout.modules, gpn) else
                                             f"a TP group would straddle a node of {gpn} GPUs")
    figures = {p: _figures(layout, problem, _prices(layout, problem, p, cache), p) for p in _plans(problem)}
    return Row(layout, {m: f.total / GIB for m, f in memory.items()}, why, figures)


def _prices(layout: LayoutSpec, problem: Problem, plan: str, cache: dict):
    """The layout's steps under ``plan`` (kept for the busy shares), priced once per search."""
    key = (layout.spec, plan)
    if key not in cache:
        cache[key] = price_steps(layout, problem.draws, problem.seconds, (plan,), keep=True, notify=problem.note)
    return cache[key]


def price(layout: LayoutSpec, problem: Problem) -> Row:
    """One layout priced (module docstring); its gbs must be the problem's."""
    return _row(_checked(layout, problem), problem)


@dataclass(frozen=True)
class Search:
    """What a search asks: the GPU budget (default: the profiled run's), the global micro-batch
    sizes to try (default every divisor of the global batch), the objective, the rows shown of each
    plan, the current layout (priced beside them; default the profiled run's), and whether the
    layouts that do not fit are listed."""

    budget: Optional[int] = None
    mbs: Optional[tuple[int, ...]] = None
    objective: Objective = Objective.THROUGHPUT
    top: int = 5
    current: Optional[LayoutSpec] = None
    include_unfit: bool = False
    tie: float = TIE


@dataclass
class Advice:
    """The ranked layouts of each plan (``ranked[plan]``), the current layout priced (or None),
    the recommendation (``recommended``: the current one where the best found is no change worth
    making, ``keep_current``; the best found against the current: ``best.change``), the best even
    PP split beside an uneven pick (``even``: it runs with the launcher as it is), the layouts
    left out on request (``unfit``)."""

    problem: Problem
    search: Search
    budget: int
    ranked: dict[str, list[Row]]
    current: Optional[Row]
    recommended: Row
    keep_current: bool
    margin: Optional[str]
    unfit: list[Row]
    searched: dict[str, int]
    elapsed_s: float = 0.0
    even: Optional[Row] = None

    @property
    def best(self) -> Row:
        return self.ranked["mimo_accel"][0]

    def gain(self, plan: str) -> Optional[float]:
        """The recommendation's samples/s over the best layout's under ``plan`` (upstream's)."""
        other = self.ranked.get(plan)
        return (other[0].figures[plan].step_time_s / self.recommended.step_time_s) if other else None

    def to_doc(self) -> dict[str, Any]:
        p = self.problem
        rows = list({r.spec: r for rs in (*self.ranked.values(), [self.even] if self.even else [], self.unfit)
                     for r in rs}.values())
        m = p.machine
        return {
            "format": ADVICE_FORMAT, "budget": self.budget, "objective": self.search.objective.value,
            "model": {"name": p.model.name, "source": p.model.source},
            "machine": {"name": m.name, "peak_tflops": m.peak_tflops,
                        "memory_gib": None if m.memory_gib == float("inf") else m.memory_gib,
                        "gpus_per_node": m.gpus_per_node, "intra_node_gbps": m.intra_node_gbps,
                        "inter_node_gbps": m.inter_node_gbps, "memory_gbps": m.memory_gbps,
                        "communication": m.communication, "reserve": m.reserve},
            "assumptions": p.settings.to_doc(),
            "data": {"source": p.draws.source, "gbs": p.gbs, "seq_length": p.draws.seq_length,
                     "steps": p.draws.steps, "clipped": p.draws.clipped},
            "costs": {"source": p.seconds.describe(), "encoder_measured": p.profiled is not None,
                      "measured": p.seconds.measured,
                      "efficiency_assumed": None if p.seconds.measured else dict(p.seconds.efficiency)},
            "rows": [r.to_doc() for r in rows],
            "recommended": self.recommended.spec, "keep_current": self.keep_current, "margin": self.margin,
            "change": self.best.change.to_doc() if self.best.change else None,
            "even_alternative": self.even.spec if self.even else None,
            "recommended_without": self.ranked["padded"][0].spec,
            "gain": {"over_padded": self.gain("padded"), "over_upstream_packed": self.gain("packed")},
            "current": self.current.to_doc() if self.current else None,
            "searched": dict(self.searched), "notes": list(p.notes), "elapsed_s": self.elapsed_s,
        }


def _samples_a_micro_batch(problem: Problem, layout: LayoutSpec) -> Optional[str]:
    """Where a profile priced the language model's cost of a micro-batch whatever its tokens and
    ``layout``'s micro-batches hold another count of samples a replica than the profiled run's: that
    the cost was measured at the run's count (it has no term a sample, so it cannot follow)."""
    run = problem.profiled
    if run is None or LANGUAGE not in problem.seconds.micro_batch_overheads(run):
        return None
    then, now = run.mbs / run.language.dp, layout.mbs / layout.language.dp
    if then == now:
        return None
    return (f"{LANGUAGE}: what a micro-batch costs whatever its tokens was measured on micro-batches of {then:g} "
            f"sample{'s' if then != 1 else ''} a replica, and {layout.spec} holds {now:g}: what a sample adds to it "
            "is not in the profile, so that part of its step is priced at the run's count (on CPU ranks, 4 samples "
            "against 1 priced the step 18 % short: docs/measurements.md)")


def _smallest_budget(problem: Problem, mbs, budget: int) -> Optional[int]:
    """The fewest GPUs any layout that fits memory needs (doubling the search's budget up to 4096)."""
    trial = max(budget, 1)
    while trial < MAX_BUDGET:
        trial *= 2
        found = layouts(problem, budget=trial, mbs=mbs)
        if found:
            return min(c.layout.gpus for c in found)
    return None


def _ordered(entries: list[tuple[float, float, Candidate]], objective: Objective, budget: int, tie: float):
    """Candidates best first: by the objective, ``tie``-close ones by the other figure; for
    throughput, those using at most half the budget after the rest."""
    primary = 0 if objective is Objective.THROUGHPUT else 1
    rest = sorted(entries, key=lambda e: -e[primary])
    out = []
    while rest:
        idle_last = primary == 0 and any(e[2].layout.gpus * 2 > budget for e in rest)
        pool = [e for e in rest if not idle_last or e[2].layout.gpus * 2 > budget]
        lead = pool[0][primary]
        close = [e for e in pool if e[primary] >= (1 - tie) * lead]
        pick = max(close, key=lambda e: (e[1 - primary], e[primary]))
        out.append(pick)
        rest.remove(pick)
    return out


def _keep(current: Optional[Row], best: Row, objective: Objective, measured: bool) -> tuple[bool, Optional[str]]:
    """Whether to keep ``current`` rather than move to ``best`` (it is ``best``, or ``best`` is no
    change worth making: :mod:`~mimo_accel.tools.layout.change`), and the margin, said; each row
    priced beside ``current`` gets its :class:`~mimo_accel.tools.layout.change.Change` against it."""
    if current is None or not current.fits:
        return False, None
    if best.spec == current.spec:
        return True, "the current layout is the best found"
    best.change = compare(current, best, objective is Objective.PER_GPU, measured)
    return not best.change.worth, f"the best found is {best.change.said()}"


def advise(problem: Problem, search: Search = Search()) -> Advice:
    """Every non-colocated layout of ``problem``'s model within the budget that fits, ranked under
    each plan (module docstring); ``top`` of each priced in full; the recommendation."""
    t0 = time.perf_counter()
    cur = search.current if search.current is not None else problem.profiled
    cur = _checked(cur, problem) if cur is not None else None
    budget = search.budget or problem.gpus
    if not budget:
        raise ValueError("give --gpus N (the GPU budget): the model says nothing of the machine")
    sizes = sorted(set(search.mbs)) if search.mbs else divisors(problem.gbs)
    bad = [b for b in sizes if problem.gbs % b]
    if bad:
        raise ValueError(f"--mbs {bad[0]}: the global batch {problem.gbs} is not a whole number of micro-batches of "
                         f"{bad[0]}; give divisors of it ({', '.join(map(str, divisors(problem.gbs)))})")
    unfit: Optional[list] = [] if search.include_unfit else None
    found = layouts(problem, budget=budget, mbs=sizes, unfit=unfit)
    if not found:
        least = _smallest_budget(problem, sizes, budget)
        where = (f"the smallest budget a layout fits is {least} GPUs: give --gpus {least}" if least else
                 f"none fits at any size up to {MAX_BUDGET} GPUs: give a GPU with more memory, a smaller --mbs or "
                 "--seq-length, or other settings (sequence parallelism, recompute)")
        each = "" if problem.machine.memory_gib == float("inf") else f" ({problem.machine.memory_gib:g} GiB each)"
        tried: list = []
        layouts(problem, budget=budget, mbs=sizes, unfit=tried)
        near = min(tried, key=lambda c: max(f.total for f in c.memory.values()), default=None)
        why = f" (the nearest, {near.layout.spec}: {near.why_not})" if near is not None else ""
        raise NoLayoutFits(f"no layout of {problem.model.name} fits {budget} GPUs of {problem.machine.name}{each}"
                           f"{why}; {where}")
    bound, cache, objective = Bound(problem), {}, search.objective
    gbs = problem.gbs

    def step(c: Candidate, plan: str) -> float:
        return _prices(c.layout, problem, plan, cache).step_time[plan]

    group = (lambda c: 0 if c.layout.gpus * 2 > budget else 1) if objective is Objective.THROUGHPUT else (lambda c: 0)
    ranked: dict[str, list[Candidate]] = {}
    for plan in _plans(problem):
        priced = best_first(found, lambda c: float(objective.score(bound.of(c.layout, plan == "padded"), c.layout.gpus,
                                                                   gbs)),
                            lambda c: float(objective.score(step(c, plan), c.layout.gpus, gbs)), top=search.top,
                            tie=search.tie, group=group)
        entries = [(gbs / step(c, plan), 1.0 / (step(c, plan) * c.layout.gpus), c) for _, c in priced]
        ranked[plan] = [e[2] for e in _ordered(entries, objective, budget, search.tie)][:search.top]
    rows: dict[str, Row] = {}
    for plan, cands in ranked.items():
        for i, c in enumerate(cands):
            if c.layout.spec not in rows:
                rows[c.layout.spec] = _row(c.layout, problem, c.memory, cache)
            rows[c.layout.spec].rank[plan] = i + 1
    current = _row(cur, problem, cache=cache) if cur is not None else None
    if current is not None and current.gpus > budget:
        over = f"uses {current.gpus} GPUs, over the budget of {budget}"
        current.why_not = f"{current.why_not}; {over}" if current.why_not else over
    ranked_rows = {p: [rows[c.layout.spec] for c in cs] for p, cs in ranked.items()}
    measured = problem.seconds.measured
    keep, margin = _keep(current, ranked_rows["mimo_accel"][0], objective, measured)
    recommended = current if keep else ranked_rows["mimo_accel"][0]
    note = _samples_a_micro_batch(problem, recommended.layout)
    if note is not None and note not in problem.notes:
        problem.notes.append(note)
    even = None
    if recommended.layout.split is not None and not keep:
        # what runs with upstream's launcher as it is: the best of the even splits, ranked the same way
        evens = [c for c in found if c.layout.split is None]
        priced = best_first(evens, lambda c: float(objective.score(bound.of(c.layout, False), c.layout.gpus, gbs)),
                            lambda c: float(objective.score(step(c, "mimo_accel"), c.layout.gpus, gbs)),
                            top=1, tie=search.tie, group=group)
        entries = [(gbs / step(c, "mimo_accel"), 1.0 / (step(c, "mimo_accel") * c.layout.gpus), c) for _, c in priced]
        pick = _ordered(entries, objective, budget, search.tie)[0][2] if entries else None
        if pick is not None:
            even = rows.get(pick.layout.spec) or _row(pick.layout, problem, pick.memory, cache)
    for row in [*rows.values(), *([even] if even else [])]:
        if current is not None and current.fits and row.spec != current.spec and row.change is None:
            row.change = compare(current, row, objective is Objective.PER_GPU, measured)
    unfit_rows = [Row(c.layout, {m: f.total / GIB for m, f in c.memory.items()}, c.why_not)
                  for c in sorted(unfit or [], key=lambda c: -c.layout.gpus)]
    return Advice(problem, search, budget, ranked_rows, current, recommended, keep, margin, unfit_rows,
                  {"layouts": len(found), "priced": len({s for s, _ in cache})}, time.perf_counter() - t0, even)
