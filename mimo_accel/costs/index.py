"""The cost index ("plan before read"): per-sample cost ingredients of a whole dataset, per module.

It is built once from dataset metadata or file headers and stored beside the dataset: a planner can
then cost any sample for every module of the layout without decoding it.

Per encoder module (keyed by its config name, e.g. ``"vision"``, ``"audio"``), per sample: ``items``
(its images / clips / videos), ``rows`` (the encoder rows of those items before merging),
``sq_rows`` (Σ rows² over the items: the attention term), and the rule that gave the rows; for the
language module, ``tokens`` (the real tokens after packing: text + every modality's placeholders).
:meth:`CostIndex.module_costs` prices every module of a layout with a
:class:`~mimo_accel.costs.CostModel`.

File format v2 (``.npz``): a JSON header (format, length, the encoders in order with their rules)
and int64 arrays ``tokens``, ``e<j>_items``, ``e<j>_rows``, ``e<j>_sq_rows`` for the j-th encoder.
v1 files (one vision encoder: ``patches``, ``sq_patches``, ``images``, ``tokens``) still load, their
encoder named ``"vision"``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import zipfile
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import numpy as np

from mimo_accel.costs._files import file_mode
from mimo_accel.costs.audio import AudioRule
from mimo_accel.costs.model import LANGUAGE, CostModel
from mimo_accel.costs.resize import FixedPatches, ResizeRule
from mimo_accel.costs.rules import rule_from_dict

__all__ = ["CostIndex", "EncoderColumns", "IndexModulesError", "SampleShape"]

COST_INDEX_FORMAT = "mimo-accel-cost-index/2"
COST_INDEX_FORMAT_V1 = "mimo-accel-cost-index/1"
DEFAULT_ENCODER = "vision"  # the name of a v1 index's (and the single-encoder constructor's) encoder
_REBUILD_HINT = "rebuild it with `mimo-accel index`"
_RULES = (ResizeRule, FixedPatches, AudioRule)

logger = logging.getLogger(__name__)
_said: set = set()  # what module_costs said once per process (without a notify)


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
    """One encoder's per-sample columns (int64, read-only) and the rule that gave its rows."""

    items: np.ndarray
    rows: np.ndarray
    sq_rows: np.ndarray
    rule: Any  # ResizeRule | FixedPatches | AudioRule

    @classmethod
    def of(cls, name: str, items: Any, rows: Any, sq_rows: Any, rule: Any) -> "EncoderColumns":
        """Checked columns of encoder ``name`` (errors name it)."""
        arrays = {}
        for what, values in (("items", items), ("rows", rows), ("sq_rows", sq_rows)):
            arrays[what] = _column(f"encoder {name!r} {what}", values)
        lengths = {k: a.size for k, a in arrays.items()}
        if len(set(lengths.values())) > 1:
            raise ValueError(f"cost index: encoder {name!r} columns differ in length {lengths}; {_REBUILD_HINT}")
        if not isinstance(rule, _RULES):
            raise ValueError(f"cost index: encoder {name!r} rule must be a ResizeRule, FixedPatches or AudioRule, "
                             f"got {type(rule).__name__}")
        r, q, n = arrays["rows"], arrays["sq_rows"], arrays["items"]
        # Σr² >= Σr for whole row counts; rows only where there are items (an image has >= 1 row,
        # so for images rows exist iff items do; a very short clip may have 0 rows)
        bad = (q < r) | ((r > 0) & (n == 0))
        if not isinstance(rule, AudioRule):
            bad |= (r > 0) != (n > 0)
        if bad.any():
            raise ValueError(f"cost index: inconsistent {'patch/image' if name == DEFAULT_ENCODER else 'row/item'} "
                             f"counts (encoder {name!r}, sample {int(np.flatnonzero(bad)[0])}); {_REBUILD_HINT}")
        return cls(n, r, q, rule)


