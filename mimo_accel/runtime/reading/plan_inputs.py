"""Same inputs everywhere: what a plan depends on is compared across the data-loading ranks.

No plan is broadcast, so a cost index, cost model, option or dataset that differs between nodes
would silently pair one replica's text with another's images. Before the first batch the data ranks
exchange digests of their plan inputs once per loader; a mismatch is an error naming the ranks on
each side. The plans themselves are agreed too (:mod:`mimo_accel.runtime.reading.plan_check`).
"""

from __future__ import annotations

import hashlib
import json
from typing import Mapping, Sequence

from mimo_accel.runtime.store import RankSet


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
