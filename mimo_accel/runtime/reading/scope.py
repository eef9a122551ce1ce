"""The loader scope: which MIMO loaders are being built now, for which split, on which layout.

Loaders are sharded only inside a scope (a ``contextvars`` variable: nothing is read from stack
frames), which the patches open around Bridge's ``build_megatron_mimo_data_loaders`` (the splits
named by what the provider's ``build_datasets`` returns: train, validation, test, so a split
without a dataset shifts none) and around the script's own ``build_data_iterators`` as
``pretrain_megatron_mimo``'s setup calls it (the loaders named in the order they are built).
Inside a scope, Bridge's sampling-info lookup records the layout, and the rank's
:class:`~mimo_accel.runtime.context.ShardContext` is worked out from it at the first loader. A
lookup or loader outside every scope (a unit test, a tool) is left to upstream.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from dataclasses import dataclass, field
from typing import Any, Iterator, Optional

from mimo_accel.runtime.context import ShardContext, context_from_grids
from mimo_accel.runtime.state import Runtime

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
def datasets_seen_by(scope: LoaderScope, provider: Any) -> Iterator[None]:
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
