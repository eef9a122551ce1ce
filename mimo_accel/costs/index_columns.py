"""One encoder's per-sample columns in a cost index (:class:`EncoderColumns`), checked as they are
built: each column held in the narrowest unsigned integer type that holds its values, and bounded
(no sample has 2^31 tokens, items or rows, nor Σ rows² of 2^62, nor more than rows², nor less than
rows). :mod:`~mimo_accel.costs.index` builds a whole index of them; :mod:`~mimo_accel.costs.index_format`
reads and writes them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from mimo_accel.costs.audio import AudioRule
from mimo_accel.costs.packed import PackedColumn
from mimo_accel.costs.resize import FixedPatches, ResizeRule
from mimo_accel.modules import LANGUAGE

REBUILD_HINT = "rebuild it with `mimo-accel index`"
_RULES = (ResizeRule, FixedPatches, AudioRule)
# What no sample reaches (exclusive bounds, as powers of two): a cost index holding more is damaged
# or was built from wrong numbers. rows < 2^31 keeps Σ rows² <= rows² below 2^62, and every cost
# exact in float64 up to its rounding.
BOUNDS = {"tokens": 31, "items": 31, "rows": 31, "sq_rows": 62}
KINDS = {"tokens": "tokens", "items": "items", "rows": "rows", "sq_rows": "Σ rows²"}  # in errors
_WIDTHS = tuple(np.dtype(t) for t in (np.uint8, np.uint16, np.uint32, np.uint64))
_CHUNK = 1 << 22  # samples checked at a time (bounds the temporaries of a check at any length)


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
        arrays = {what: checked_column(f"encoder {name!r} {what}", values, what)
                  for what, values in (("items", items), ("rows", rows), ("sq_rows", sq_rows))}
        lengths = {k: a.size for k, a in arrays.items()}
        if len(set(lengths.values())) > 1:
            raise ValueError(f"cost index: encoder {name!r} columns differ in length {lengths}; {REBUILD_HINT}")
        if not isinstance(rule, _RULES):
            raise ValueError(f"cost index: encoder {name!r} rule must be a ResizeRule, FixedPatches or AudioRule, "
                             f"got {type(rule).__name__}")
        n, r, q = arrays["items"], arrays["rows"], arrays["sq_rows"]
        bad = _first_inconsistent(n, r, q, isinstance(rule, AudioRule))
        if bad is not None:
            raise ValueError(f"cost index: inconsistent {'row/item' if isinstance(rule, AudioRule) else 'patch/image'} "
                             f"counts (encoder {name!r}, sample {bad}); {REBUILD_HINT}")
        return cls(n, r, q, rule)


def _narrowest(top: int) -> np.dtype:
    return next(t for t in _WIDTHS if top <= np.iinfo(t).max)


def checked_column(what: str, values: Any, kind: str) -> np.ndarray | PackedColumn:
    """``values`` checked (1-D, integers, >= 0, below ``kind``'s bound) and held read-only in the
    narrowest unsigned type; a copy unless it is already such a read-only array, or a packed column
    (a loaded index's) whose width keeps it below the bound."""
    if isinstance(values, PackedColumn) and values.bits <= BOUNDS[kind]:
        return values
    a = np.asarray(values)
    if a.ndim != 1 or (a.size and a.dtype.kind not in "iu"):
        raise ValueError(f"cost index: {what} must be a 1-D integer array; {REBUILD_HINT}")
    top = 0
    if a.size:
        if a.dtype.kind == "i" and a.min() < 0:
            raise ValueError(f"cost index: {what} has negative entries; {REBUILD_HINT}")
        top = int(a.max())
        if top >= 1 << BOUNDS[kind]:
            raise ValueError(f"cost index: {what} holds {top:,} (sample {int(np.argmax(a))}), at or above 2^"
                             f"{BOUNDS[kind]}, which no sample's {KINDS[kind]} reach; the numbers it was built from "
                             f"are wrong: {REBUILD_HINT}")
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


def check_name(name: Any) -> None:
    if not isinstance(name, str) or not name:
        raise ValueError(f"cost index: a module name must be a non-empty string, got {name!r}")
    if name == LANGUAGE:
        raise ValueError(f"cost index: {LANGUAGE!r} is the language module, not an encoder; its column is "
                         "the tokens")
