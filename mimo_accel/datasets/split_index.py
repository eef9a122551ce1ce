"""Which cost index a split plans from: a file, the dataset's own, or one derived from its raw
examples."""

from __future__ import annotations

from typing import Optional

from mimo_accel.costs import CostIndex
from mimo_accel.datasets.shared_index import derive_cost_index
from mimo_accel.datasets.sources import DeriveError

__all__ = ["SPLIT_FIELD", "cost_index_for", "index_digest"]

SPLIT_FIELD = "{split}"


def cost_index_for(dataset, path: Optional[str], split: str = "train", group=None) -> CostIndex:
    """The cost index of one split's dataset.

    ``path`` with ``{split}`` in it names one file per split (``train``, ``validation``, ``test``);
    a plain path is the train split's index only — an index never describes two datasets. Without
    a file: the index the dataset carries (``mimo_accel_cost_index``), else one derived from the
    dataset's raw examples (:func:`mimo_accel.datasets.shared_index.derive_cost_index`; every rank
    of ``group`` probes its share, cached on disk).
    """
    if path is not None and (SPLIT_FIELD in path or split == "train"):
        index = CostIndex.load(path.replace(SPLIT_FIELD, split))
    else:
        try:
            index = derive_cost_index(dataset, group=group)
        except DeriveError as exc:
            if path is None:
                raise
            raise DeriveError(f"{exc}\nThe configured cost index {path!r} is the train split's; name one "
                              f"file per split with '{SPLIT_FIELD}' in the path (e.g. costs-{SPLIT_FIELD}.npz)"
                              f" to give the {split} split its own.") from exc
    if len(index) < len(dataset):
        raise ValueError(f"mimo_accel reorder: the {split} cost index covers {len(index)} samples but the "
                         f"dataset has {len(dataset)}; rebuild it with `mimo-accel index`")
    return index


def index_digest(index: CostIndex) -> str:
    """What every rank's plan reads from a cost index, hashed (compared across ranks): every
    encoder's columns and rule, and the tokens (:meth:`CostIndex.digest`)."""
    return index.digest()[:16]
