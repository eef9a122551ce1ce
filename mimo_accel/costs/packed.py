"""A column of unsigned integers held in exactly as many bits as its largest value needs.

Every data rank of a node maps the cost index, and this kernel maps a whole page-cache folio per
fault, so each rank's share of memory is the file over the ranks: its bytes per sample are the
cost (byte-aligned columns would round 13-bit token counts to 16, 30-bit Σ rows² to 32). numpy
packs no integers (``np.packbits`` packs bits), hence this module. Value ``i`` of width ``w`` lies
at bits ``[i·w, i·w + w)`` of little-endian 64-bit words plus a spare word, so a lookup is two
word reads, two shifts and a mask (``w <= 63``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

__all__ = ["PackedColumn", "bits_for"]

_WORD = np.dtype("<u8")
_CHUNK = 1 << 22  # values packed or unpacked at a time (bounds the temporaries at any length)
_NARROW = tuple(np.dtype(t) for t in (np.uint8, np.uint16, np.uint32, np.uint64))


def bits_for(top: int) -> int:
    """The width of a column whose largest value is ``top`` (at least 1 bit)."""
    if top < 0 or top >= 1 << 63:
        raise ValueError(f"a packed column holds values in [0, 2^63), not {top}")
    return max(1, int(top).bit_length())


def _words_for(size: int, bits: int) -> int:
    return -(-size * bits // 64) + 1  # the stream, and the spare word the last value's second read needs


class PackedColumn:
    """A read-only 1-D column of ``size`` unsigned values of ``bits`` bits, in ``words``.

    It answers what the cost index asks of its columns as a numpy array would: ``column[indices]``
    (integer or boolean arrays, slices, one integer), ``len``, ``size``, ``dtype`` (the narrowest
    unsigned type that holds ``bits``: what lookups return), ``max()``, ``sum()``, and
    ``np.asarray(column)`` (the whole column unpacked)."""

    __slots__ = ("words", "bits", "size", "dtype")

    def __init__(self, words: np.ndarray, bits: int, size: int):
        if not 1 <= bits <= 63 or size < 0:
            raise ValueError(f"a packed column has 1-63 bits per value and a size >= 0, not {bits} and {size}")
        if words.dtype != _WORD or words.ndim != 1 or words.size != _words_for(size, bits):
            raise ValueError(f"{size} values of {bits} bits take {_words_for(size, bits)} little-endian 64-bit "
                             f"words; {words.size} of {words.dtype} given")
        self.words, self.bits, self.size = words, bits, size
        self.dtype = next(t for t in _NARROW if bits <= t.itemsize * 8)

    @classmethod
    def pack(cls, values: Any, bits: int | None = None) -> "PackedColumn":
        """``values`` (1-D, integers in [0, 2^bits)) packed; ``bits`` defaults to what their maximum needs."""
        values = np.asarray(values)
        if values.ndim != 1 or (values.size and values.dtype.kind not in "iu"):
            raise ValueError("a packed column is made of a 1-D integer array")
        top = int(values.max()) if values.size else 0
        if values.size and values.dtype.kind == "i" and int(values.min()) < 0:
            raise ValueError("a packed column holds no negative values")
        bits = bits_for(top) if bits is None else bits
        if top >> bits:
            raise ValueError(f"{top} does not fit in {bits} bits")
        words = np.zeros(_words_for(values.size, bits), _WORD)
        step = min(_CHUNK, values.size) // 64 * 64 + 64  # a chunk of a multiple of 64 values starts on a word
        # where each value of a chunk lies, relative to the chunk's first word (the same for every chunk)
        offsets = np.arange(step, dtype=np.uint64) * np.uint64(bits)
        word, shift = (offsets >> np.uint64(6)).astype(np.intp), offsets & np.uint64(63)
        spill = np.uint64(63) - shift
        # consecutive values start < 64 bits apart, so each word holds the start of one or more: OR
        # every run of values that starts in one word into it, and their spills into the next word
        runs = np.flatnonzero(np.diff(word, prepend=-1))
        for lo in range(0, values.size, step):
            v = values[lo:lo + step].astype(np.uint64)
            m = v.size
            r = runs if m == step else runs[:np.searchsorted(runs, m)]
            first, last = lo * bits // 64, lo * bits // 64 + int(word[m - 1]) + 1
            words[first:last] |= np.bitwise_or.reduceat(v << shift[:m], r)
            words[first + 1:last + 1] |= np.bitwise_or.reduceat((v >> np.uint64(1)) >> spill[:m], r)
        words.setflags(write=False)
        return cls(words, bits, values.size)

    def __len__(self) -> int:
        return self.size

    @property
    def shape(self) -> tuple[int]:
        return (self.size,)

    @property
    def ndim(self) -> int:
        return 1

    @property
    def nbytes(self) -> int:
        return self.words.nbytes

    def __repr__(self) -> str:
        return f"PackedColumn({self.size} values of {self.bits} bits)"

    def take(self, indices: np.ndarray) -> np.ndarray:
        """The values at ``indices`` (integers in [0, size), not checked), as :attr:`dtype`."""
        o = np.asarray(indices).astype(np.uint64) * np.uint64(self.bits)
        k, s = (o >> np.uint64(6)).astype(np.intp), o & np.uint64(63)
        low = self.words[k] >> s
        high = (self.words[k + 1] << np.uint64(1)) << (np.uint64(63) - s)  # << (64 - s), 0 for s = 0
        return ((low | high) & np.uint64((1 << self.bits) - 1)).astype(self.dtype)

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, slice):
            return self.take(np.arange(self.size)[key])
        if isinstance(key, (int, np.integer)) and not isinstance(key, bool):
            i = int(key) + (self.size if key < 0 else 0)
            if not 0 <= i < self.size:
                raise IndexError(f"index {int(key)} is out of bounds for a column of {self.size}")
            return self.take(np.array([i]))[0]
        key = np.asarray(key)
        if key.dtype == bool:
            if key.shape != (self.size,):
                raise IndexError(f"a boolean index of shape {key.shape} for a column of {self.size}")
            return self.take(np.flatnonzero(key))
        if key.size and key.dtype.kind not in "iu":
            raise IndexError(f"a column is indexed by integers or booleans, not {key.dtype}")
        i = key.astype(np.intp)
        i = np.where(i < 0, i + self.size, i)
        if i.size and (i.min() < 0 or i.max() >= self.size):
            raise IndexError(f"an index is out of bounds for a column of {self.size}")
        return self.take(i)

    def chunks(self) -> Iterator[np.ndarray]:
        """The column unpacked, in order, a few million values at a time."""
        for lo in range(0, self.size, _CHUNK):
            yield self.take(np.arange(lo, min(lo + _CHUNK, self.size)))

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        whole = np.concatenate([*self.chunks(), np.empty(0, self.dtype)])
        return whole if dtype is None else whole.astype(dtype)

    def max(self) -> Any:
        if not self.size:
            raise ValueError("the maximum of an empty column")
        return max(c.max() for c in self.chunks())

    def sum(self, dtype: Any = np.uint64) -> Any:
        return np.sum([c.sum(dtype=dtype) for c in self.chunks()], dtype=dtype)
