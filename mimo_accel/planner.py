"""Plan-before-read reordering: the canonical-group order of a global micro-batch from costs every
rank computes without decoding a sample (a per-sample cost index), the same on every rank of every
module, so no sample byte moves between ranks. Pure: numpy only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Optional, Sequence

import numpy as np

from mimo_accel.balance import balance_modules, module_loads, module_spreads
from mimo_accel.balance.step_schedule import plan_step, step_time
from mimo_accel.costs import CostIndex, CostModel
from mimo_accel.modules import Modules
from mimo_accel.nvtx import ranged


class CostIndexPlanner:
    """``planner(global_indices, micro_batches) -> (indices in canonical-group order, prediction)``.

    Prices every module of the layout (each encoder by its own column of the cost index, the language
    model by its real tokens: :meth:`CostIndex.module_costs`) and plans them all at once on the
    canonical grid (:func:`plan_costs`), in any layout. An encoder the index cannot price is an error
    when the planner is built (:class:`~mimo_accel.costs.index.IndexModulesError`), never another
    encoder's plan applied to its replicas."""

    def __init__(self, index: CostIndex, model: CostModel, modules: Modules,
                 notify: Optional[Callable[[str, str], object]] = None, frozen: Sequence[str] = ()):
        if not isinstance(modules, Modules):
            raise TypeError(f"CostIndexPlanner needs the layout's mimo_accel.modules.Modules, got "
                            f"{type(modules).__name__}")
        self.index = index
        self.model = model
        self.modules = modules
        self.notify = notify  # say_once(key, message): what the plan could not act on, said once
        self.dps = modules.dp_sizes
        # the pipeline a window of several micro-batches is planned for (plan_step): each module's
        # PP stages, and the encoders that run forwards only
        self.stages = {m.name: m.pp for m in modules}
        self.frozen = tuple(frozen)
        encoders = [m.name for m in modules.encoders]
        # which column prices each encoder: decided (or refused) now, not at the first batch
        self.columns = {name: index.column_for(name, encoders, notify) for name in encoders}

    @property
    def grid(self) -> int:
        return self.modules.grid

    def costs(self, indices: Sequence[int], model: Optional[CostModel] = None) -> dict[str, np.ndarray]:
        """Module name -> per-sample costs of ``indices`` (priced by ``model``, default the planner's)."""
        costs = self.index.module_costs(np.asarray(indices, dtype=np.int64), model or self.model, self.modules,
                                        notify=self.notify)
        for c in costs.values():
            if not np.all(np.isfinite(c)) or np.any(c < 0):
                raise ValueError("mimo_accel reorder: the cost index produced NaN/negative/inf costs; "
                                 "rebuild it with `mimo-accel index`")
        return costs

    @ranged("mimo_accel/plan")
    def __call__(self, indices: Sequence[int], micro_batches: int = 1,
                 model: Optional[CostModel] = None) -> tuple[list[int], "Prediction"]:
        """Plan ``micro_batches`` consecutive global micro-batches together (a window): the
        result's j-th block of len/micro_batches samples is micro-batch j, cut into G groups.
        Returns the indices in that order and what the plan predicts for them (each module's
        spread and its load per micro-batch and replica: :class:`Prediction`). ``model``: the cost model of this
        window (online calibration), default the planner's."""
        costs = self.costs(indices, model)
        order, spreads = plan_costs(costs, self.dps, micro_batches, self.notify, "the cost index",
                                    stages=self.stages, frozen=self.frozen)
        planned = np.asarray(indices, dtype=np.int64)[np.asarray(order)].tolist()
        step = None
        if micro_batches > 1:  # what the plan expects the step to take, beside what the profiler replays
            try:
                step = step_time(costs, self.dps, order, micro_batches, stages=self.stages, frozen=self.frozen)
            except ValueError:  # a window the step model cannot price: planned replica by replica (said)
                step = None
        return planned, Prediction(spreads, module_loads(costs, self.dps, order, micro_batches), step)


@dataclass(frozen=True, eq=False)  # compared field by field where needed: its loads are numpy arrays
class Prediction:
    """What a plan predicts for the micro-batches it orders: ``spreads``, module name -> its replica
    spread (max/mean); ``loads``, module name -> its load per micro-batch and replica
    (``[micro_batches, dp]``, in the cost model's units); ``step_time``: the step the pipeline
    model gives the window's order (:func:`~mimo_accel.balance.step_schedule.step_time`, the cost
    model's units), where the window is a step of several micro-batches."""

    spreads: Mapping[str, float]
    loads: Mapping[str, np.ndarray]
    step_time: Optional[float] = None


def plan_costs(costs: dict[str, np.ndarray], dps: dict[str, int], micro_batches: int = 1,
               notify: Optional[Callable[[str, str], object]] = None,
               source: str = "the costs", *, stages: Optional[dict[str, int]] = None,
               frozen: Sequence[str] = ()) -> tuple[list[int], dict[str, float]]:
    """The joint plan of per-module costs (positions in canonical-group order) and each module's
    predicted replica spread.

    One micro-batch: :func:`~mimo_accel.balance.balance_modules` (every module's replicas even).
    A window of several: :func:`~mimo_accel.balance.plan_step`, the shortest modelled step of the
    pipeline that runs them (``stages``: each module's PP stages; ``frozen``: encoders that run
    forwards only); where the step model cannot be evaluated on these costs (a module with no time
    in the window), ``balance_modules``' plan, said once. The contiguous split where every sample
    costs the same for every module (nothing to balance; said once)."""
    n = len(next(iter(costs.values()))) if costs else 0
    if n and all(np.all(c == c[0]) for c in costs.values()):
        if notify is not None:
            notify("reorder:equal-costs", "mimo_accel reorder: every sample of a global micro-batch has the same "
                   f"cost for every module ({source} sees no size differences), so there is nothing to balance: "
                   "keeping the contiguous split where that happens")
        order = list(range(n))
    elif micro_batches > 1:
        try:
            order = plan_step(costs, dps, micro_batches, stages=stages, frozen=frozen)
        except ValueError as exc:
            if notify is not None:
                notify("reorder:no-step-model", f"mimo_accel reorder: the step model cannot price this window ({exc}); "
                       "such windows are planned replica by replica (every module's replicas even) instead")
            order = balance_modules(costs, dps, micro_batches)
    else:
        order = balance_modules(costs, dps, micro_batches)
    return order, module_spreads(costs, dps, order, micro_batches)


def cost_model_for(path: Optional[str]) -> CostModel:
    return CostModel.from_file(path) if path is not None else CostModel()
