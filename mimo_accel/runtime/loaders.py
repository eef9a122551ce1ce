"""This rank's loader for one split: its share of every global micro-batch, planned or not.

Upstream's loader builders run as they are (``build_pretraining_data_loader`` with the sampler's
dp_size=1, or #5525's ``build_canonical_mimo_data_loader``); inside a loader scope
(:mod:`mimo_accel.runtime.scope`) their loader is replaced by one that reads only this replica's
share, on the canonical grid: in upstream's global order (sharded reads), in the planned order
(reorder, plan mode), or exchanged after decoding (reorder, exchange mode). Before the first
batch every data-loading rank checks that it plans from the same inputs
(:mod:`mimo_accel.runtime.plan_inputs`).
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Callable, Optional

from mimo_accel.runtime import plan_inputs, scope
from mimo_accel.runtime.schedule import micro_batches_per_step
from mimo_accel.runtime.state import Runtime
from mimo_accel.runtime.upstream_call import UpstreamCall, replacing


def _data_ranks(ctx):
    """The data-loading ranks as a gather group (None in a single process)."""
    import torch.distributed as dist

    from mimo_accel.runtime.rank_set import RankSet

    return RankSet(ctx.data_ranks) if dist.is_initialized() and len(ctx.data_ranks) > 1 else None


@dataclasses.dataclass(frozen=True)
class Plan:
    """How one split's loader orders its global micro-batches."""

    planner: object = None  # a sampler.Planner (plan mode), else None
    cost_model: object = None  # the CostModel reorder prices samples with
    window: int = 1  # micro-batches planned together
    step_micro_batches: Optional[int] = None
    check: object = None  # a plan_check.WindowCheck: every window's plan agreed by the data ranks
    models: object = None  # online calibration: first micro-batch -> its calibration.WindowModel


def plan_for(dataset, sampler_settings: list, ctx, split: str, runtime: Runtime, micro_batch_size: int,
             loader=None) -> Plan:
    """The plan of one split's loader (upstream's ``loader``: its workers' prefetch); first checks
    that every data-loading rank plans from the same inputs (collective over those ranks)."""
    from mimo_accel.runtime import sampler

    cfg = runtime.config
    fields = {
        "layout": plan_inputs.digest([sorted(ctx.dp_sizes.items()), ctx.grid, sorted(ctx.stages.items()),
                                      sorted(runtime.frozen)]),
        # the options that act (a reorder that stepped aside for upstream's is off)
        "options": plan_inputs.digest({**{k: v for k, v in dataclasses.asdict(cfg).items() if k != "profile"},
                                       "reorder": runtime.reorders}),
        "dataset": plan_inputs.digest([type(dataset).__name__, len(dataset)]),
        "sampler": plan_inputs.digest(sampler_settings),
    }
    plan, index = Plan(), None
    if runtime.reorders:
        from mimo_accel.datasets.split_index import cost_index_for, index_digest
        from mimo_accel.planner import CostIndexPlanner, cost_model_for

        model = runtime.start_model if runtime.start_model is not None else cost_model_for(cfg.cost_model)
        fields["cost model"] = plan_inputs.digest(dataclasses.asdict(model))
        calibration = runtime.calibration if split == "train" and cfg.reorder_mode == "plan" else None
        if calibration is not None:  # the models it learnt before the checkpoint it resumes from, too
            calibration.restore()
            fields["cost model"] = calibration.digest()
        plan = Plan(cost_model=model)
        if cfg.reorder_mode == "plan":
            index = cost_index_for(dataset, cfg.cost_index, split, group=_data_ranks(ctx), notify=runtime.say_once)
            fields["cost index"] = index_digest(index)
    plan_inputs.check_same_everywhere(fields, ctx.data_ranks, f"{split} loader")
    if index is not None:
        # every module of the layout, each priced by its own column; an encoder the index cannot
        # price is an error naming both sides (raised alike on every rank: the inputs are the same)
        planner = CostIndexPlanner(index, plan.cost_model, ctx.modules, notify=runtime.say_once,
                                   frozen=runtime.frozen)
        window, step_mbs = 1, None
        # Windows span the micro-batches of one training step; evaluation plans each
        # micro-batch on its own (its micro-batches per pass follow other settings).
        if split == "train" and cfg.reorder_window != 1:
            step_mbs = micro_batches_per_step()
            window = cfg.window_for(step_mbs)
            sampler.check_window(window, step_mbs)
        if split == "train" and window == 1:
            _say_if_nothing_moves(ctx, micro_batch_size, runtime)
        models = None
        if calibration is not None:  # each step planned with the model announced for it
            steps = step_mbs or micro_batches_per_step()
            if steps is None:
                runtime.say_once("calibration:no-steps", "mimo_accel online calibration: megatron-core's "
                                 "num-microbatches calculator was not set up when the train loader was built, so "
                                 "its windows cannot be told apart by step: the cost model stays as configured")
            else:
                models = calibration.models(steps, sampler.prefetched(loader))
        plan = Plan(planner, plan.cost_model, window, step_mbs, _plan_check(ctx, f"{split} loader"), models)
    return plan


