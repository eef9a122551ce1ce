"""Same inputs everywhere: what a plan depends on is compared across the data-loading ranks.

Every rank derives its plan alone (no plan is broadcast), so a cost index, cost model, option or
dataset that differs between nodes would silently pair one replica's text with another's images
whenever the placeholder counts happen to match. Before the first batch, the data-loading ranks
exchange short digests of their plan inputs once per loader; a mismatch is an error that names
the ranks on each side.
"""

from __future__ import annotations

import hashlib
import json
import pickle
import threading
from typing import Mapping, Sequence

LANGUAGE = "language"  # megatron.core.models.mimo.config.role.MIMO_LANGUAGE_MODULE_KEY

_lock = threading.Lock()
_rounds: dict = {}  # ranks -> how many comparisons these ranks have made (the same on each of them)


def digest(value) -> str:
    """A short, stable digest of a JSON-able value (bytes are hashed as they are)."""
    h = hashlib.sha256()
    if isinstance(value, (bytes, bytearray, memoryview)):
        h.update(bytes(value))
    else:
        h.update(json.dumps(value, sort_keys=True, default=str).encode())
    return h.hexdigest()[:16]


def data_loading_ranks(grids: Mapping[str, object]) -> tuple[int, ...]:
    """The ranks Bridge builds data loaders on, from the grids alone (no communication).

    Bridge (megatron/bridge/data/megatron_mimo/dp_utils.py ``_needs_data_for_module``): every
    language rank loads data; an encoder rank loads data on its first pipeline stage only.
    """
    ranks: set[int] = set()
    for name, grid in grids.items():
        for pp_group in grid.get_rank_enum(["pp"]):
            ranks.update(pp_group if name == LANGUAGE else pp_group[:1])
    return tuple(sorted(ranks))


class RankSet:
    """A set of ranks that gathers Python objects through the job's rendezvous store.

    No process group is created, so nothing is collective with the ranks outside the set (Bridge
    builds loaders on the data-loading ranks only). Every member must call :meth:`gather` the same
    number of times, in the same order. ``rank``/``world`` are this process's place in the set.
    """

    def __init__(self, ranks: Sequence[int]):
        import torch.distributed as dist

        self.ranks = tuple(sorted(ranks))
        me = dist.get_rank()
        if me not in self.ranks:
            raise RuntimeError(f"mimo_accel: rank {me} builds a loader but is not one of the "
                               f"data-loading ranks {list(self.ranks)} of Bridge's layout")
        self.rank, self.world = self.ranks.index(me), len(self.ranks)

    def gather(self, obj) -> list:
        from torch.distributed import distributed_c10d as c10d

        with _lock:
            n = _rounds[self.ranks] = _rounds.get(self.ranks, 0) + 1
        store = c10d._get_default_store()
        prefix = f"mimo_accel/gather/{'-'.join(map(str, self.ranks))}/{n}"
        keys = [f"{prefix}/{r}" for r in self.ranks]
        store.set(keys[self.rank], pickle.dumps(obj))
        try:
            store.wait(keys)
        except Exception as exc:  # the store's own timeout: say who never came
            missing = [r for r, k in zip(self.ranks, keys) if not store.check([k])]
            raise RuntimeError(f"mimo_accel: ranks {missing} never reached this point (rank "
                               f"{self.ranks[self.rank]} waited for them): {exc}") from exc
        return [pickle.loads(store.get(k)) for k in keys]


def mismatches(per_rank: Sequence[Mapping[str, str]], ranks: Sequence[int]) -> list[str]:
    """For each field whose value differs between ranks: 'field: ranks [..] have x; ranks [..] have y'."""
    out = []
    for field in sorted({f for fields in per_rank for f in fields}):
        sides: dict = {}
        for rank, fields in zip(ranks, per_rank):
            sides.setdefault(fields.get(field), []).append(rank)
        if len(sides) > 1:
            out.append(f"{field}: " + "; ".join(f"ranks {rs} have {v}" for v, rs in sides.items()))
    return out


def check_same_everywhere(fields: Mapping[str, str], ranks: Sequence[int], what: str) -> None:
    """All-gather ``fields`` (field -> digest) over ``ranks`` and raise if any field differs.

    Collective over ``ranks``: each of them must call it, in the same order.
    """
    import torch.distributed as dist

    ranks = tuple(sorted(ranks))
    if len(ranks) < 2 or not dist.is_initialized():
        return
    gathered = RankSet(ranks).gather(dict(fields))
    differ = mismatches(gathered, ranks)
    if differ:
        raise RuntimeError(
            f"mimo_accel: the inputs of the {what} plan differ between ranks, so ranks would pair "
            "different samples. Every rank must use the same cost index, cost model, mimo_accel "
            "options and dataset (the same files on every node):\n  " + "\n  ".join(differ))
