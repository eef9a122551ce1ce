"""The cost index's file: a stored (uncompressed) ``.npz`` whose arrays are memory-mapped in place.

Each member's data starts on a 64-byte boundary of the file (padding in the zip local header's
extra field, as Android's ``zipalign`` does), so a reader maps the file once and views each array
where it lies: the ranks of a node share one page-cache copy, and opening reads only the zip's
directory and each member's header. ``np.load`` reads it as any ``.npz``.
"""

from __future__ import annotations

import mmap
import os
import struct
import tempfile
import zipfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Optional

import numpy as np

from mimo_accel.costs.files import file_mode

__all__ = ["FileFormatError", "MappedArrays", "write_arrays"]

_ALIGN = 64  # what .npy headers pad to, and what each member's data starts on
_PAD_ID = 0xD935  # the extra-field id zipalign uses for its alignment padding
_LOCAL_HEADER = struct.Struct("<4s5H3L2H")  # a zip local file header, before its name and extra field
_ZIP64_EXTRA = 20  # what zipfile adds to a local header written with force_zip64
_COPY_BLOCK = 1 << 24  # bytes of an array written at a time (narrow columns are copied in blocks)


class FileFormatError(ValueError):
    """The file is not an aligned stored ``.npz`` of 1-D arrays (the message says what is wrong)."""


def write_arrays(path: str | os.PathLike[str],
                 arrays: Mapping[str, np.ndarray] | Iterable[tuple[str, np.ndarray]]) -> None:
    """Write ``arrays`` (a mapping, or ``(name, array)`` pairs made as they are written) as the
    members ``<name>.npy`` of one stored ``.npz`` at exactly ``path``, each member's data 64-byte
    aligned in the file; atomically replaced (a reader on another rank never sees a half-written
    file, and one that mapped the old file keeps its copy)."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f, zipfile.ZipFile(f, "w", zipfile.ZIP_STORED, allowZip64=True) as zf:
            for name, array in (arrays.items() if isinstance(arrays, Mapping) else arrays):
                _write_member(f, zf, f"{name}.npy", np.asarray(array))
        os.chmod(tmp, file_mode())  # mkstemp's 0600 would hide the file from other accounts
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _write_member(f, zf: zipfile.ZipFile, member: str, array: np.ndarray) -> None:
    info = zipfile.ZipInfo(member, date_time=(1980, 1, 1, 0, 0, 0))  # no clock in the file: equal arrays, equal bytes
    info.compress_type = zipfile.ZIP_STORED
    # the data starts after the local header, the name, the extra field and zipfile's zip64 record
    start = f.tell() + _LOCAL_HEADER.size + len(member.encode()) + _ZIP64_EXTRA
    pad = -start % _ALIGN
    if pad < 4:  # an extra-field record is at least its 4-byte id and size
        pad += _ALIGN
    info.extra = struct.pack("<HH", _PAD_ID, pad - 4) + bytes(pad - 4)
    with zf.open(info, "w", force_zip64=True) as out:
        np.lib.format.write_array_header_1_0(out, np.lib.format.header_data_from_array_1_0(array))
        flat = array.reshape(-1)
        step = max(1, _COPY_BLOCK // max(array.itemsize, 1))
        for lo in range(0, flat.size, step):
            out.write(np.ascontiguousarray(flat[lo:lo + step]).tobytes())


class MappedArrays:
    """The arrays of one ``.npz``: :meth:`read` copies a member into memory (any ``.npz``),
    :meth:`mapped` views a stored member where it lies in the file (one read-only map per file).
    Damage raises :class:`FileFormatError` (or zipfile's and numpy's own errors for a file that
    is no zip at all); the caller names the file."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)
        self._file = open(self.path, "rb")
        try:
            self.size = os.fstat(self._file.fileno()).st_size
            self._zip = zipfile.ZipFile(self._file)
        except BaseException:
            self._file.close()
            raise
        self.names = frozenset(n[:-4] for n in self._zip.namelist() if n.endswith(".npy"))
        self._map: Optional[mmap.mmap] = None

    def __enter__(self) -> "MappedArrays":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Close the file; arrays already mapped stay valid (the map lives while they do)."""
        self._zip.close()
        self._file.close()

    def stamp(self) -> tuple[int, int, int]:
        """(size, modification time in ns, inode) of the file as opened."""
        st = os.fstat(self._file.fileno())
        return st.st_size, st.st_mtime_ns, st.st_ino

    def read(self, name: str) -> np.ndarray:
        """Member ``name`` read into memory (no pickled objects)."""
        with self._zip.open(f"{name}.npy") as f:
            return np.lib.format.read_array(f, allow_pickle=False)

    def mapped(self, name: str) -> np.ndarray:
        """Member ``name`` (a 1-D array, stored uncompressed) as a read-only view of the file."""
        info = self._zip.getinfo(f"{name}.npy")
        if info.compress_type != zipfile.ZIP_STORED:
            raise FileFormatError(f"array {name!r} is compressed; it cannot be memory-mapped")
        self._file.seek(info.header_offset)
        local = self._file.read(_LOCAL_HEADER.size)
        if len(local) < _LOCAL_HEADER.size or local[:4] != b"PK\x03\x04":
            raise FileFormatError(f"array {name!r}: no zip entry where the directory says (truncated?)")
        fields = _LOCAL_HEADER.unpack(local)
        start = info.header_offset + _LOCAL_HEADER.size + fields[-2] + fields[-1]
        self._file.seek(start)
        try:
            version = np.lib.format.read_magic(self._file)
            read_header = {(1, 0): np.lib.format.read_array_header_1_0,
                           (2, 0): np.lib.format.read_array_header_2_0}.get(version)
            if read_header is None:
                raise ValueError(f".npy version {version} is not one numpy writes")
            shape, _, dtype = read_header(self._file)
        except ValueError as exc:
            raise FileFormatError(f"array {name!r}: {exc}") from None
        if len(shape) != 1 or dtype.hasobject:
            raise FileFormatError(f"array {name!r} has shape {shape} and dtype {dtype}; a 1-D array of numbers "
                                  "was expected")
        offset = self._file.tell()
        nbytes = shape[0] * dtype.itemsize
        if offset - start + nbytes != info.file_size or offset + nbytes > self.size:
            raise FileFormatError(f"array {name!r} of {shape[0]} entries does not fit its zip entry or the file "
                                  f"({self.size} bytes; truncated?)")
        if self._map is None:
            self._map = mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_READ)
        return np.frombuffer(self._map, dtype=dtype, count=shape[0], offset=offset)
