"""How one split's loader orders its global micro-batches (sharded reads in
upstream's order, the planner of plan mode, the window, the same-plan check, the models online
calibration announces), after every data-loading rank has checked that it plans from the same
inputs (:mod:`mimo_accel.runtime.reading.plan_inputs`). Asked for by the loader patches
(:mod:`mimo_accel.runtime.patches.loaders`)."""

from __future__ import annotations

import dataclasses

from mimo_accel.config import PATH_OPTIONS, resolve_window
from mimo_accel.runtime.reading import plan_inputs
from mimo_accel.runtime.reading.schedule import micro_batches_per_step
from mimo_accel.runtime.state import Runtime


@dataclasses.dataclass(frozen=True)
class LoaderOrder:
    """How one split's loader orders its global micro-batches."""

    planner: object = None  # a sampler.Planner (plan mode), else None
    cost_model: object = None  # the CostModel reorder prices samples with
    window: int = 1  # micro-batches planned together
    check: object = None  # a plan_check.WindowCheck: every window's plan agreed by the data ranks
    models: object = None  # online calibration: first micro-batch -> its calibration.WindowModel


def loader_order_for(dataset, sampler_settings: list, ctx, split: str, runtime: Runtime, micro_batch_size: int,
                     loader=None) -> LoaderOrder:
    """How one split's loader orders its micro-batches (upstream's ``loader``: its workers' prefetch); first checks
    that every data-loading rank plans from the same inputs (collective over those ranks)."""
    from mimo_accel.runtime.reading import sampler

    cfg = runtime.config
    fields = {
        "layout": plan_inputs.digest([sorted(ctx.dp_sizes.items()), ctx.grid, sorted(ctx.stages.items()),
                                      sorted(runtime.frozen)]),
        # the options that act (a reorder that stepped aside for upstream's is off); not where the files
        # are (each rank's own absolute path): what they hold is compared as the cost model and index
        "options": plan_inputs.digest({**{k: v for k, v in dataclasses.asdict(cfg).items()
                                          if k not in PATH_OPTIONS}, "reorder": runtime.reorders}),
        "dataset": plan_inputs.digest([type(dataset).__name__, len(dataset)]),
        "sampler": plan_inputs.digest(sampler_settings),
    }
    order, index = LoaderOrder(), None
    if runtime.reorders:
        from mimo_accel.datasets.split_index import cost_index_for, index_digest
        from mimo_accel.planner import CostIndexPlanner, cost_model_for

        model = runtime.start_model if runtime.start_model is not None else cost_model_for(cfg.cost_model)
        fields["cost model"] = plan_inputs.digest(dataclasses.asdict(model))
        calibration = runtime.calibration if split == "train" and cfg.reorder_mode == "plan" else None
        if calibration is not None:  # the models it learnt before the checkpoint it resumes from, too
            calibration.restore()
            fields["cost model"] = calibration.digest()
        order = LoaderOrder(cost_model=model)
        if cfg.reorder_mode == "plan":
            import torch.distributed as dist

            from mimo_accel.runtime.store import RankSet

            # the data-loading ranks derive an index together (a gather through the job's store)
            group = RankSet(ctx.data_ranks) if dist.is_initialized() and len(ctx.data_ranks) > 1 else None
            index = cost_index_for(dataset, cfg.cost_index, split, group=group, notify=runtime.say_once)
            fields["cost index"] = index_digest(index)
    plan_inputs.check_same_everywhere(fields, ctx.data_ranks, f"{split} loader")
    if index is not None:
        # every module of the layout, each priced by its own column; an encoder the index cannot
        # price is an error naming both sides (raised alike on every rank: the inputs are the same)
        planner = CostIndexPlanner(index, order.cost_model, ctx.modules, notify=runtime.say_once,
                                   frozen=runtime.frozen)
        window, step_mbs = 1, None
        # Windows span the micro-batches of one training step; evaluation plans each
        # micro-batch on its own (its micro-batches per pass follow other settings).
        if split == "train" and cfg.reorder_window != 1:
            step_mbs = micro_batches_per_step()
            window = resolve_window(cfg.reorder_window, step_mbs)
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
        order = LoaderOrder(planner, order.cost_model, window, plan_check_for(ctx, f"{split} loader"), models)
    return order


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


def plan_check_for(ctx, what: str, check=None):
    """The same-plan check over the data-loading ranks (None in a single process): ``check`` is
    :class:`~mimo_accel.runtime.reading.plan_check.WindowCheck` (plan mode) or ``FirstPlanCheck`` (exchange)."""
    import torch.distributed as dist

    from mimo_accel.runtime.reading import plan_check

    if not dist.is_initialized() or len(ctx.data_ranks) < 2:
        return None
    return (check or plan_check.WindowCheck)(ctx.data_ranks, what)