def _say_if_nothing_moves(ctx, micro_batch_size: int, runtime: Runtime) -> None:
    """Where every module's replica holds one sample of a micro-batch or all of them (upstream's
    validated layout: images dp1, language dp2, two samples), a micro-batch planned alone leaves
    every replica's load as it was."""
    if all(dp in (1, micro_batch_size) for dp in ctx.dp_sizes.values()):
        sizes = ", ".join(f"{m} dp{d}" for m, d in ctx.dp_sizes.items())
        runtime.say_once("reorder:nothing-to-move", (
            f"mimo_accel reorder: with {sizes} and {micro_batch_size}-sample micro-batches, every replica holds one "
            "sample of a micro-batch or all of them, so a plan of one micro-batch cannot change any replica's "
            "load. Set reorder_window=step (MIMO_ACCEL_REORDER_WINDOW=step) to plan each training step's "
            "micro-batches together."))


def _plan_check(ctx, what: str, check=None):
    """The same-plan check over the data-loading ranks (None in a single process): ``check`` is
    :class:`~mimo_accel.runtime.plan_check.WindowCheck` (plan mode) or ``FirstPlanCheck`` (exchange)."""
    import torch.distributed as dist

    from mimo_accel.runtime import plan_check

    if not dist.is_initialized() or len(ctx.data_ranks) < 2:
        return None
    return (check or plan_check.WindowCheck)(ctx.data_ranks, what)


# the sampler settings the data ranks compare (each a declared parameter of the target: targets.py)
_SETTINGS = ("consumed_samples", "dataloader_type", "micro_batch_size", "drop_last", "seed", "data_sharding")
_SOME_UPSTREAMS_LACK = ("seed",)  # declared optional in targets.py


def _settings(a: UpstreamCall, names=_SETTINGS) -> list:
    return [a.get(k) if k in _SOME_UPSTREAMS_LACK else a[k] for k in names]


def wrap_pretraining_loader(original: Callable, runtime: Runtime) -> Callable:
    """``build_pretraining_data_loader``: upstream's loader; inside a loader scope with a MIMO layout
    (the sampler's dp_size=1 after the scope's sampling-info lookup), this rank's share of it."""

    @replacing(original)
    def build_pretraining_data_loader(a: UpstreamCall):
        loader = a.to(original)
        open_scope = scope.current()
        ctx = open_scope.shard_context() if open_scope is not None else None
        if ctx is None or a["data_parallel_size"] != 1:
            return loader
        split = open_scope.split_of(a["dataset"])
        if loader is None or a["dataloader_type"] == "external":
            return loader
        return _share(loader, a, ctx, split, open_scope.dp_group, runtime)

    return build_pretraining_data_loader


def _share(loader, a: UpstreamCall, ctx, split: str, dp_group, runtime: Runtime):
    """This rank's sharded (and, with reorder, planned) loader for one split."""
    from mimo_accel.runtime import sampler

    cfg = runtime.config
    plan = plan_for(a["dataset"], _settings(a), ctx, split, runtime, a["micro_batch_size"], loader)
    if runtime.reorders and cfg.reorder_mode == "exchange":
        from mimo_accel.runtime.exchange import exchange_shard_loader
        from mimo_accel.runtime.plan_check import FirstPlanCheck

        return exchange_shard_loader(loader, ctx, a["micro_batch_size"], dp_group, cost_model=plan.cost_model,
                                     notify=runtime.say_once,
                                     check=_plan_check(ctx, f"{split} loader", FirstPlanCheck))
    return sampler.shard_loader(loader, ctx, a["micro_batch_size"], planner=plan.planner, window=plan.window,
                                step_micro_batches=plan.step_micro_batches, check=plan.check, models=plan.models)


