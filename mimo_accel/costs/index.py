"""The cost index ("plan before read"): per-sample cost ingredients of a whole dataset, per module.

Built once from dataset metadata or file headers, so a planner can cost any sample for every module
without decoding it. Per encoder module (keyed by its config name), per sample: ``items``,
``rows`` (encoder rows before merging), ``sq_rows`` (Σ rows² over the items: the attention term)
and the rule that gave the rows (:class:`~mimo_accel.costs.index_columns.EncoderColumns`); for the
language model, the real ``tokens`` after packing. :meth:`CostIndex.module_costs` prices every
module with a :class:`~mimo_accel.costs.CostModel`. Columns are checked and bounded when built
(:mod:`~mimo_accel.costs.index_columns`), lookups return int64; the file:
:mod:`~mimo_accel.costs.index_format`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from mimo_accel.costs.index_columns import REBUILD_HINT, EncoderColumns, check_name, checked_column
from mimo_accel.costs.index_format import read_index, write_index
from mimo_accel.costs.model import CostModel
from mimo_accel.costs.packed import PackedColumn
from mimo_accel.costs.resize import FixedPatches, ResizeRule
from mimo_accel.modules import LANGUAGE
from mimo_accel.notices import Notices

__all__ = ["CostIndex", "IndexModulesError", "SampleShape"]

_DIGEST_DOMAIN = b"mimo-accel-cost-index-digest/3"  # what digest() hashes first (any file format)
DEFAULT_ENCODER = "vision"  # the encoder from_shapes builds unless told another

logger = logging.getLogger(__name__)
_said = Notices(logger)  # what module_costs and load say once per process (without a notify)


class IndexModulesError(ValueError):
    """The layout has an encoder the cost index has no column for; the message names both sides."""


@dataclass(frozen=True)
class SampleShape:
    """What the cost of a sample depends on: its images' (height, width) and its real tokens."""

    image_sizes: tuple[tuple[int, int], ...]
    tokens: int

    def __post_init__(self) -> None:
        sizes = []
        for given in self.image_sizes:
            try:
                h, w = (int(x) for x in given)
                ok = h >= 1 and w >= 1 and (h, w) == tuple(given)
            except (TypeError, ValueError):
                ok = False
            if not ok:
                raise ValueError(f"image size must be two positive integers (height, width), got {given!r}")
            sizes.append((h, w))
        tokens = self.tokens
        if isinstance(tokens, bool) or not isinstance(tokens, (int, np.integer)) or tokens < 0:
            raise ValueError(f"tokens must be a non-negative integer, got {tokens!r}")
        object.__setattr__(self, "image_sizes", tuple(sizes))
        object.__setattr__(self, "tokens", int(tokens))


