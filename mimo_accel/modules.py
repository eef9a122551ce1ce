"""The modules of a MegatronMIMO layout, as the user's config names them.

A non-colocated MIMO job has one language module (megatron-core's key ``"language"``) and one or
more encoders, each named freely by the user (``"vision"``, or upstream's own ``"images"`` and
``"audios"``), each on its own grid with its own data-parallel size. Everything in mimo_accel that
depends on *which* modules exist — the canonical grid, what the planner balances, which cost a
module's work is priced by, what the profiler names a module's time — reads it from here, so that
adding an encoder adds data, not code paths.

Pure: no torch, no megatron (the parallelism config is read by attribute only).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Optional

LANGUAGE = "language"  # megatron.core.models.mimo.config.role.MIMO_LANGUAGE_MODULE_KEY

# Every module is priced by its own cost-index quantity and timed under its own name: both are the
# module's name (an encoder "audios" is priced by the index's "audios" columns and timed as the
# profiler regions "audios_fwd" / "audios_bwd"; the language model as "language_fwd" / ...).


@dataclass(frozen=True)
class Module:
    """One module of the layout: its name in the config, its DP size, and what prices and times it."""

    name: str
    dp: int
    cost: str  # the cost-index quantity that prices this module's work per sample (the module's name)
    timer: Optional[str]  # region prefix of its forward/backward in the profiler (the module's name)

    @property
    def is_language(self) -> bool:
        return self.name == LANGUAGE


def module(name: str, dp: int) -> Module:
    """The :class:`Module` a config entry ``name`` with ``dp`` replicas describes."""
    if isinstance(dp, bool) or not isinstance(dp, int) or dp < 1:
        raise ValueError(f"module {name!r}: data-parallel size must be a positive integer, got {dp!r}")
    if not isinstance(name, str) or not name:
        raise ValueError(f"a module needs a non-empty name, got {name!r}")
    return Module(name, dp, cost=name, timer=name)


@dataclass(frozen=True)
class Modules:
    """Every module of one layout, in the config's order."""

    all: tuple[Module, ...]

    @classmethod
    def from_dp_sizes(cls, dp_sizes: Mapping[str, int]) -> "Modules":
        if not dp_sizes:
            raise ValueError("a MIMO layout needs at least one module")
        return cls(tuple(module(name, dp) for name, dp in dp_sizes.items()))

    @classmethod
    def from_parallelism(cls, parallelism_config: Any) -> "Modules":
        """From Bridge's ``MegatronMIMOParallelismConfig`` (its ``module_parallelisms``)."""
        return cls.from_dp_sizes({name: p.data_parallel_size
                                  for name, p in parallelism_config.module_parallelisms.items()})

    def __iter__(self):
        return iter(self.all)

    def __getitem__(self, name: str) -> Module:
        for m in self.all:
            if m.name == name:
                return m
        raise KeyError(f"no module {name!r} in this layout (modules: {', '.join(self.names)})")

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(m.name for m in self.all)

    @property
    def encoders(self) -> tuple[Module, ...]:
        return tuple(m for m in self.all if not m.is_language)

    @property
    def language(self) -> Optional[Module]:
        return next((m for m in self.all if m.is_language), None)

    @property
    def dp_sizes(self) -> dict[str, int]:
        return {m.name: m.dp for m in self.all}

    @property
    def grid(self) -> int:
        """G = lcm of the module DP sizes (see :mod:`mimo_accel.grid`)."""
        return math.lcm(*(m.dp for m in self.all))

    def encoder_groups(self) -> Optional[int]:
        """How many groups the vision-only plan balances: the largest encoder DP (None: no encoder)."""
        return max((m.dp for m in self.encoders), default=None)


def timers_of(modules: Iterable[Module]) -> tuple[str, ...]:
    """The distinct region prefixes the profiler records for these modules."""
    return tuple(dict.fromkeys(m.timer for m in modules if m.timer is not None))
