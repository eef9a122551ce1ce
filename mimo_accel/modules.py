"""The modules of a MegatronMIMO layout: the one model of a layout that everything in mimo_accel reads.

One language module (megatron-core's key ``"language"``) and one or more encoders named freely by
the user (``"vision"``, upstream's ``"images"``, ``"audios"``), each with its own TP/PP/DP and a
``kind`` (what it encodes: ``image``, ``video``, ``audio``; the language model's is ``text``).
Everything that depends on which modules exist (the grid, the plan, the cost-index column and
profiler regions named after each module, the report) iterates over a :class:`Modules`, so an
encoder more is data, not code. Pure: the parallelism config is read by attribute only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterator, Mapping, Optional

from mimo_accel.grid import canonical_grid

LANGUAGE = "language"  # megatron.core.models.mimo.config.role.MIMO_LANGUAGE_MODULE_KEY

#: What a module encodes; the language model's kind is "text".
KINDS = ("image", "video", "audio", "text")

# The kind a module's name implies where the caller gives none: the names mimo_accel's tools and
# upstream's examples use. Any other encoder name is an image encoder unless its kind is given.
_KIND_OF_NAME = {"vision": "image", "image": "image", "images": "image", "video": "video", "videos": "video",
                 "audio": "audio", "audios": "audio", LANGUAGE: "text"}


@dataclass(frozen=True)
class Module:
    """One module of the layout: its name in the config, its kind and its parallel sizes."""

    name: str
    dp: int
    kind: str
    tp: int = 1
    pp: int = 1

    @property
    def is_language(self) -> bool:
        return self.name == LANGUAGE

    @property
    def size(self) -> int:
        """Ranks this module occupies (tp × pp × dp)."""
        return self.tp * self.pp * self.dp

    def __str__(self) -> str:
        return f"{self.name}(tp{self.tp},pp{self.pp},dp{self.dp})"


def replica_seconds(times: Mapping[int, float], stages: int) -> float:
    """A replica's time from its ranks' (``rank -> seconds``): its PP stages summed, each its
    slowest rank (TP, CP), what a sample costs the whole module, as the step model prices it before
    spreading it over the stages. A rank's stage is its place among the replica's ranks, pp
    slowest (Bridge's grids order tp, cp, dp, pp)."""
    ranks = sorted(times)
    stages = max(1, min(int(stages), len(ranks)))
    per = max(1, len(ranks) // stages)
    slowest: dict[int, float] = {}
    for i, rank in enumerate(ranks):
        p = min(i // per, stages - 1)
        slowest[p] = max(slowest.get(p, float("-inf")), float(times[rank]))
    return math.fsum(slowest[p] for p in sorted(slowest))


def module(name: str, dp: int, *, kind: Optional[str] = None, tp: int = 1, pp: int = 1) -> Module:
    """The checked :class:`Module` ``name`` with ``dp`` replicas (kind: given, else its name's)."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"a module needs a non-empty name, got {name!r}")
    for what, size in (("data", dp), ("tensor", tp), ("pipeline", pp)):
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"module {name!r}: {what}-parallel size must be a positive integer, got {size!r}")
    kind = _KIND_OF_NAME.get(name, "image") if kind is None else kind
    if kind not in KINDS:
        raise ValueError(f"module {name!r}: kind must be one of {', '.join(KINDS)}, got {kind!r}")
    if (name == LANGUAGE) != (kind == "text"):
        raise ValueError(f"module {name!r}: the language module {LANGUAGE!r} is the one module of kind 'text', "
                         f"got kind {kind!r}")
    return Module(name, dp, kind, tp, pp)


@dataclass(frozen=True)
class Modules:
    """Every module of one layout, in the config's order."""

    all: tuple[Module, ...]

    def __post_init__(self) -> None:
        if not self.all:
            raise ValueError("a MIMO layout needs at least one module")
        names = [m.name for m in self.all]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"a MIMO layout names each module once; {', '.join(twice)} appears twice")

    @classmethod
    def of(cls, *modules: Module) -> "Modules":
        return cls(tuple(modules))

    @classmethod
    def from_dp_sizes(cls, dp_sizes: Mapping[str, int], kinds: Optional[Mapping[str, str]] = None) -> "Modules":
        """Module name -> DP size (tp = pp = 1); ``kinds`` names the kind of any module whose name
        does not imply it."""
        if not dp_sizes:
            raise ValueError("a MIMO layout needs at least one module")
        kinds = kinds or {}
        return cls(tuple(module(name, dp, kind=kinds.get(name)) for name, dp in dp_sizes.items()))

    @classmethod
    def from_parallelism(cls, parallelism_config: Any, kinds: Optional[Mapping[str, str]] = None) -> "Modules":
        """From Bridge's ``MegatronMIMOParallelismConfig`` (its ``module_parallelisms``)."""
        kinds = kinds or {}
        return cls(tuple(module(name, p.data_parallel_size, kind=kinds.get(name), tp=p.tensor_model_parallel_size,
                                pp=p.pipeline_model_parallel_size)
                         for name, p in parallelism_config.module_parallelisms.items()))

    def __iter__(self) -> Iterator[Module]:
        return iter(self.all)

    def __len__(self) -> int:
        return len(self.all)

    def __contains__(self, name: object) -> bool:
        return any(m.name == name for m in self.all)

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
        """G = lcm of the module DP sizes (:func:`mimo_accel.grid.canonical_grid`)."""
        return canonical_grid(m.dp for m in self.all)

    @property
    def world_size(self) -> int:
        return sum(m.size for m in self.all)

    def rank_offsets(self) -> dict[str, int]:
        """Module name -> its first rank in a non-colocated job: the encoders on consecutive ranks in
        their order, then the language module."""
        out, offset = {}, 0
        for m in (*self.encoders, *((self.language,) if self.language is not None else ())):
            out[m.name] = offset
            offset += m.size
        return out

    def module_of_rank(self, rank: int) -> Optional[str]:
        """The module whose ranks (:meth:`rank_offsets`) hold ``rank``; None past the last."""
        for name, offset in self.rank_offsets().items():
            if offset <= rank < offset + self[name].size:
                return name
        return None

    def replace(self, name: str, **sizes: int) -> "Modules":
        """This layout with module ``name``'s ``dp`` / ``tp`` / ``pp`` changed."""
        self[name]  # KeyError naming the modules
        return Modules(tuple(module(m.name, sizes.get("dp", m.dp), kind=m.kind, tp=sizes.get("tp", m.tp),
                                    pp=sizes.get("pp", m.pp)) if m.name == name else m for m in self.all))

    def __str__(self) -> str:
        encoders = "+".join(str(m) for m in self.encoders)
        return f"{encoders}->{self.language}" if self.language is not None else encoders
