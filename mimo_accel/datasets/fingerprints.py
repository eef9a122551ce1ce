"""What a derived cost index depends on, hashed (its cache key's material): the tokenizer, every raw
example's cost inputs in a canonical form, the callables."""

from __future__ import annotations

import functools
import hashlib
import json
import os
from collections.abc import Mapping
from typing import Any, Optional

from mimo_accel.costs.contents import HEAD_BYTES
from mimo_accel.costs.images import is_pil

__all__ = ["canonical_bytes", "relocatable", "tokenizer_fingerprint"]


def sha256_hex(data: Any) -> str:
    if isinstance(data, str):
        data = data.encode()
    return hashlib.sha256(data).hexdigest()


def tokenizer_fingerprint(tokenizer: Any) -> dict[str, Any]:
    """What decides a tokenizer's token counts: its full serialisation for fast tokenizers (vocab,
    merges, normaliser, special tokens, post-processor), else its class, name and vocabulary."""
    fp: dict[str, Any] = {"class": type(tokenizer).__name__}
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and hasattr(backend, "to_str"):
        doc = json.loads(backend.to_str())
        # Truncation and padding are call state (HF sets them per call), not the tokenizer.
        doc.pop("truncation", None)
        doc.pop("padding", None)
        fp["backend"] = sha256_hex(json.dumps(doc, sort_keys=True))
    else:
        # a local directory's name, not where it lies (a copy of the model directory is the same)
        name = str(getattr(tokenizer, "name_or_path", "") or "")
        fp["name"] = os.path.basename(os.path.normpath(name)) if name else ""
        get_vocab = getattr(tokenizer, "get_vocab", None)
        if callable(get_vocab):
            fp["vocab"] = sha256_hex(json.dumps(sorted(get_vocab().items())))
    for attr in ("add_bos_token", "add_eos_token"):
        if isinstance(getattr(tokenizer, attr, None), bool):
            fp[attr] = getattr(tokenizer, attr)
    return fp


_PLAIN = frozenset({str, int, float, bool})  # JSON as they are (the exact types: no subclass's repr)


def _canon(obj: Any, depth: int = 0) -> Any:
    """A deterministic, JSON-able stand-in for a raw example (never a memory address)."""
    if depth > 8:
        return "..."
    if obj is None or type(obj) in _PLAIN or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, (bytes, bytearray, memoryview)):
        # as a file is stamped: its length and its head, where every cost is read from a header
        data = memoryview(obj)
        return ["bytes", data.nbytes, sha256_hex(data[:HEAD_BYTES].tobytes())[:16]]
    if isinstance(obj, Mapping):
        return {str(k): _canon(v, depth + 1) for k, v in obj.items()}  # ordered by json's sort_keys
    if isinstance(obj, (list, tuple)):
        return [_canon(v, depth + 1) for v in obj]
    if isinstance(obj, os.PathLike):
        return os.fspath(obj)
    if is_pil(obj):
        return ["PIL", list(obj.size), obj.mode, os.path.basename(str(getattr(obj, "filename", "") or ""))]
    shape = getattr(obj, "shape", None)
    if shape is not None:
        return ["array", [int(s) for s in shape], str(getattr(obj, "dtype", ""))]
    return ["object", type(obj).__module__, type(obj).__qualname__]


def is_hf_dataset(obj: Any) -> bool:
    return (type(obj).__module__.startswith("datasets.") and hasattr(obj, "_fingerprint")
            and hasattr(obj, "with_format"))


def relocatable(cell: Any) -> Any:
    """A cell that names files, with each file named by its base name: a path (``file://`` too),
    an HF image or audio cell's ``"path"``, a list of those item by item; URLs, bytes, arrays and
    images as they are. The examples of a dataset whose files were copied elsewhere then
    fingerprint the same."""
    if isinstance(cell, os.PathLike):
        cell = os.fspath(cell)
    if isinstance(cell, str):
        if cell.startswith(("data:", "http://", "https://")):
            return cell
        return os.path.basename(cell[len("file://"):] if cell.startswith("file://") else cell)
    if isinstance(cell, Mapping) and isinstance(cell.get("path"), str):
        return {**cell, "path": relocatable(cell["path"])}
    if isinstance(cell, (list, tuple)):
        return [relocatable(c) for c in cell]
    return cell


def canonical_bytes(inputs: Any) -> bytes:
    """A row's cost inputs in the form hashed into the dataset's fingerprint: deterministic JSON,
    never a memory address; bytes by their length and head, arrays by their shape, images by their
    size (what a cost is read from)."""
    if isinstance(inputs, dict) and all(v is None or type(v) in _PLAIN for v in inputs.values()):
        # most rows (a path and a text) without JSON, three times faster (benchmarks/bench_identity.py):
        # each value's type and length before it, NULs between (a JSON text holds no raw NUL)
        return "\0".join(f"{k}\0{type(v).__name__}\0{len(v) if type(v) is str else ''}\0{v}"
                         for k, v in sorted(inputs.items(), key=lambda kv: str(kv[0]))).encode()
    return json.dumps(_canon(inputs), sort_keys=True, default=str).encode()


def callable_name(fn: Any) -> Optional[str]:
    if fn is None:
        return None
    if isinstance(fn, functools.partial):
        return f"partial({callable_name(fn.func)}, {sorted(fn.keywords)})"
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', type(fn).__qualname__)}"
