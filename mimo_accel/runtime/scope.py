"""The loader scope: which MIMO loaders are being built now, for which split, on which layout.

Loaders are sharded only inside a scope, which the patched entry points that build MIMO loaders
open (a ``contextvars`` variable, so nothing is found in stack frames or upstream's local names):

- Bridge's ``build_megatron_mimo_data_loaders(cfg, train_state, megatron_mimo_provider, ...)``:
  the scope learns the split of every dataset from what the provider's ``build_datasets`` returns
  to it (train, validation, test, in that order), so a split without a dataset cannot shift the
  others (#5525 skips the loader builder for it; 0.6.2 calls it with None);
- the script's own ``build_data_iterators`` as ``pretrain_megatron_mimo``'s setup calls it (the
  shape of upstream's Qwen3.5-VL example, which looks the sampling info up and calls
  ``build_pretraining_data_loader`` itself): there the loaders are named in the order they are
  built (train, validation, test).

Inside a scope, Bridge's sampling-info lookup (``get_megatron_mimo_sampling_info(config,
grids)``) records the layout; the rank's :class:`~mimo_accel.runtime.shard.ShardContext` is
worked out from it when the first loader is built. A lookup or a loader outside every scope (a
unit test, a tool) is left to upstream.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional

from mimo_accel.runtime import preflight
from mimo_accel.runtime.shard import ShardContext, context_from_grids
from mimo_accel.runtime.state import Runtime
from mimo_accel.runtime.upstream_call import UpstreamCall, replacing
from mimo_accel.runtime.upstream_reorder import refuse_second_reorder, settle_upstream_reorder

# The order Bridge's builder makes the splits' datasets and loaders in.
SPLITS = ("train", "validation", "test")


@dataclass
class LoaderScope:
    """One call of a MIMO loader builder: its layout and the split of each dataset it builds."""

    runtime: Runtime
    datasets: Optional[tuple] = None  # what the provider built, in SPLITS order (None: not known)
    layout: Optional[tuple] = None  # (parallelism config, grids) of the sampling-info lookup made here
    context: Optional[ShardContext] = None
    dp_group: Any = None  # this rank's module DP process group (not part of the picklable context)
    built: int = 0  # loaders built in this scope so far
    _resolved: bool = field(default=False, repr=False)

    def shard_context(self) -> Optional[ShardContext]:
        """This rank's context, from the layout the scope's sampling-info lookup recorded (None: no
        lookup was made in this scope, or this rank is in no module)."""
        if self.layout is not None and not self._resolved:
            self.context, self.dp_group = context_from_grids(*self.layout)
            self._resolved = True
            if self.context is not None:
                self.runtime.context = self.context
        return self.context

    def split_of(self, dataset: Any) -> str:
        """The split of the loader being built now for ``dataset``."""
        n, self.built = self.built, self.built + 1
        if self.datasets is not None and dataset is not None:
            hits = [s for s, ds in zip(SPLITS, self.datasets) if ds is dataset]
            if len(hits) == 1:  # one object for two splits: the order decides
                return hits[0]
        return SPLITS[n] if n < len(SPLITS) else f"loader{n}"


_current: contextvars.ContextVar[Optional[LoaderScope]] = contextvars.ContextVar("mimo_accel_loader_scope",
                                                                                  default=None)


def current() -> Optional[LoaderScope]:
    """The innermost open loader scope, or None."""
    return _current.get()


@contextlib.contextmanager
def loader_scope(runtime: Runtime) -> Iterator[LoaderScope]:
    """Open a loader scope for the duration of one loader-building call."""
    scope = LoaderScope(runtime)
    token = _current.set(scope)
    try:
        yield scope
    finally:
        _current.reset(token)


@contextlib.contextmanager
def _datasets_seen_by(scope: LoaderScope, provider: Any) -> Iterator[None]:
    """For the duration of the builder call, what ``provider.build_datasets`` returns is recorded in
    ``scope`` (an instance attribute over the provider's own method, removed afterwards)."""
    build = getattr(provider, "build_datasets", None)
    if build is None:
        yield
        return

    @functools.wraps(build)
    def build_datasets(*args, **kwargs):
        datasets = build(*args, **kwargs)
        if isinstance(datasets, tuple):
            scope.datasets = datasets
        return datasets

    had_own = "build_datasets" in getattr(provider, "__dict__", {})
    try:
        object.__setattr__(provider, "build_datasets", build_datasets)
    except (AttributeError, TypeError):  # a provider with __slots__: the build order names the splits
        yield
        return
    try:
        yield
    finally:
        if had_own:
            object.__setattr__(provider, "build_datasets", build)
        else:
            object.__delattr__(provider, "build_datasets")


def _start_model(runtime: Runtime, provider) -> None:
    """With reorder on: the cost model plans start from (a configured file, else each module's
    FLOPs from ``provider``), the same at setup and at the loaders' build (the same provider)."""
    if runtime.reorders:
        from mimo_accel.runtime.model_flops import start_cost_model

        runtime.start_model = start_cost_model(runtime.config.cost_model, provider, runtime.say_once)


def wrap_loader_builder(original: Callable, runtime: Runtime) -> Callable:
    """Bridge's ``build_megatron_mimo_data_loaders``: upstream's own reorder asked for
    (:mod:`mimo_accel.runtime.upstream_reorder`), the provider's configs checked
    (:mod:`mimo_accel.runtime.preflight`), then a loader scope that knows each dataset's split."""
    @replacing(original)
    def build_megatron_mimo_data_loaders(call: UpstreamCall):
        settle_upstream_reorder(call["cfg"], runtime)
        preflight.check_provider(getattr(call["cfg"], "model", None), runtime)
        _start_model(runtime, call["megatron_mimo_provider"])
        with loader_scope(runtime) as scope, _datasets_seen_by(scope, call["megatron_mimo_provider"]):
            return call.to(original)

    return build_megatron_mimo_data_loaders


def wrap_setup(original: Callable, runtime: Runtime) -> Callable:
    """``setup_megatron_mimo`` as ``pretrain_megatron_mimo`` calls it: the provider's configs are
    checked before the model is built (:mod:`mimo_accel.runtime.preflight`), and the script's own
    ``build_data_iterators_fn`` runs inside a loader scope (its signature is kept: setup inspects
    it for ``train_state``)."""
    @replacing(original)
    def setup_megatron_mimo(call: UpstreamCall):
        # before the model is built: a Bridge that reorders itself, a module's config that disagrees
        # with its grid, packing that context parallelism cannot split, reorder under a per-replica loss
        cfg = getattr(call["state"], "cfg", None)
        settle_upstream_reorder(cfg, runtime)
        runtime.frozen = frozen_encoders(getattr(cfg, "model", None))
        preflight.check_provider(getattr(cfg, "model", None), runtime)
        _start_model(runtime, getattr(cfg, "model", None))
        if runtime.calibrates_online:  # this run's cost model, learnt while it trains
            from mimo_accel.runtime.calibration import Calibration

            runtime.calibration = Calibration.for_setup(call["state"], runtime.config, runtime.say_once,
                                                        runtime.start_model)
        build = call["build_data_iterators_fn"]
        if build is not None:
            @functools.wraps(build)
            def build_data_iterators(*a, **k):
                with loader_scope(runtime):
                    iterators = build(*a, **k)
                refuse_second_reorder(iterators, runtime)
                return iterators

            call = call.but(build_data_iterators_fn=build_data_iterators)
        return call.to(original)

    return setup_megatron_mimo


def frozen_encoders(provider) -> tuple:
    """The encoders a ``MegatronMIMOProvider`` freezes (``freeze_modality_encoders``: modality name ->
    bool), in name order; none for any other provider."""
    frozen = getattr(provider, "freeze_modality_encoders", None)
    return tuple(sorted(name for name, on in frozen.items() if on)) if isinstance(frozen, dict) else ()


OUTSIDE_A_SCOPE = (
    "mimo_accel: Bridge's MIMO sampling info was looked up outside the loader builders mimo_accel "
    "patches (build_megatron_mimo_data_loaders, or build_data_iterators under pretrain_megatron_mimo), "
    "so the loaders built next are upstream's: every rank reads the whole global micro-batch. If this "
    "script imported build_megatron_mimo_data_loaders before mimo_accel.enable(), call enable() first "
    "(or launch with `mimo-accel run`).")


def wrap_sampling_info(original: Callable, runtime: Runtime) -> Callable:
    """``get_megatron_mimo_sampling_info(megatron_mimo_cfg, grids)``: upstream's answer; inside a
    loader scope, the layout is recorded for the loaders built next in that scope."""

    @replacing(original)
    def get_megatron_mimo_sampling_info(call: UpstreamCall):
        result = call.to(original)
        megatron_mimo_cfg, grids = call["megatron_mimo_cfg"], call["grids"]
        scope = current()
        if scope is not None:
            scope.layout, scope.context, scope.dp_group, scope._resolved = (megatron_mimo_cfg, grids), None, None, False
            runtime.layout, runtime.context = (megatron_mimo_cfg, grids), None
        elif runtime.config.sharded_reads:
            runtime.say_once("scope:outside", OUTSIDE_A_SCOPE)
        return result

    return get_megatron_mimo_sampling_info
