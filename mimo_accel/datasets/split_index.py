"""Which cost index a split plans from: a file, the dataset's own, or one derived from its raw
examples."""

from __future__ import annotations

from typing import Callable, Optional

import numpy as np

from mimo_accel.costs import CostIndex
from mimo_accel.costs.contents import Contents, SampleDigest
from mimo_accel.costs.index import DEFAULT_ENCODER
from mimo_accel.costs.resize import ResizeRule
from mimo_accel.costs.rules import rule_text
from mimo_accel.datasets.shared_index import derive_cost_index, identify
from mimo_accel.datasets.sources import DeriveError, SampleError

__all__ = ["SPLIT_FIELD", "cost_index_for", "index_digest"]

SPLIT_FIELD = "{split}"


def cost_index_for(dataset, path: Optional[str], split: str = "train", group=None,
                   notify: Optional[Callable[[str, str], object]] = None) -> CostIndex:
    """The cost index of one split's dataset.

    ``path`` with ``{split}`` in it names one file per split; a plain path is the train split's only
    (an index never describes two datasets). Without a file: the dataset's own
    (``mimo_accel_cost_index``), else one derived from its raw examples (:func:`derive_cost_index`,
    collective over ``group``). A file must describe this very dataset (its length, its split, the
    files its costs were read from and, where recorded, the dataset's fingerprint; one recording no
    fingerprint of its files is checked by its length alone, said once), and wins over the dataset's
    own, said once."""
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
    """Refuse an index file recorded for another dataset, other files or another split; accept one
    of the same files in another directory (what is compared: :mod:`mimo_accel.costs.contents`)."""
    recorded = index.identity
    rebuild = (f"`mimo-accel index --dataset MODULE:FACTORY --split {split} --out {file}`" if "manifest" not in recorded
               else f"`mimo-accel index MANIFEST --processor PROCESSOR --split {split} --out {file}` from this "
               "dataset's manifest, with its processor")
    fix = (f"rebuild it for this dataset ({rebuild}), or name one file per split with '{SPLIT_FIELD}' in the path "
           f"(e.g. costs-{SPLIT_FIELD}.npz)")
    if recorded.get("split") not in (None, split):
        raise ValueError(f"mimo_accel reorder: the cost index {file} was built for the {recorded['split']} split, "
                         f"but the {split} loader plans from it; {fix}")
    if len(index) != len(dataset):
        raise ValueError(f"mimo_accel reorder: the cost index {file} covers {len(index)} samples but the {split} "
                         f"dataset has {len(dataset)}: it describes another dataset; {fix}")
    # Collective on every rank alike, whatever the file records (ranks must not branch on files
    # that may differ between them: the plan-input check after this names such ranks).
    try:
        seen = identify(dataset, group)
    except SampleError:  # a sample the job would stop at: said now, with its name
        raise
    except DeriveError as exc:  # a dataset mimo_accel cannot fingerprint: the length is all it can check
        if notify is not None:
            notify(f"index-identity:{file}", f"mimo_accel reorder: the cost index {file} could not be checked "
                   f"against the {split} dataset ({exc}); only its length was")
        return
    mine, contents = seen.identity, seen.contents
    theirs = Contents.from_record(recorded.get("contents"))
    what = recorded.get("describe", "?")
    if theirs is not None and theirs.digest != contents.digest:
        raise ValueError(
            f"mimo_accel reorder: the cost index {file} describes another dataset: its files (names, sizes, first "
            f"bytes) {theirs.describe(what)}, this {split} dataset's {contents.describe(mine['describe'])}; {fix}")
    _check_rules(index, file, seen.source.rules, split, "manifest" in recorded)
    _check_texts(recorded, mine, file, split, fix, notify)
    if theirs is None:
        if notify is not None:
            why = ("records its files in a form this mimo_accel does not read (a newer version's?)" if "contents" in recorded else
                   "records no fingerprint of its files (built by hand, or from a manifest "
                   "that gives image sizes rather than files)")
            notify(f"index-identity:{file}", f"mimo_accel reorder: the cost index {file} {why}, so only its length "
                   f"and resize rule could be checked against the {split} dataset; `mimo-accel index` records one")
        return
    if not recorded.get("dataset"):
        return  # a manifest's index: its files, rule and texts are what it knows of the dataset
    if recorded.get("format") != mine["format"]:
        if notify is not None:
            notify(f"index-format:{file}", f"mimo_accel reorder: the cost index {file} fingerprints its dataset's rows "
                   f"as another mimo_accel did ({recorded.get('format', 'an older scheme')}, this one "
                   f"{mine['format']}), so its files and resize rule were checked against the {split} dataset, its "
                   f"rows' other inputs (texts, cells) and settings were not; rebuild it ({rebuild}) to check them all")
        return
    if recorded["dataset"] != mine["dataset"]:
        raise ValueError(
            f"mimo_accel reorder: the cost index {file} describes another dataset: its files are this one's but its "
            f"dataset fingerprint (every row's cost inputs, tokenizer, processors) {recorded['dataset'][:16]} "
            f"({what}), this {split} dataset's {mine['dataset'][:16]} ({mine['describe']}); {fix}")