def wrap_canonical_loader(original: Callable, runtime: Runtime) -> Callable:
    """Upstream's scalable reads (#5525 ``build_canonical_mimo_data_loader``): upstream already
    reads this replica's share on the same canonical grid, so sharded reads step aside. What
    mimo_accel adds on top: the batch tag (so the step can check the replica and the profiler can
    count), and with reorder the planned order, taken from upstream's own canonical-group
    samplers over *all* groups — the global micro-batch upstream reads, under ``single`` and
    ``cyclic`` alike — so every module plans the same micro-batch and keeps its own share."""
    canonical = sys.modules[original.__module__]

    @replacing(original)
    def build_canonical_mimo_data_loader(a: UpstreamCall):
        loader = a.to(original)
        open_scope = scope.current()
        ctx = open_scope.shard_context() if open_scope is not None else None
        if ctx is None:
            return loader
        split = open_scope.split_of(a["dataset"])
        if loader is None:
            return loader
        grid = canonical.canonical_grid_size(list(a["module_dp_sizes"]))
        if (a["dp_rank"], a["dp_size"], grid) != (ctx.dp_rank, ctx.dp_size, ctx.grid):
            raise RuntimeError(
                f"mimo_accel: upstream's scalable reads build this loader for replica {a['dp_rank']}/"
                f"{a['dp_size']} on a grid of {grid}, but the MIMO layout puts this rank at {ctx.module} "
                f"replica {ctx.dp_rank}/{ctx.dp_size} on a grid of {ctx.grid}; refusing to mis-pair samples")
        ctx = dataclasses.replace(ctx, sliced_in_step=False)
        return _canonical_share(loader, a, ctx, split, open_scope.dp_group, runtime, canonical)

    return build_canonical_mimo_data_loader


def _canonical_share(loader, a: UpstreamCall, ctx, split: str, dp_group, runtime: Runtime, canonical):
    """On top of upstream's canonical loader (scalable reads): tagged, and with reorder planned."""
    from mimo_accel.runtime import sampler

    cfg = runtime.config
    if runtime.upstream_moves_samples is not None and split == "train":
        # upstream's buffer exchanges this loader's samples after reading: no tag could follow them
        return loader
    if not runtime.reorders:
        return sampler.tagged_loader(loader, ctx, loader.batch_sampler)  # upstream's own shard
    plan = plan_for(a["dataset"], _settings(a, [k for k in _SETTINGS if k != "seed"]), ctx, split, runtime,
                    a["micro_batch_size"], loader)
    if cfg.reorder_mode == "exchange":
        from mimo_accel.runtime.exchange import exchange_shard_loader
        from mimo_accel.runtime.plan_check import FirstPlanCheck

        return exchange_shard_loader(loader, ctx, a["micro_batch_size"], dp_group, cost_model=plan.cost_model,
                                     local_batch_sampler=loader.batch_sampler, notify=runtime.say_once,
                                     check=_plan_check(ctx, f"{split} loader", FirstPlanCheck))
    # upstream's own per-group samplers for every group: the global micro-batch, in canonical order
    everything = canonical.build_canonical_group_batch_sampler(
        dataloader_type=a["dataloader_type"], dataset=a["dataset"], consumed_samples=a["consumed_samples"],
        micro_batch_size=a["micro_batch_size"], grid_size=ctx.grid, groups=list(range(ctx.grid)),
        data_sharding=a["data_sharding"], drop_last=a["drop_last"])
    return sampler.shard_loader(loader, ctx, a["micro_batch_size"], planner=plan.planner, window=plan.window,
                                step_micro_batches=plan.step_micro_batches, global_sampler=everything,
                                start=(a["consumed_samples"], a["micro_batch_size"]), check=plan.check,
                                models=plan.models)
