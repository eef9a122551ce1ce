"""The exchange's routes (pure): who holds which sample after the exchange, and what moves."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Optional

import numpy as np

from mimo_accel.balance import contiguous_order, module_spreads
from mimo_accel.grid import check_micro_batch
from mimo_accel.planner import plan_costs


@dataclass(frozen=True)
class ExchangeRoutes:
    """Who holds which sample after the exchange, and what moves.

    Positions are indices into the global micro-batch in canonical order (rank 0's local samples,
    then rank 1's, ...). ``order`` is the joint plan's canonical-group order (every module of the
    layout balanced at once, as plan-before-read does); rank r holds
    ``order[r·n_local:(r+1)·n_local]`` afterwards, in that order. ``predicted_spreads`` /
    ``baseline_spreads``: each module's replica spread (max/mean) under the plan and under the
    contiguous split; ``predicted_spread`` / ``baseline_spread`` the worst module's.
    """

    n_ranks: int
    n_local: int
    grid: int
    order: tuple[int, ...]
    sizes: tuple[int, ...]
    predicted_spreads: Mapping[str, float]
    baseline_spreads: Mapping[str, float]

    @property
    def predicted_spread(self) -> float:
        return max(self.predicted_spreads.values())

    @property
    def baseline_spread(self) -> float:
        return max(self.baseline_spreads.values())

    def local_after(self, rank: int) -> list[int]:
        return list(self.order[rank * self.n_local:(rank + 1) * self.n_local])

    @cached_property
    def _owner_after(self) -> tuple[int, ...]:
        owner = [0] * len(self.order)
        for k, p in enumerate(self.order):
            owner[p] = k // self.n_local
        return tuple(owner)

    @cached_property
    def _flows(self) -> dict[tuple[int, int], list[int]]:
        flows: dict[tuple[int, int], list[int]] = {}
        for k, p in enumerate(self.order):  # in each receiver's hold order
            flows.setdefault((k // self.n_local, p // self.n_local), []).append(p)
        return flows

    def incoming(self, rank: int, src: int) -> list[int]:
        """Positions ``rank`` receives from ``src``, in the order ``rank`` will hold them."""
        return list(self._flows.get((rank, src), ()))

    def send_bytes(self, rank: int) -> list[int]:
        """Bytes ``rank`` sends to each peer (0 to itself)."""
        return [0 if d == rank else sum(self.sizes[p] for p in self._flows.get((d, rank), ()))
                for d in range(self.n_ranks)]

    def recv_bytes(self, rank: int) -> list[int]:
        return [0 if s == rank else sum(self.sizes[p] for p in self._flows.get((rank, s), ()))
                for s in range(self.n_ranks)]

    def moved(self) -> list[int]:
        """Positions whose owner changes, ascending."""
        return [p for p, r in enumerate(self._owner_after) if r != p // self.n_local]

    @property
    def bytes_moved(self) -> int:
        return sum(self.sizes[p] for p in self.moved())


def route_exchange(costs: Mapping[str, Sequence[float]], sizes: Sequence[int] | np.ndarray, n_ranks: int,
                   grid: int, dps: Mapping[str, int],
                   notify: Optional[Callable[[str, str], object]] = None) -> ExchangeRoutes:
    """The exchange routes of a global micro-batch held by ``n_ranks`` replicas on a grid of G groups.

    ``costs``: module name -> per-sample costs, ``sizes``: per-sample bytes, both in canonical
    order; ``dps``: every module's DP size. The order is the joint plan of plan-before-read
    (:func:`mimo_accel.planner.plan_costs`): the same on every rank of every module, ties broken by
    position.
    """
    c = {m: np.asarray(v, dtype=np.float64) for m, v in costs.items()}
    s = np.asarray(sizes, dtype=np.int64)
    if not c or any(v.shape != s.shape or v.ndim != 1 for v in c.values()):
        raise ValueError("costs (per module) and sizes must be 1-D and of equal length (one per sample)")
    if n_ranks < 1 or grid % n_ranks:
        raise ValueError(f"the canonical grid G={grid} must be a multiple of the DP size {n_ranks}")
    check_micro_batch(s.size, grid, "global micro-batch size")
    order, spreads = plan_costs(c, dict(dps), 1, notify, "the decoded samples")
    return ExchangeRoutes(n_ranks=n_ranks, n_local=s.size // n_ranks, grid=grid, order=tuple(order),
                        sizes=tuple(int(x) for x in s), predicted_spreads=spreads,
                        baseline_spreads=module_spreads(c, dict(dps), contiguous_order(s.size), 1))
