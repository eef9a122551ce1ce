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


def _exchange(fields: Mapping[str, str], ranks: tuple[int, ...], me: int) -> list:
    """Every rank's ``fields``, through the job's rendezvous store (no process group to create,
    so nothing collective with the ranks that build no loader)."""
    from torch.distributed import distributed_c10d as c10d

    with _lock:
        n = _rounds[ranks] = _rounds.get(ranks, 0) + 1
    store = c10d._get_default_store()
    prefix = f"mimo_accel/agree/{'-'.join(map(str, ranks))}/{n}"
    store.set(f"{prefix}/{me}", json.dumps(dict(fields)))
    keys = [f"{prefix}/{r}" for r in ranks]
    try:
        store.wait(keys)
    except Exception as exc:  # the store's own timeout: say who never came
        missing = [r for r, k in zip(ranks, keys) if not store.check([k])]
        raise RuntimeError(f"mimo_accel: ranks {missing} never built this loader (rank {me} waited for "
                           f"them to compare plan inputs): {exc}") from exc
    return [json.loads(store.get(k)) for k in keys]


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
    if dist.get_rank() not in ranks:
        raise RuntimeError(f"mimo_accel: rank {dist.get_rank()} builds {what} but is not one of the "
                           f"data-loading ranks {list(ranks)} Bridge's layout gives")
    gathered = _exchange(fields, ranks, dist.get_rank())
    differ = mismatches(gathered, ranks)
    if differ:
        raise RuntimeError(
            f"mimo_accel: the inputs of the {what} plan differ between ranks, so ranks would pair "
            "different samples. Every rank must use the same cost index, cost model, mimo_accel "
            "options and dataset (the same files on every node):\n  " + "\n  ".join(differ))
