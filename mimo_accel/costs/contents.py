"""What the costs of an index were read from, by content: per sample, each of its files' base name,
size and first bytes, hashed into one digest that is the same wherever the files sit
(:class:`Contents`); and per sample its text, or any other bytes a caller gives
(:class:`SampleDigest`: the texts an index was read from, every row's cost inputs).

The base name, not the path (a copy elsewhere, or a manifest naming its files relative to itself,
keeps it); the size and a SHA-256 of the first :data:`HEAD_BYTES` (every cost is read from a
header, which lies there); no modification time (``cp``, a download or an unpacked archive gives
copies new ones, not new costs); the sample's position. The digest is a sum modulo 2^256 of one
SHA-256 per sample, so the ranks each hash a share and the shares add up to one process's digest.
It detects accidents, not forgeries (docs/design.md, "What an index records").
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Optional, Sequence

from mimo_accel.costs.files import map_reads

__all__ = ["HEAD_BYTES", "SCHEME", "TEXTS_SCHEME", "Contents", "SampleDigest", "file_stamp", "file_stamps"]

SCHEME = "mimo-accel-contents/1"  # base name, size, SHA-256 of the first HEAD_BYTES, per sample position
TEXTS_SCHEME = "mimo-accel-texts/1"  # SHA-256 of each sample's position and its text (UTF-8)
HEAD_BYTES = 4096  # one page: reading it costs what opening the file costs
_MODULUS = 1 << 256


def _folded(total: int, h: "hashlib._Hash") -> int:
    return (total + int.from_bytes(h.digest(), "big")) % _MODULUS


def _read_record(record: Any, scheme: str, count: str) -> Optional[tuple[int, int]]:
    """(the sum, the count) a digest's record holds, or None for none, another scheme or a malformed one."""
    if not isinstance(record, Mapping) or record.get("scheme") != scheme:
        return None
    digest, n = record.get("digest"), record.get(count)
    if not (isinstance(digest, str) and re.fullmatch(r"[0-9a-f]{64}", digest) and isinstance(n, int)):
        return None
    return int(digest, 16), n


def file_stamp(path: str | os.PathLike[str]) -> bytes:
    """One file's part of the digest: its base name, size and the SHA-256 of its first bytes
    (OSError when it cannot be read)."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        head = hashlib.sha256(f.read(HEAD_BYTES)).hexdigest()
    return f"{os.path.basename(os.fspath(path))}\0{size}\0{head}\n".encode()


def _stamp_or_error(path: str) -> bytes | OSError:
    try:
        return file_stamp(path)
    except OSError as exc:  # counted and named by Contents.add, never raised mid-collective
        return exc


def file_stamps(paths: Sequence[str], workers: Optional[int] = None) -> list[bytes | OSError]:
    """:func:`file_stamp` of each path, in order (an unreadable file: its OSError); a thread pool
    reads many files at once unless ``workers`` is 1."""
    return map_reads(_stamp_or_error, paths, workers, "mimo-accel-contents")


@dataclass
class Contents:
    """The running digest of samples' files; the digests of disjoint sets of samples add up
    (``a + b``) to the digest of their union."""

    total: int = 0
    files: int = 0
    unreadable: int = 0
    first_unreadable: Optional[str] = None  # "path: reason" of one unreadable file

    def add(self, sample: int, paths: Sequence[str], stamps: Sequence[bytes | OSError]) -> None:
        """Sample ``sample`` (its position in the dataset) and its files, as :func:`file_stamps`
        read them. A sample without files adds nothing (the index's length is checked apart)."""
        if not paths:
            return
        h = hashlib.sha256(b"%d\n" % sample)
        for path, stamp in zip(paths, stamps, strict=True):
            if isinstance(stamp, OSError):
                self.unreadable += 1
                if self.first_unreadable is None:
                    self.first_unreadable = f"{path}: {stamp.strerror or stamp}"
                stamp = f"{os.path.basename(path)}\0unreadable\n".encode()
            h.update(stamp)
        self.files += len(paths)
        self.total = _folded(self.total, h)

    def __add__(self, other: "Contents") -> "Contents":
        return Contents((self.total + other.total) % _MODULUS, self.files + other.files,
                        self.unreadable + other.unreadable, self.first_unreadable or other.first_unreadable)

    @property
    def digest(self) -> str:
        return f"{self.total:064x}"

    def record(self) -> dict[str, Any]:
        """What a cost index's identity records under ``contents``."""
        return {"scheme": SCHEME, "digest": self.digest, "files": self.files}

    @classmethod
    def from_record(cls, record: Any) -> Optional["Contents"]:
        """The digest a cost index recorded (:meth:`record`); None when it records none, or one of
        another scheme."""
        read = _read_record(record, SCHEME, "files")
        return cls(*read) if read is not None else None

    def describe(self, what: str = "") -> str:
        """The digest's head, its file count (and unreadable files) and ``what``, for messages."""
        text = f"{self.digest[:16]} ({self.files:,} files"
        if self.unreadable:
            text += f", {self.unreadable:,} unreadable: {self.first_unreadable}"
        return text + (f"; {what})" if what else ")")


@dataclass
class SampleDigest:
    """The running digest of one payload per sample (a text, a row's cost inputs in a canonical
    form): per sample, the SHA-256 of its position and its payload, summed like :class:`Contents`,
    so the digests of disjoint sets of samples add up to their union's."""

    total: int = 0
    samples: int = 0

    def add(self, sample: int, payload: bytes) -> None:
        h = hashlib.sha256(b"%d\n" % sample)
        h.update(payload)
        self.samples += 1
        self.total = _folded(self.total, h)

    def __add__(self, other: "SampleDigest") -> "SampleDigest":
        return SampleDigest((self.total + other.total) % _MODULUS, self.samples + other.samples)

    @property
    def digest(self) -> str:
        return f"{self.total:064x}"

    def record(self, scheme: str = TEXTS_SCHEME) -> dict[str, Any]:
        """What a cost index's identity records (under ``texts`` for the texts)."""
        return {"scheme": scheme, "digest": self.digest, "samples": self.samples}

    @classmethod
    def from_record(cls, record: Any, scheme: str = TEXTS_SCHEME) -> Optional["SampleDigest"]:
        """The digest :meth:`record` wrote; None for none, or one of another scheme."""
        read = _read_record(record, scheme, "samples")
        return cls(*read) if read is not None else None

    def describe(self, noun: str = "texts", what: str = "") -> str:
        """The digest's head, its sample count and ``what``, for messages."""
        return f"{self.digest[:16]} ({self.samples:,} {noun}" + (f"; {what})" if what else ")")
