"""The cost index's file, format v4: what :meth:`CostIndex.save <mimo_accel.costs.CostIndex.save>`
writes and :meth:`CostIndex.load <mimo_accel.costs.CostIndex.load>` maps.

A JSON ``header`` (format, length, the encoders in order with their rules, each column's width in
bits, the digest) and the columns ``tokens``, ``e<j>_items``, ``e<j>_rows``, ``e<j>_sq_rows``, each
packed (:mod:`~mimo_accel.costs.packed`) and 64-byte aligned (:mod:`~mimo_accel.costs.index_file`).
Loading maps them read-only and reads the header only, so it costs the same at any length (values
were checked when written). A file of an older format is refused with the command that rebuilds it.
"""

from __future__ import annotations

import json
import os
import re
import zipfile
import zlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from mimo_accel.costs.index_columns import BOUNDS, KINDS, REBUILD_HINT, EncoderColumns, check_name
from mimo_accel.costs.index_file import FileFormatError, MappedArrays, write_arrays
from mimo_accel.costs.packed import PackedColumn, bits_for
from mimo_accel.costs.rules import rule_from_dict

COST_INDEX_FORMAT = "mimo-accel-cost-index/4"


def _file_columns(tokens: np.ndarray | PackedColumn,
                  encoders: Mapping[str, EncoderColumns]) -> dict[str, np.ndarray | PackedColumn]:
    """The file's columns by member name, in the file's order."""
    out = {"tokens": tokens}
    for j, col in enumerate(encoders.values()):
        out.update({f"e{j}_items": col.items, f"e{j}_rows": col.rows, f"e{j}_sq_rows": col.sq_rows})
    return out


def write_index(path: str | os.PathLike[str], tokens: np.ndarray | PackedColumn,
                encoders: Mapping[str, EncoderColumns], digest: str, identity: Mapping[str, Any]) -> None:
    """Write an index's columns as one ``.npz`` file at exactly ``path`` (atomically replaced)."""
    columns = _file_columns(tokens, encoders)
    bits = {k: a.bits if isinstance(a, PackedColumn) else bits_for(int(a.max()) if a.size else 0)
            for k, a in columns.items()}
    header = {"format": COST_INDEX_FORMAT, "length": int(tokens.size), "digest": digest,
              "encoders": [{"name": n, "rule": c.rule.to_dict()} for n, c in encoders.items()],
              "columns": {k: {"bits": b} for k, b in bits.items()}}
    if identity:
        header["identity"] = dict(identity)

    def members():  # each column packed as it is written: one packed copy in memory at a time
        yield "header", np.array(json.dumps(header, sort_keys=True))
        for k, a in columns.items():
            yield k, (a if isinstance(a, PackedColumn) else PackedColumn.pack(a, bits[k])).words

    write_arrays(path, members())


def read_index(path: str | os.PathLike[str]) -> tuple[PackedColumn, dict[str, EncoderColumns], dict, str, tuple]:
    """A file written by :func:`write_index`, memory-mapped (its header read, its length and columns
    checked against the file, no column scanned): (the tokens, the encoders' columns, the identity,
    the digest, (the resolved path, the file's stamp)). Anything malformed, or a file of an older
    format, raises ValueError naming the file and the fix."""
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
            return _mapped(path, f, header)
    except _Missing as exc:
        raise ValueError(f"{path}: cost index lacks arrays {exc.args[0]}; {REBUILD_HINT}") from None
    except _Malformed as exc:
        raise ValueError(f"{path}: cost index header is malformed{exc.args[0]}; {REBUILD_HINT}") from None
    except _WrongFormat as exc:
        raise ValueError(f"{path}: expected format {COST_INDEX_FORMAT!r}, found {exc.args[0]!r}; "
                         f"{REBUILD_HINT}") from None
    except _OutOfRange as exc:
        raise ValueError(f"{path}: {exc.args[0]}; {REBUILD_HINT}") from None
    except (ValueError, EOFError, zipfile.BadZipFile, zlib.error) as exc:
        # Not an .npz, a truncated or damaged one, or pickled objects that are never executed.
        raise ValueError(f"{path}: not a cost index, or a truncated one ({exc}); {REBUILD_HINT}") from None


def _mapped(path: Path, f: MappedArrays, header: dict) -> tuple[PackedColumn, dict[str, EncoderColumns], dict,
                                                                 str, tuple]:
    """A file's parts (as :func:`read_index`), its columns views of the file (raises the private errors
    below)."""
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
            check_name(e["name"])
            rule = rule_from_dict(e["rule"])
        except (ValueError, TypeError) as exc:
            raise _Malformed(f" (encoder {e['name']!r}: {exc})") from None
        cols[e["name"]] = EncoderColumns(columns[f"e{j}_items"], columns[f"e{j}_rows"], columns[f"e{j}_sq_rows"],
                                         rule)
    if len(cols) != len(encoders):
        raise _Malformed(" (an encoder named twice)")
    return columns["tokens"], cols, _identity_of(path, header), digest, (str(path.resolve()), f.stamp())


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
                          f"{KINDS[kind]} do")
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
        raise ValueError(f"{path}: cost index header is malformed (identity); {REBUILD_HINT}")
    return identity

