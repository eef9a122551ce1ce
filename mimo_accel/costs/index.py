"""The cost index ("plan before read"): per-sample cost ingredients of a whole dataset, per module.

It is built once from dataset metadata or file headers and stored beside the dataset: a planner can
then cost any sample for every module of the layout without decoding it.

Per encoder module (keyed by its config name, e.g. ``"vision"``, ``"audio"``), per sample: ``items``
(its images / clips / videos), ``rows`` (the encoder rows of those items before merging),
``sq_rows`` (Σ rows² over the items: the attention term), and the rule that gave the rows; for the
language module, ``tokens`` (the real tokens after packing: text + every modality's placeholders).
:meth:`CostIndex.module_costs` prices every module of a layout with a
:class:`~mimo_accel.costs.CostModel`.

Each column is held in the narrowest unsigned integer type that holds its values, and bounded: no
sample has 2^31 tokens, items or rows, nor Σ rows² of 2^62 (nor more than rows², nor less than
rows). Everything is checked when an index is built from arrays; lookups return int64.

File format v4 (a stored ``.npz``, :mod:`~mimo_accel.costs.index_file`): a JSON ``header`` (format,
length, the encoders in order with their rules, each column's width in bits, the digest) and the
columns ``tokens``, ``e<j>_items``, ``e<j>_rows``, ``e<j>_sq_rows`` for the j-th encoder, each
packed in as many bits as its largest value needs (:mod:`~mimo_accel.costs.packed`: every rank of
a node soon maps the whole file, so its bytes per sample are each rank's memory) and 64-byte
aligned. :meth:`CostIndex.load` memory-maps them read-only — the ranks of a node share one copy in
the page cache — and reads only the header, so loading costs the same at any length: the values
were checked when the file was written, and a width within the bounds holds no value beyond them.
A file of an older format is refused with the command that rebuilds it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import zipfile
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import numpy as np

from mimo_accel.costs.audio import AudioRule
from mimo_accel.costs.index_file import FileFormatError, MappedArrays, write_arrays
from mimo_accel.costs.model import CostModel
from mimo_accel.costs.packed import PackedColumn, bits_for
from mimo_accel.costs.resize import FixedPatches, ResizeRule
from mimo_accel.costs.rules import rule_from_dict
from mimo_accel.modules import LANGUAGE
from mimo_accel.notices import Notices

__all__ = ["CostIndex", "EncoderColumns", "IndexModulesError", "SampleShape"]

COST_INDEX_FORMAT = "mimo-accel-cost-index/4"
_DIGEST_DOMAIN = b"mimo-accel-cost-index-digest/3"  # what digest() hashes first (any file format)
DEFAULT_ENCODER = "vision"  # the encoder from_shapes builds unless told another
_REBUILD_HINT = "rebuild it with `mimo-accel index`"
_RULES = (ResizeRule, FixedPatches, AudioRule)
# What no sample reaches (exclusive bounds, as powers of two): a cost index holding more is damaged
# or was built from wrong numbers. rows < 2^31 keeps Σ rows² <= rows² below 2^62, and every cost
# exact in float64 up to its rounding.
BOUNDS = {"tokens": 31, "items": 31, "rows": 31, "sq_rows": 62}
_KINDS = {"tokens": "tokens", "items": "items", "rows": "rows", "sq_rows": "Σ rows²"}  # in errors
_WIDTHS = tuple(np.dtype(t) for t in (np.uint8, np.uint16, np.uint32, np.uint64))
_CHUNK = 1 << 22  # samples checked at a time (bounds the temporaries of a check at any length)

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


@dataclass(frozen=True)
class EncoderColumns:
    """One encoder's per-sample columns (read-only unsigned integers, each the narrowest that holds
    its values: numpy arrays, or for a loaded index views of the file — packed,
    :class:`~mimo_accel.costs.packed.PackedColumn`, indexed alike) and the rule that gave its rows."""

    items: np.ndarray | PackedColumn
    rows: np.ndarray | PackedColumn
    sq_rows: np.ndarray | PackedColumn
    rule: Any  # ResizeRule | FixedPatches | AudioRule

    @classmethod
    def of(cls, name: str, items: Any, rows: Any, sq_rows: Any, rule: Any) -> "EncoderColumns":
        """Checked columns of encoder ``name`` (errors name it)."""
        arrays = {what: _column(f"encoder {name!r} {what}", values, what)
                  for what, values in (("items", items), ("rows", rows), ("sq_rows", sq_rows))}
        lengths = {k: a.size for k, a in arrays.items()}
        if len(set(lengths.values())) > 1:
            raise ValueError(f"cost index: encoder {name!r} columns differ in length {lengths}; {_REBUILD_HINT}")
        if not isinstance(rule, _RULES):
            raise ValueError(f"cost index: encoder {name!r} rule must be a ResizeRule, FixedPatches or AudioRule, "
                             f"got {type(rule).__name__}")
        n, r, q = arrays["items"], arrays["rows"], arrays["sq_rows"]
        bad = _first_inconsistent(n, r, q, isinstance(rule, AudioRule))
        if bad is not None:
            raise ValueError(f"cost index: inconsistent {'row/item' if isinstance(rule, AudioRule) else 'patch/image'} "
                             f"counts (encoder {name!r}, sample {bad}); {_REBUILD_HINT}")
        return cls(n, r, q, rule)


def _narrowest(top: int) -> np.dtype:
    return next(t for t in _WIDTHS if top <= np.iinfo(t).max)


def _column(what: str, values: Any, kind: str) -> np.ndarray | PackedColumn:
    """``values`` checked (1-D, integers, >= 0, below ``kind``'s bound) and held read-only in the
    narrowest unsigned type; a copy unless it is already such a read-only array, or a packed column
    (a loaded index's) whose width keeps it below the bound."""
    if isinstance(values, PackedColumn) and values.bits <= BOUNDS[kind]:
        return values
    a = np.asarray(values)
    if a.ndim != 1 or (a.size and a.dtype.kind not in "iu"):
        raise ValueError(f"cost index: {what} must be a 1-D integer array; {_REBUILD_HINT}")
    top = 0
    if a.size:
        if a.dtype.kind == "i" and a.min() < 0:
            raise ValueError(f"cost index: {what} has negative entries; {_REBUILD_HINT}")
        top = int(a.max())
        if top >= 1 << BOUNDS[kind]:
            raise ValueError(f"cost index: {what} holds {top:,} (sample {int(np.argmax(a))}), at or above 2^"
                             f"{BOUNDS[kind]}, which no sample's {_KINDS[kind]} reach; the numbers it was built from "
                             f"are wrong: {_REBUILD_HINT}")
    narrow = _narrowest(top)
    if a.dtype == narrow and not a.flags.writeable:
        return a
    out = a.astype(narrow)
    out.setflags(write=False)
    return out


def _first_inconsistent(items: np.ndarray, rows: np.ndarray, sq_rows: np.ndarray, audio: bool) -> Optional[int]:
    """The first sample whose counts no items can give, or None. Σr² lies in [Σr, (Σr)²] for whole
    row counts; rows only where there are items (an image has >= 1 row, so for images rows exist
    iff items do; a very short clip may have 0 rows)."""
    for lo in range(0, rows.size, _CHUNK):
        n, r, q = (c[lo:lo + _CHUNK] for c in (items, rows, sq_rows))
        wide = r.astype(np.uint64)
        bad = (q < r) | (q > wide * wide) | ((r > 0) & (n == 0))
        if not audio:
            bad |= (r > 0) != (n > 0)
        if bad.any():
            return lo + int(np.flatnonzero(bad)[0])
    return None


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
        tok = _column("tokens", tokens, "tokens")
        cols = {}
        for name, given in encoders.items():
            _check_name(name)
            if isinstance(given, EncoderColumns):
                given = (given.items, given.rows, given.sq_rows, given.rule)
            col = EncoderColumns.of(name, *given)
            if col.rows.size != tok.size:
                raise ValueError(f"cost index: encoder {name!r} has {col.rows.size} samples, the tokens "
                                 f"{tok.size}; {_REBUILD_HINT}")
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
        owner = np.repeat(np.arange(len(shapes)), counts)
        patches = np.zeros(len(shapes), dtype=np.int64)
        sq_patches = np.zeros(len(shapes), dtype=np.int64)
        np.add.at(patches, owner, per_image)
        np.add.at(sq_patches, owner, per_image * per_image)
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

    def _single(self) -> EncoderColumns:
        if len(self._encoders) != 1:
            raise ValueError(f"this cost index holds the encoders {list(self._encoders)}: the single-encoder "
                             "accessors (patches, sq_patches, images, rule) do not say which; ask by module "
                             "name (rows(module, indices), ..., module_costs)")
        return next(iter(self._encoders.values()))

    @property
    def rule(self) -> Any:
        """The rule of the single encoder (ValueError when the index holds several)."""
        return self._single().rule

    def rule_of(self, module: str) -> Any:
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

    # --------------------------------------------------------------- the single-encoder view

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
                f" the dataset no longer matches the index, {_REBUILD_HINT}"
            )
        return idx

    def patches(self, indices: Any) -> np.ndarray:
        """Total vision patches of each sample (the single encoder's rows), int64."""
        return _int64(self._single().rows, self._lookup(indices))

    def sq_patches(self, indices: Any) -> np.ndarray:
        """Sum of squared per-image patch counts of each sample (the attention term), int64."""
        return _int64(self._single().sq_rows, self._lookup(indices))

    def images(self, indices: Any) -> np.ndarray:
        """Number of images of each sample (the single encoder's items), int64."""
        return _int64(self._single().items, self._lookup(indices))

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

    def _columns(self) -> dict[str, np.ndarray | PackedColumn]:
        """The file's columns by member name, in the file's order."""
        out = {"tokens": self._tokens}
        for j, col in enumerate(self._encoders.values()):
            out.update({f"e{j}_items": col.items, f"e{j}_rows": col.rows, f"e{j}_sq_rows": col.sq_rows})
        return out

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the index as one ``.npz`` file (format v4, packed: memory-mapped by :meth:`load`) at
        exactly ``path`` (atomically replaced)."""
        columns = self._columns()
        bits = {k: a.bits if isinstance(a, PackedColumn) else bits_for(int(a.max()) if a.size else 0)
                for k, a in columns.items()}
        header = {"format": COST_INDEX_FORMAT, "length": len(self), "digest": self.digest(),
                  "encoders": [{"name": n, "rule": c.rule.to_dict()} for n, c in self._encoders.items()],
                  "columns": {k: {"bits": b} for k, b in bits.items()}}
        if self._identity:
            header["identity"] = dict(self._identity)

        def members():  # each column packed as it is written: one packed copy in memory at a time
            yield "header", np.array(json.dumps(header, sort_keys=True))
            for k, a in columns.items():
                yield k, (a if isinstance(a, PackedColumn) else PackedColumn.pack(a, bits[k])).words

        write_arrays(path, members())

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> CostIndex:
        """Read an index written by :meth:`save`, memory-mapped (its header read, its length and columns
        checked against the file, no column scanned). Anything malformed, or a file of an older format,
        raises ValueError naming the file and the fix."""
        path = Path(path)
        try:
            with MappedArrays(path) as f:
                if "header" not in f.names:
                    raise _Missing(["header"])
                try:
                    header = json.loads(str(f.read("header")))
                    fmt, length = header["format"], header["length"]
                    if isinstance(length, bool) or not isinstance(length, int) or length < 0:
                        raise TypeError
                except (json.JSONDecodeError, KeyError, TypeError):
                    raise _Malformed("") from None
                if fmt != COST_INDEX_FORMAT:
                    raise _WrongFormat(fmt)
                return cls._mapped(path, f, header)
        except _Missing as exc:
            raise ValueError(f"{path}: cost index lacks arrays {exc.args[0]}; {_REBUILD_HINT}") from None
        except _Malformed as exc:
            raise ValueError(f"{path}: cost index header is malformed{exc.args[0]}; {_REBUILD_HINT}") from None
        except _WrongFormat as exc:
            raise ValueError(f"{path}: expected format {COST_INDEX_FORMAT!r}, found {exc.args[0]!r}; "
                             f"{_REBUILD_HINT}") from None
        except _OutOfRange as exc:
            raise ValueError(f"{path}: {exc.args[0]}; {_REBUILD_HINT}") from None
        except (ValueError, EOFError, zipfile.BadZipFile, zlib.error) as exc:
            # Not an .npz, a truncated or damaged one, or pickled objects that are never executed.
            raise ValueError(f"{path}: not a cost index, or a truncated one ({exc}); {_REBUILD_HINT}") from None

    @classmethod
    def _mapped(cls, path: Path, f: MappedArrays, header: dict) -> CostIndex:
        """A file's index, its columns views of the file (raises the private errors above)."""
        encoders = _encoder_entries(header)
        specs, digest, length = header.get("columns"), header.get("digest"), header["length"]
        if not isinstance(specs, dict) or not isinstance(digest, str) or not re.fullmatch(r"[0-9a-f]{64}", digest):
            raise _Malformed(" (columns, digest)")
        names = ["tokens", *(f"e{j}_{c}" for j in range(len(encoders)) for c in ("items", "rows", "sq_rows"))]
        missing = [k for k in names if k not in f.names or k not in specs]
        if missing:
            raise _Missing(missing)
        columns = {}
        for name in names:
            kind = name.partition("_")[2] if name != "tokens" else "tokens"
            columns[name] = _packed_column(f, name, kind, specs[name], length)
        cols = {}
        for j, e in enumerate(encoders):
            try:
                _check_name(e["name"])
                rule = rule_from_dict(e["rule"])
            except (ValueError, TypeError) as exc:
                raise _Malformed(f" (encoder {e['name']!r}: {exc})") from None
            cols[e["name"]] = EncoderColumns(columns[f"e{j}_items"], columns[f"e{j}_rows"], columns[f"e{j}_sq_rows"],
                                             rule)
        if len(cols) != len(encoders):
            raise _Malformed(" (an encoder named twice)")
        return cls._of(columns["tokens"], cols, _identity_of(path, header), digest,
                       (str(path.resolve()), f.stamp()))


class _Missing(Exception):
    pass


class _Malformed(Exception):
    pass


class _WrongFormat(Exception):
    pass


class _OutOfRange(Exception):
    pass


def _int_field(spec: Any, field: str, name: str) -> int:
    try:
        value = spec[field]
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise TypeError
    except (KeyError, TypeError):
        raise _Malformed(f" (column {name})") from None
    return value


def _packed_column(f: MappedArrays, name: str, kind: str, spec: Any, length: int) -> PackedColumn:
    """A column: ``bits`` per value (no value of which can reach the bound), mapped."""
    bits = _int_field(spec, "bits", name)
    if bits > BOUNDS[kind]:
        raise _OutOfRange(f"column {name} has {bits}-bit values, which reach 2^{BOUNDS[kind]} or more: no sample's "
                          f"{_KINDS[kind]} do")
    if bits < 1:
        raise _Malformed(f" (column {name} of {bits} bits)")
    words = f.mapped(name)
    try:
        return PackedColumn(words, bits, length)
    except ValueError as exc:
        raise FileFormatError(f"column {name}: {exc}, as the header says") from None


def _encoder_entries(header: dict) -> list[dict]:
    encoders = header.get("encoders")
    if not isinstance(encoders, list) or not encoders or not all(
            isinstance(e, dict) and {"name", "rule"} <= set(e) for e in encoders):
        raise _Malformed("")
    return encoders


def _identity_of(path: Path, header: dict) -> dict:
    identity = header.get("identity") or {}
    if not isinstance(identity, dict):
        raise ValueError(f"{path}: cost index header is malformed (identity); {_REBUILD_HINT}")
    return identity


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


def _check_name(name: Any) -> None:
    if not isinstance(name, str) or not name:
        raise ValueError(f"cost index: a module name must be a non-empty string, got {name!r}")
    if name == LANGUAGE:
        raise ValueError(f"cost index: {LANGUAGE!r} is the language module, not an encoder; its column is "
                         "the tokens")