def _column(what: str, values: Any) -> np.ndarray:
    a = np.asarray(values)
    if a.ndim != 1 or (a.size and a.dtype.kind not in "iu"):
        raise ValueError(f"cost index: {what} must be a 1-D integer array; {_REBUILD_HINT}")
    a = a.astype(np.int64)
    if (a < 0).any():
        raise ValueError(f"cost index: {what} has negative entries; {_REBUILD_HINT}")
    a.setflags(write=False)
    return a


class CostIndex:
    """Per-sample cost ingredients of a whole dataset, per module, for costing without decoding.

    ``CostIndex(patches, sq_patches, tokens, images, rule)`` is the single-encoder index (its
    encoder named ``module``, default ``"vision"``): per sample Σp_i, Σp_i², real tokens and image
    count, plus the :class:`ResizeRule` they were computed with. :meth:`from_modules` builds one
    with any encoders. Costs are a :class:`CostModel` away, so a new calibration needs no rebuild.
    """

    __slots__ = ("_tokens", "_encoders", "_identity")

    def __init__(
        self,
        patches: Any,
        sq_patches: Any,
        tokens: Any,
        images: Any,
        rule: ResizeRule | FixedPatches | AudioRule,
        *,
        module: str = DEFAULT_ENCODER,
    ) -> None:
        # the v1 names in errors: callers of the single-encoder constructor know these columns
        arrays = {name: _column(name, values) for name, values in
                  (("patches", patches), ("sq_patches", sq_patches), ("tokens", tokens), ("images", images))}
        lengths = {name: a.size for name, a in arrays.items()}
        if len(set(lengths.values())) > 1:
            raise ValueError(f"cost index: arrays differ in length {lengths}; {_REBUILD_HINT}")
        if not isinstance(rule, _RULES):
            raise ValueError(f"cost index: rule must be a ResizeRule or FixedPatches, got {type(rule).__name__}")
        p, q, n = arrays["patches"], arrays["sq_patches"], arrays["images"]
        bad = (q < p) | ((p > 0) & (n == 0))
        if not isinstance(rule, AudioRule):
            bad |= (p > 0) != (n > 0)
        if bad.any():
            raise ValueError(f"cost index: inconsistent patch/image counts; {_REBUILD_HINT}")
        _check_name(module)
        self._tokens = arrays["tokens"]
        self._encoders = {module: EncoderColumns(n, p, q, rule)}
        self._identity = {}

    @classmethod
    def from_modules(cls, tokens: Any, encoders: Mapping[str, EncoderColumns | Sequence[Any]]) -> CostIndex:
        """An index of the language tokens and any encoders: ``encoders`` maps each encoder's module
        name to its :class:`EncoderColumns` or ``(items, rows, sq_rows, rule)``, in the layout's order."""
        if not isinstance(encoders, Mapping) or not encoders:
            raise ValueError("cost index: at least one encoder (module name -> its columns)")
        tok = _column("tokens", tokens)
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
        index = cls.__new__(cls)
        index._tokens, index._encoders, index._identity = tok, cols, {}
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
        return cls(patches, sq_patches, tokens, counts, rule, module=module)

    def __len__(self) -> int:
        return int(self._tokens.size)

    def __repr__(self) -> str:
        return f"CostIndex({len(self)} samples, encoders {list(self._encoders)})"

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
                             "accessors (patches, sq_patches, images, rule, costs) do not say which; ask by module "
                             "name (rows(module, indices), ..., module_costs)")
        return next(iter(self._encoders.values()))

    @property
    def rule(self) -> Any:
        """The rule of the single encoder (ValueError when the index holds several)."""
        return self._single().rule

    def rule_of(self, module: str) -> Any:
        return self.encoder(module).rule

    def rows(self, module: str, indices: Any) -> np.ndarray:
        """Encoder ``module``'s rows of each sample (Σ over its items)."""
        return self.encoder(module).rows[self._lookup(indices)]

    def sq_rows(self, module: str, indices: Any) -> np.ndarray:
        """Σ rows² over encoder ``module``'s items of each sample (the attention term)."""
        return self.encoder(module).sq_rows[self._lookup(indices)]

    def items(self, module: str, indices: Any) -> np.ndarray:
        """Encoder ``module``'s items (images, clips, videos) of each sample."""
        return self.encoder(module).items[self._lookup(indices)]

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
            if notify is not None:
                notify(key, message)
            elif key not in _said:
                _said.add(key)
                logger.warning(message)
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
        its column (:meth:`column_for`); the language module: ``a·tokens + b·tokens²``."""
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

    def costs(self, indices: Any, model: CostModel) -> np.ndarray:
        """Vision costs (the single encoder's, v1 model: a·Σp + b·Σp² + c·tokens) of the samples at
        ``indices`` (float64, finite, >= 0)."""
        i = self._lookup(indices)
        col = self._single()
        return model.costs_from_sums(col.rows[i], col.sq_rows[i], self._tokens[i])

    def patches(self, indices: Any) -> np.ndarray:
        """Total vision patches of each sample (the single encoder's rows)."""
        return self._single().rows[self._lookup(indices)]

    def sq_patches(self, indices: Any) -> np.ndarray:
        """Sum of squared per-image patch counts of each sample (the attention term)."""
        return self._single().sq_rows[self._lookup(indices)]

    def images(self, indices: Any) -> np.ndarray:
        """Number of images of each sample (the single encoder's items)."""
        return self._single().items[self._lookup(indices)]

    def tokens(self, indices: Any) -> np.ndarray:
        """Real language tokens of each sample."""
        return self._tokens[self._lookup(indices)]

    # ------------------------------------------------------------------------------ identity

    @property
    def identity(self) -> dict[str, Any]:
        """What the index describes, as recorded when it was built: ``dataset`` (the dataset's
        fingerprint: its type, examples, processors and tokenizer), ``files`` (the sizes and
        modification times of the files its costs were read from), ``split``, ``manifest`` (the
        hash of the manifest an index was built from), ``describe`` (a human line). Empty for an
        index of an older version or built by hand."""
        return dict(self._identity)

    def with_identity(self, **fields: Any) -> "CostIndex":
        """The same index with ``fields`` recorded in its identity (None values drop a field)."""
        other = CostIndex.__new__(CostIndex)
        other._tokens, other._encoders = self._tokens, self._encoders
        other._identity = {k: v for k, v in {**self._identity, **fields}.items() if v is not None}
        json.dumps(other._identity)  # must go into the file's JSON header
        return other

    # --------------------------------------------------------------------------------- files

    def digest(self) -> str:
        """A hex SHA-256 of every encoder (name, rule, columns) and the tokens: equal digests,
        equal indexes (and plans)."""
        h = hashlib.sha256(COST_INDEX_FORMAT.encode())
        for name in sorted(self._encoders):
            col = self._encoders[name]
            h.update(json.dumps([name, col.rule.to_dict()], sort_keys=True).encode())
            for a in (col.items, col.rows, col.sq_rows):
                h.update(np.ascontiguousarray(a, dtype="<i8").tobytes())
        h.update(b"tokens")
        h.update(np.ascontiguousarray(self._tokens, dtype="<i8").tobytes())
        return h.hexdigest()

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the index as one ``.npz`` file (format v2) at exactly ``path`` (atomically replaced)."""
        names = list(self._encoders)
        header = {"format": COST_INDEX_FORMAT, "length": len(self),
                  "encoders": [{"name": n, "rule": self._encoders[n].rule.to_dict()} for n in names]}
        if self._identity:
            header["identity"] = dict(self._identity)
        arrays: dict[str, np.ndarray] = {"tokens": self._tokens}
        for j, n in enumerate(names):
            col = self._encoders[n]
            arrays.update({f"e{j}_items": col.items, f"e{j}_rows": col.rows, f"e{j}_sq_rows": col.sq_rows})
        path = Path(path)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                np.savez(f, header=np.array(json.dumps(header, sort_keys=True)), **arrays)
            os.chmod(tmp, file_mode())  # mkstemp's 0600 would hide the file from other accounts
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> CostIndex:
        """Read an index written by :meth:`save` (v2, or v1: one encoder named "vision"); anything
        malformed raises ValueError."""
        path = Path(path)
        try:
            data = np.load(path, allow_pickle=False)
            if not isinstance(data, np.lib.npyio.NpzFile):
                raise ValueError("a bare .npy array")
            with data:
                if "header" not in data.files:
                    raise _Missing(["header"])
                header_text = str(data["header"])
                try:
                    header = json.loads(header_text)
                    fmt, length = header["format"], header["length"]
                except (json.JSONDecodeError, KeyError, TypeError):
                    raise _Malformed() from None
                if fmt == COST_INDEX_FORMAT_V1:
                    names = ("patches", "sq_patches", "tokens", "images")
                elif fmt == COST_INDEX_FORMAT:
                    encoders = header.get("encoders")
                    if not isinstance(encoders, list) or not all(isinstance(e, dict) and {"name", "rule"} <= set(e)
                                                                 for e in encoders):
                        raise _Malformed()
                    names = ("tokens", *(f"e{j}_{c}" for j in range(len(encoders))
                                         for c in ("items", "rows", "sq_rows")))
                else:
                    raise _WrongFormat(fmt)
                missing = [k for k in names if k not in data.files]
                if missing:
                    raise _Missing(missing)
                arrays = {k: data[k] for k in names}
        except _Missing as exc:
            raise ValueError(f"{path}: cost index lacks arrays {exc.args[0]}; {_REBUILD_HINT}") from None
        except _Malformed:
            raise ValueError(f"{path}: cost index header is malformed; {_REBUILD_HINT}") from None
        except _WrongFormat as exc:
            raise ValueError(f"{path}: expected format {COST_INDEX_FORMAT!r}, found {exc.args[0]!r}; "
                             f"{_REBUILD_HINT}") from None
        except (ValueError, EOFError, zipfile.BadZipFile, zlib.error) as exc:
            # Not an .npz, a damaged one, or pickled objects that are never executed.
            raise ValueError(f"{path}: not a cost index ({exc}); {_REBUILD_HINT}") from None
        try:
            if fmt == COST_INDEX_FORMAT_V1:
                if "rule" not in header:
                    raise ValueError(f"cost index header is malformed; {_REBUILD_HINT}")
                index = cls(**arrays, rule=rule_from_dict(header["rule"]))
            else:
                index = cls.from_modules(arrays["tokens"], {
                    e["name"]: (arrays[f"e{j}_items"], arrays[f"e{j}_rows"], arrays[f"e{j}_sq_rows"],
                                rule_from_dict(e["rule"]))
                    for j, e in enumerate(header["encoders"])})
                if len(index.encoders) != len(header["encoders"]):
                    raise ValueError(f"the header names an encoder twice; {_REBUILD_HINT}")
        except (ValueError, TypeError) as exc:
            raise ValueError(f"{path}: {exc}") from None
        if len(index) != length:
            raise ValueError(f"{path}: header says {length} samples, arrays hold {len(index)}; {_REBUILD_HINT}")
        identity = header.get("identity") or {}
        if not isinstance(identity, dict):
            raise ValueError(f"{path}: cost index header is malformed (identity); {_REBUILD_HINT}")
        return index.with_identity(**identity) if identity else index


class _Missing(Exception):
    pass


class _Malformed(Exception):
    pass


class _WrongFormat(Exception):
    pass


def _check_name(name: Any) -> None:
    if not isinstance(name, str) or not name:
        raise ValueError(f"cost index: a module name must be a non-empty string, got {name!r}")
    if name == LANGUAGE:
        raise ValueError(f"cost index: {LANGUAGE!r} is the language module, not an encoder; its column is "
                         "the tokens")
