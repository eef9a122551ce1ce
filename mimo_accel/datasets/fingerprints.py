"""What a derived cost index depends on, hashed (its cache key's material): the tokenizer, the raw
examples, the callables."""

from __future__ import annotations

import functools
import hashlib
import json
import os
from typing import Any, Callable, Mapping, Optional

import numpy as np

from mimo_accel.costs.images import is_pil

__all__ = ["examples_fingerprint", "relocatable", "tokenizer_fingerprint"]

_SAMPLED_ROWS = 4096  # raw examples hashed into a dataset's fingerprint


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


def _canon(obj: Any, depth: int = 0) -> Any:
    """A deterministic, JSON-able stand-in for a raw example (never a memory address)."""
    if depth > 8:
        return "..."
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, (bytes, bytearray, memoryview)):
        return ["bytes", len(obj), sha256_hex(bytes(obj))[:16]]
    if isinstance(obj, Mapping):
        return [[str(k), _canon(v, depth + 1)] for k, v in sorted(obj.items(), key=lambda kv: str(kv[0]))]
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


def _sampled_rows(n: int) -> list[int]:
    if n <= _SAMPLED_ROWS:
        return list(range(n))
    return sorted(set(np.linspace(0, n - 1, _SAMPLED_ROWS).round().astype(np.int64).tolist()))


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


def examples_fingerprint(examples: Any, length: int, relocate: Optional[Callable[[Any], Any]] = None) -> dict[str, Any]:
    """A hash of up to 4096 evenly spaced raw examples of the first ``length`` (an HF dataset's read
    from its arrow table, nothing decoded) and the length; ``relocate(example)`` gives each the form
    that is hashed (the source names its file cells by base name: :func:`relocatable`). HF's own
    ``_fingerprint`` is not used: it changes with the directory the data files lie in. (An edit to a
    row outside the sample goes unnoticed: pass ``refresh=True`` to rebuild.)"""
    rows = _sampled_rows(length)
    if is_hf_dataset(examples):
        sampled = examples.with_format("arrow")[rows].to_pylist() if rows else []
    else:
        sampled = (examples[i] for i in rows)
    h = hashlib.sha256()
    for row in sampled:
        if relocate is not None:
            row = relocate(row)
        h.update(json.dumps(_canon(row), sort_keys=True, default=str).encode())
        h.update(b"\n")
    return {"sampled_rows": h.hexdigest(), "rows": length}


def callable_name(fn: Any) -> Optional[str]:
    if fn is None:
        return None
    if isinstance(fn, functools.partial):
        return f"partial({callable_name(fn.func)}, {sorted(fn.keywords)})"
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', type(fn).__qualname__)}"