class CostIndex:
    """Per-sample cost ingredients of a whole dataset, per module, for costing without decoding.

    ``CostIndex(tokens, {module: (items, rows, sq_rows, rule)})``: per sample the real language
    tokens and, per encoder module, its items, rows and Σ rows², plus the rule that gave the rows.
    Costs are a :class:`CostModel` away, so a new calibration needs no rebuild.
    """

    __slots__ = ("_tokens", "_encoders", "_identity", "_digest", "_file")

    def __init__(self, tokens: Any, encoders: Mapping[str, EncoderColumns | Sequence[Any]]) -> None:
        """An index of the language tokens and any encoders: ``encoders`` maps each encoder's module
        name to its :class:`EncoderColumns` or ``(items, rows, sq_rows, rule)``, in the layout's order."""
        if not isinstance(encoders, Mapping) or not encoders:
            raise ValueError("cost index: at least one encoder (module name -> its columns)")
        tok = checked_column("tokens", tokens, "tokens")
        cols = {}
        for name, given in encoders.items():
            check_name(name)
            if isinstance(given, EncoderColumns):
                given = (given.items, given.rows, given.sq_rows, given.rule)
            col = EncoderColumns.of(name, *given)
            if col.rows.size != tok.size:
                raise ValueError(f"cost index: encoder {name!r} has {col.rows.size} samples, the tokens "
                                 f"{tok.size}; {REBUILD_HINT}")
            cols[name] = col
        self._tokens, self._encoders = tok, cols
        self._identity, self._digest, self._file = {}, None, None

    @classmethod
    def _of(cls, tokens: np.ndarray, encoders: dict[str, EncoderColumns], identity: Optional[dict] = None,
            digest: Optional[str] = None, file: Optional[tuple] = None) -> CostIndex:
        """An index of columns already checked (no copy, no scan)."""
        index = cls.__new__(cls)
        index._tokens, index._encoders = tokens, encoders
        index._identity, index._digest, index._file = dict(identity or {}), digest, file
        return index

    @classmethod
    def from_shapes(cls, shapes: Sequence[SampleShape], rule: ResizeRule | FixedPatches | None = None, *,
                    module: str = DEFAULT_ENCODER) -> CostIndex:
        """Build the index from per-sample shapes (e.g. read with :func:`image_size_from_header`)."""
        rule = ResizeRule() if rule is None else rule
        counts = np.fromiter((len(s.image_sizes) for s in shapes), dtype=np.int64, count=len(shapes))
        tokens = np.fromiter((s.tokens for s in shapes), dtype=np.int64, count=len(shapes))
        hw = np.array([size for s in shapes for size in s.image_sizes], dtype=np.int64).reshape(-1, 2)
        per_image = rule.patches_many(hw[:, 0], hw[:, 1])
        patches, sq_patches, _ = per_sample_sums(len(shapes), np.repeat(np.arange(len(shapes)), counts), per_image)
        return cls(tokens, {module: (counts, patches, sq_patches, rule)})

    def __len__(self) -> int:
        return int(self._tokens.size)

    def __repr__(self) -> str:
        return f"CostIndex({len(self)} samples, encoders {list(self._encoders)})"

    def __reduce__(self):
        # a mapped index travels as its file (another process maps the same pages), checked unchanged
        if self._file is not None:
            return _reopen, (*self._file, self._identity)
        return CostIndex._of, (self._tokens, self._encoders, self._identity, self._digest)

    @property
    def mapped(self) -> bool:
        """Whether the columns are read-only views of the file it was loaded from (shared by every
        process that maps it), rather than this process's own memory."""
        return self._file is not None

    # ------------------------------------------------------------------------------- modules

    @property
    def encoders(self) -> tuple[str, ...]:
        """The encoder module names this index prices, in its order."""
        return tuple(self._encoders)

    def encoder(self, module: str) -> EncoderColumns:
        """Encoder ``module``'s columns (KeyError naming the index's encoders)."""
        try:
            return self._encoders[module]
        except KeyError:
            raise KeyError(f"the cost index has no encoder {module!r} (its encoders: "
                           f"{', '.join(self._encoders)})") from None

    def rule_of(self, module: str) -> Any:
        """The rule that gave encoder ``module``'s rows."""
        return self.encoder(module).rule

    def rows(self, module: str, indices: Any) -> np.ndarray:
        """Encoder ``module``'s rows of each sample (Σ over its items), int64."""
        return _int64(self.encoder(module).rows, self._lookup(indices))

    def sq_rows(self, module: str, indices: Any) -> np.ndarray:
        """Σ rows² over encoder ``module``'s items of each sample (the attention term), int64."""
        return _int64(self.encoder(module).sq_rows, self._lookup(indices))

    def items(self, module: str, indices: Any) -> np.ndarray:
        """Encoder ``module``'s items (images, clips, videos) of each sample, int64."""
        return _int64(self.encoder(module).items, self._lookup(indices))

    @property
    def token_column(self) -> np.ndarray | PackedColumn:
        """The language tokens of every sample as stored (read-only, the narrowest unsigned type, or
        packed for a loaded index; :meth:`tokens` looks samples up as int64)."""
        return self._tokens

    def column_for(self, module: str, layout_encoders: Sequence[str],
                   notify: Optional[Callable[[str, str], object]] = None) -> str:
        """The index encoder that prices the layout's encoder ``module``: the one of that name; with
        one encoder on each side, that one (said once); else :class:`IndexModulesError`."""
        if module in self._encoders:
            return module
        ours = list(self._encoders)
        if len(ours) == 1 and len(layout_encoders) == 1:
            key = f"cost-index:encoder:{ours[0]}->{module}"
            message = (f"mimo_accel reorder: the cost index's one encoder {ours[0]!r} prices the layout's one "
                       f"encoder {module!r} (their names differ)")
            (notify or _said.say_once)(key, message)
            return ours[0]
        missing = [m for m in layout_encoders if m not in self._encoders]
        raise IndexModulesError(
            f"mimo_accel reorder: the cost index prices the encoders {ours}, the layout's encoders are "
            f"{list(layout_encoders)}: nothing in the index prices {missing}. Every encoder of the layout needs its "
            "own column, named as the layout names the module: build the index for each (`mimo-accel index "
            "--module NAME`), or derive it from a MegatronMIMODataset whose processors cover every modality.")

    def module_costs(self, indices: Any, model: CostModel, modules: Any,
                     notify: Optional[Callable[[str, str], object]] = None) -> dict[str, np.ndarray]:
        """Per-sample costs of the samples at ``indices`` for every module of ``modules`` (a
        :class:`mimo_accel.modules.Modules`, or anything iterating over objects with ``.name``):
        module name -> float64 costs. An encoder: ``model``'s ``a·rows + b·sq_rows + k·items`` over
        its column (:meth:`column_for`); the language module: ``a·tokens + b·tokens²``. The counts
        become float64 before any product, so the costs do not depend on the columns' widths."""
        i = self._lookup(indices)
        names = [m.name for m in modules]
        encoders = [n for n in names if n != LANGUAGE]
        out: dict[str, np.ndarray] = {}
        for name in names:
            if name == LANGUAGE:
                out[name] = model.language_costs(self._tokens[i], name)
                continue
            col = self._encoders[self.column_for(name, encoders, notify)]
            out[name] = model.encoder_costs(name, col.rows[i], col.sq_rows[i], col.items[i])
        return out

    # ------------------------------------------------------------------------------- lookups

    def _lookup(self, indices: Any) -> np.ndarray:
        idx = np.asarray(indices)
        if idx.size == 0:
            return idx.astype(np.int64)
        if idx.dtype.kind not in "iu":
            raise TypeError(f"sample indices must be integers, got dtype {idx.dtype}")
        bad = (idx < 0) | (idx >= len(self))
        if bad.any():
            first = int(idx[bad].flat[0])
            raise IndexError(
                f"sample index {first} is out of range for a cost index of {len(self)} samples;"
                f" the dataset no longer matches the index, {REBUILD_HINT}"
            )
        return idx

    def tokens(self, indices: Any) -> np.ndarray:
        """Real language tokens of each sample, int64."""
        return _int64(self._tokens, self._lookup(indices))

    # ------------------------------------------------------------------------------ identity

    @property
    def identity(self) -> dict[str, Any]:
        """What the index describes, as recorded when it was built (the file's header holds it, in
        any format): ``contents`` (the digest of the files its costs were read from — names, sizes,
        first bytes, wherever they lie: :mod:`mimo_accel.costs.contents`), ``dataset`` (a derived
        index's dataset fingerprint: its type, examples, processors and tokenizer), ``split``,
        ``manifest`` (the hash of the manifest an index was built from), ``describe`` (a human
        line). Empty for one built by hand."""
        return dict(self._identity)

    def with_identity(self, **fields: Any) -> "CostIndex":
        """The same index with ``fields`` recorded in its identity (None values drop a field)."""
        identity = {k: v for k, v in {**self._identity, **fields}.items() if v is not None}
        json.dumps(identity)  # must go into the file's JSON header
        return CostIndex._of(self._tokens, self._encoders, identity, self._digest, self._file)

    # --------------------------------------------------------------------------------- files

    def digest(self) -> str:
        """A hex SHA-256 of every encoder (name, rule, columns) and the tokens: equal digests,
        equal indexes (and plans). Computed once (about 0.5 s per GB of columns); a loaded
        file's is the one recorded when it was written, so comparing indexes across ranks costs nothing."""
        if self._digest is None:
            h = hashlib.sha256(_DIGEST_DOMAIN)
            for name in sorted(self._encoders):
                col = self._encoders[name]
                h.update(json.dumps([name, col.rule.to_dict()], sort_keys=True).encode())
                for a in (col.items, col.rows, col.sq_rows):
                    _hash_column(h, a)
            h.update(b"tokens")
            _hash_column(h, self._tokens)
            self._digest = h.hexdigest()
        return self._digest

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the index as one ``.npz`` file (format v4, packed: memory-mapped by :meth:`load`) at
        exactly ``path`` (atomically replaced)."""
        write_index(path, self._tokens, self._encoders, self.digest(), self._identity)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> CostIndex:
        """Read an index written by :meth:`save`, memory-mapped (its header read, its length and columns
        checked against the file, no column scanned). Anything malformed, or a file of an older format,
        raises ValueError naming the file and the fix."""
        return cls._of(*read_index(path))


def per_sample_sums(n: int, owner: Any, rows: Any, sq: Any = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(Σ rows, Σ sq, item count) per sample of ``n``, item j belonging to sample ``owner[j]``;
    ``sq`` defaults to each item's rows² (its attention term)."""
    o, rows = np.asarray(owner, dtype=np.int64), np.asarray(rows, dtype=np.int64)
    sums, squares, count = (np.zeros(n, np.int64) for _ in range(3))
    np.add.at(sums, o, rows)
    np.add.at(squares, o, rows * rows if sq is None else np.asarray(sq, dtype=np.int64))
    np.add.at(count, o, 1)
    return sums, squares, count


def _int64(column: np.ndarray, i: np.ndarray) -> np.ndarray:
    return column[i].astype(np.int64)


def _hash_column(h: Any, a: np.ndarray | PackedColumn) -> None:
    """The column's values in its narrowest type, little-endian: the same for a packed column."""
    h.update(f"{a.dtype.newbyteorder('<').str}:{a.size};".encode())
    for part in (a.chunks() if isinstance(a, PackedColumn) else (a,)):
        h.update(memoryview(np.ascontiguousarray(part, dtype=part.dtype.newbyteorder("<"))).cast("B"))


def _reopen(path: str, stamp: tuple, identity: dict) -> CostIndex:
    """A pickled mapped index in another process: the same file, mapped again, if it is unchanged."""
    index = CostIndex.load(path)
    if index._file[1] != stamp:
        raise ValueError(f"{path}: the cost index file changed after it was loaded (size, modification time, "
                         f"inode {stamp} then, {index._file[1]} now); every process must plan from the same index")
    index._identity = dict(identity)
    return index