def _check_texts(recorded: dict, mine: dict, file: str, split: str, fix: str, notify) -> None:
    """Refuse an index read from other texts than the dataset's (its token counts are theirs);
    say once where either side has none to compare: a manifest that gives token counts, a
    dataset whose texts are conversations."""
    theirs, ours = SampleDigest.from_record(recorded.get("texts")), SampleDigest.from_record(mine.get("texts"))
    if theirs is not None and ours is not None:
        if theirs.digest != ours.digest:
            raise ValueError(
                f"mimo_accel reorder: the cost index {file} describes another dataset: its texts "
                f"{theirs.describe('texts', recorded.get('describe', '?'))}, this {split} dataset's "
                f"{ours.describe('texts', mine['describe'])} (its token counts are the other texts'); {fix}")
        return
    if notify is None or "manifest" not in recorded:
        return  # a derived index: the dataset fingerprint covers the texts
    if theirs is None:
        notify(f"index-texts:{file}", f"mimo_accel reorder: the cost index {file} records no digest of its texts (its "
               "manifest gives \"tokens\" without \"text\" on some line), so its token counts could not be checked "
               f"against the {split} dataset's texts; give each line's \"text\" too for mimo_accel to check them")
    else:
        notify(f"index-texts:{file}", f"mimo_accel reorder: the {split} dataset ({mine['describe']}) holds no texts a "
               f"manifest gives (a conversation's turns, rendered by its chat template), so the texts of the cost "
               f"index {file} could not be checked against it; its files and rule were")


def _check_rules(index: CostIndex, file: str, rules: dict, split: str, from_manifest: bool) -> None:
    """Refuse an index whose rows another rule gave than this dataset's processors give: each of
    the dataset's encoders against the index column that prices it (the same name, or the one of
    each), where that column holds any item (a rule prices nothing without)."""
    ours = list(index.encoders)
    for name, rule in rules.items():
        column = name if name in ours else ours[0] if len(ours) == 1 == len(rules) else None
        if column is None or index.rule_of(column) == rule:
            continue
        if not np.count_nonzero(np.asarray(index.encoder(column).items)):
            continue
        if not from_manifest:
            rebuild = f"`mimo-accel index --dataset MODULE:FACTORY --split {split} --out {file}`"
        elif isinstance(rule, ResizeRule) and not rule.frames_in_budget:
            module = f" --module {column}" if column != DEFAULT_ENCODER else ""
            rebuild = (f"`mimo-accel index MANIFEST --patch-size {rule.patch_size} --merge-size {rule.merge_size} "
                       f"--min-pixels {rule.min_pixels} --max-pixels {rule.max_pixels}{module} --split {split} --out "
                       f"{file}`, or `--processor PROCESSOR` (the one you train with) for its rule, with these pixel "
                       "bounds where a collate sets its own")
        else:  # a rule a manifest cannot give: the dataset's own costs instead
            rebuild = (f"derive it from the dataset instead: drop the cost index (the job derives it), or "
                       f"`mimo-accel index --dataset MODULE:FACTORY --split {split} --out {file}`")
        raise ValueError(
            f"mimo_accel reorder: the cost index {file} was built with another resize rule than the {split} "
            f"dataset's processor: its {column!r} rows follow {rule_text(index.rule_of(column))}; the processor of "
            f"{name!r} gives {rule_text(rule)}; rebuild it with the processor's rule: {rebuild}")


def index_digest(index: CostIndex) -> str:
    """What every rank's plan reads from a cost index, hashed (compared across ranks): every
    encoder's columns and rule, and the tokens (:meth:`CostIndex.digest`)."""
    return index.digest()[:16]
