"""Same inputs everywhere: what a plan depends on is compared across the data-loading ranks.

Every rank derives its plan alone (no plan is broadcast), so a cost index, cost model, option or
dataset that differs between nodes would silently pair one replica's text with another's images
whenever the placeholder counts happen to match. Before the first batch, the data-loading ranks
exchange short digests of their plan inputs once per loader; a mismatch is an error that names
the ranks on each side. Equal inputs do not guarantee equal plans on different hardware, so the
plans themselves are compared too, at the first windows and every so often after
(:class:`PlanCheck`).
"""

from __future__ import annotations

import hashlib
import json
import threading
from typing import Mapping, Optional, Sequence

from mimo_accel.runtime.rank_set import RankSet


def digest(value) -> str:
    """A short, stable digest of a JSON-able value (bytes are hashed as they are)."""
    h = hashlib.sha256()
    if isinstance(value, (bytes, bytearray, memoryview)):
        h.update(bytes(value))
    else:
        h.update(json.dumps(value, sort_keys=True, default=str).encode())
    return h.hexdigest()[:16]


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


# Plans are compared at the first windows of every pass over a loader, then every PLAN_CHECK_EVERY.
PLAN_CHECK_FIRST = 3
PLAN_CHECK_EVERY = 64

_lock = threading.Lock()
# (ranks, what) -> plan checks made so far: the same count on every rank (they build their loaders
# in the same order), so a loader built again in the same job compares under keys of its own.
_serials: dict = {}


class PlanCheck:
    """Same plan everywhere: each checked window's plan, compared across the data-loading ranks.

    Every rank computes its plans alone, and equal inputs (:func:`check_same_everywhere`) do not
    make equal plans if the arithmetic differs between nodes. So at the first windows of every pass
    over the loader and every ``every`` windows after, each rank writes a digest of the window's
    plan (the planned order of global indices) into the job's store, and compares it with the
    lowest data-loading rank's when its *next* window is planned. One window later, not at once:
    a language rank plans a window only after it received that window's first encoder output,
    which the encoder rank sends after planning; comparing at once would deadlock the pipeline.
    A rank whose plan differs gathers every rank's digest and raises, naming the ranks on each side
    (before the window after it is read: one window may have been trained mis-paired).

    Per check: one store write and one read per rank (all digests only when they differ).
    """

    def __init__(self, ranks: Sequence[int], what: str, first: int = PLAN_CHECK_FIRST,
                 every: int = PLAN_CHECK_EVERY):
        import torch.distributed as dist

        self.ranks = tuple(sorted(ranks))
        self.what = what
        self.first, self.every = first, every
        self.me = dist.get_rank()
        with _lock:
            serial = _serials[(self.ranks, what)] = _serials.get((self.ranks, what), 0) + 1
        self.prefix = f"mimo_accel/plan/{'-'.join(map(str, self.ranks))}/{what}/{serial}"
        self.pending: Optional[tuple] = None  # (key, digest, ordinal, first global index) to compare
        self.compared = 0  # windows compared with the reference rank so far (none on the reference)

    def wants(self, ordinal: int) -> bool:
        return ordinal < self.first or (self.every > 0 and ordinal % self.every == 0)

    def __call__(self, ordinal: int, window: Sequence[int], order: Sequence[int]) -> None:
        """The ``ordinal``-th window of this pass (``window``: its global indices as upstream's
        sampler gave them) was planned as ``order``."""
        if self.pending is not None:
            pending, self.pending = self.pending, None
            self.settle(*pending)
        if not self.wants(ordinal):
            return
        from mimo_accel.runtime.rank_set import default_store

        key = f"{self.prefix}/{digest([int(i) for i in window])}"
        mine = digest([int(i) for i in order])
        default_store().set(f"{key}/{self.me}", mine)
        self.pending = (key, mine, ordinal, int(window[0]) if len(window) else -1)

    def settle(self, key: str, mine: str, ordinal: int, first: int) -> None:
        from mimo_accel.runtime.rank_set import default_store

        store = default_store()
        reference = self.ranks[0]
        if self.me != reference:
            store.wait([f"{key}/{reference}"])
            theirs = store.get(f"{key}/{reference}").decode()
            if theirs != mine:
                keys = [f"{key}/{r}" for r in self.ranks]
                store.wait(keys)
                sides: dict = {}
                for r, k in zip(self.ranks, keys):
                    sides.setdefault(store.get(k).decode(), []).append(r)
                raise RuntimeError(
                    f"mimo_accel: the {self.what}'s plans differ between ranks at window {ordinal} of this "
                    f"pass (the window from global sample {first}): "
                    + "; ".join(f"ranks {rs} have plan {d}" for d, rs in sides.items())
                    + ". The ranks planned from the same inputs, so their arithmetic differs; ranks on each "
                    "side would pair different samples (text with another sample's encoder rows). Stopping "
                    "before more is trained.")
            self.compared += 1
