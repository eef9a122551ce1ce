"""Each module's memory per GPU in a layout (:mod:`mimo_accel.costs.memory` on the module's own
config and sizes), and whether it fits the machine."""

from __future__ import annotations

from functools import lru_cache
from typing import Optional

from mimo_accel.costs.memory import GIB, Footprint, encoder_memory, fits, language_memory
from mimo_accel.tools.layout.draws import Draws
from mimo_accel.tools.layout.machine import Machine
from mimo_accel.tools.layout.models import ModelSpec
from mimo_accel.tools.layout.spec import LayoutSpec

__all__ = ["MemoryModel"]


class MemoryModel:
    """``memory(name, tp, pp, dp, mbs, micro_batches, stages_after)`` of a module of ``model``: its
    language micro-batch holds ``mbs / dp`` sequences of the drawn sequence length; an encoder holds
    the micro-batches in flight at once, whose rows are at most those of the largest
    ``mbs / dp × in flight`` drawn samples (the heaviest a plan could put together)."""

    def __init__(self, model: ModelSpec, draws: Draws, machine: Machine, *, distributed_optimizer: bool = True,
                 frozen: tuple[str, ...] = ()):
        self.model, self.draws, self.machine = model, draws, machine
        self.distributed_optimizer = distributed_optimizer
        self.frozen = frozenset(frozen) | frozenset(model.frozen)
        encoders = list(model.encoders)
        self.columns = {e: draws.index.column_for(e, encoders, lambda *_: None) for e in encoders}
        self.memory = lru_cache(maxsize=None)(self.memory)
        self._rows = lru_cache(maxsize=None)(self._rows)

    def _rows(self, name: str, k: int) -> float:
        return self.draws.largest_rows(self.columns[name], k)

    def memory(self, name: str, tp: int, pp: int, dp: int, mbs: int, micro_batches: int,
               stages_after: int) -> Footprint:
        m = self.model.modules[name]
        trained = m.trained and name not in self.frozen
        local = mbs // dp
        if m.is_language:
            return language_memory(m.params, layers=m.layers, hidden=m.hidden, ffn_hidden=m.ffn_hidden,
                                   vocab=m.vocab, tp=tp, pp=pp, dp=dp, tokens=local * self.draws.seq_length,
                                   micro_batches=micro_batches, trained=trained,
                                   distributed_optimizer=self.distributed_optimizer)
        in_flight = min(micro_batches, stages_after + 1)
        return encoder_memory(m.params, layers=m.layers, hidden=m.hidden, ffn_hidden=m.ffn_hidden, tp=tp, dp=dp,
                              rows=self._rows(name, local * in_flight) / in_flight, micro_batches=micro_batches,
                              stages_after=stages_after, trained=trained,
                              distributed_optimizer=self.distributed_optimizer)

    def of_layout(self, layout: LayoutSpec) -> dict[str, Footprint]:
        pp = layout.modules["language"].pp
        return {m.name: self.memory(m.name, m.tp, m.pp, m.dp, layout.mbs, layout.micro_batches, pp)
                for m in layout.modules}

    def why_not(self, footprints: dict[str, Footprint]) -> Optional[str]:
        """None where every module fits; else which does not, by how much."""
        over = [(n, f) for n, f in footprints.items() if not fits(f, self.machine.memory_gib, self.machine.reserve)]
        if not over:
            return None
        usable = self.machine.memory_gib * (1 - self.machine.reserve)
        return "; ".join(f"{n} needs {f.total / GIB:.1f} GiB per GPU ({f.states / GIB:.1f} states + "
                         f"{f.activations / GIB:.1f} activations), over the {usable:.1f} GiB usable" for n, f in over)
