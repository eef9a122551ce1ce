"""Which cost index a split plans from: a file, the dataset's own, or one derived from its raw
examples."""

from __future__ import annotations

from typing import Callable, Optional

from mimo_accel.costs import CostIndex
from mimo_accel.datasets.shared_index import dataset_identity, derive_cost_index
from mimo_accel.datasets.sources import DeriveError

__all__ = ["SPLIT_FIELD", "cost_index_for", "index_digest"]

SPLIT_FIELD = "{split}"


def cost_index_for(dataset, path: Optional[str], split: str = "train", group=None,
                   notify: Optional[Callable[[str, str], object]] = None) -> CostIndex:
    """The cost index of one split's dataset.

    ``path`` with ``{split}`` in it names one file per split (``train``, ``validation``, ``test``);
    a plain path is the train split's index only — an index never describes two datasets. Without
    a file: the index the dataset carries (``mimo_accel_cost_index``), else one derived from the
    dataset's raw examples (:func:`mimo_accel.datasets.shared_index.derive_cost_index`; every rank
    of ``group`` probes its share, cached on disk).

    A file must describe this very dataset: its length, and — where it records them (``mimo-accel
    index --dataset`` does) — the dataset's fingerprint, the files its costs were read from and
    its split, all checked (collective over ``group``). A configured file that differs from the index
    the dataset carries wins, said once.
    """
    carried = getattr(dataset, "mimo_accel_cost_index", None)
    if path is not None and (SPLIT_FIELD in path or split == "train"):
        file = path.replace(SPLIT_FIELD, split)
        index = CostIndex.load(file)
        _check_describes(index, file, dataset, split, group, notify)
        if carried is not None and carried.digest() != index.digest() and notify is not None:
            notify(f"index-overrides:{file}",
                   f"mimo_accel reorder: the {split} dataset ({type(dataset).__name__}) carries its own cost index "
                   f"(mimo_accel_cost_index, digest {carried.digest()[:12]}), and cost_index={path!r} names another "
                   f"({file}, digest {index.digest()[:12]}): planning from the configured file. Drop it from the "
                   "config to plan from the dataset's own")
    else:
        try:
            index = derive_cost_index(dataset, group=group)
        except DeriveError as exc:
            if path is None:
                raise
            raise DeriveError(f"{exc}\nThe configured cost index {path!r} is the train split's; name one "
                              f"file per split with '{SPLIT_FIELD}' in the path (e.g. costs-{SPLIT_FIELD}.npz)"
                              f" to give the {split} split its own.") from exc
    if len(index) != len(dataset):
        raise ValueError(f"mimo_accel reorder: the {split} cost index covers {len(index)} samples but the "
                         f"dataset has {len(dataset)}: it describes another dataset; rebuild it with "
                         "`mimo-accel index`")
    return index


def _check_describes(index: CostIndex, file: str, dataset, split: str, group, notify) -> None:
    """Refuse an index file recorded for another dataset, other files or another split."""
    recorded = index.identity
    fix = (f"rebuild it for this dataset (`mimo-accel index --dataset MODULE:FACTORY --split {split} --out "
           f"{file}`), or name one file per split with '{SPLIT_FIELD}' in the path (e.g. costs-{SPLIT_FIELD}.npz)")
    if recorded.get("split") not in (None, split):
        raise ValueError(f"mimo_accel reorder: the cost index {file} was built for the {recorded['split']} split, "
                         f"but the {split} loader plans from it; {fix}")
    if len(index) != len(dataset):
        raise ValueError(f"mimo_accel reorder: the cost index {file} covers {len(index)} samples but the {split} "
                         f"dataset has {len(dataset)}: it describes another dataset; {fix}")
    # Collective on every rank alike, whatever the file records (ranks must not branch on files
    # that may differ between them: the plan-input check after this names such ranks).
    try:
        mine = dataset_identity(dataset, group=group)
    except DeriveError as exc:  # a dataset mimo_accel cannot fingerprint: the length is all it can check
        if notify is not None:
            notify(f"index-identity:{file}", f"mimo_accel reorder: the cost index {file} could not be checked "
                   f"against the {split} dataset ({exc}); only its length was")
        return
    if not recorded.get("dataset"):
        if notify is not None:
            notify(f"index-identity:{file}", f"mimo_accel reorder: the cost index {file} records no dataset "
                   "fingerprint (built from a manifest, or by an older mimo_accel), so only its length could be "
                   f"checked against the {split} dataset; `mimo-accel index --dataset` records one")
        return
    for field, what in (("dataset", "dataset fingerprint"), ("files", "files (sizes and modification times)")):
        if recorded.get(field) and recorded[field] != mine[field]:
            raise ValueError(
                f"mimo_accel reorder: the cost index {file} describes another dataset: its {what} "
                f"{recorded[field][:16]} ({recorded.get('describe', '?')}), this {split} dataset's "
                f"{mine[field][:16]} ({mine['describe']}); {fix}")


def index_digest(index: CostIndex) -> str:
    """What every rank's plan reads from a cost index, hashed (compared across ranks): every
    encoder's columns and rule, and the tokens (:meth:`CostIndex.digest`)."""
    return index.digest()[:16]
