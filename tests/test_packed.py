"""Packed columns (mimo_accel.costs.packed): any width 1-63, any values that fit, read back as they
were written wherever a value lies in its words, across the chunks packing works in."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mimo_accel.costs import packed
from mimo_accel.costs.packed import PackedColumn, bits_for
from tests._hypothesis import examples


@st.composite
def columns(draw):
    bits = draw(st.integers(1, 63))
    values = draw(st.lists(st.integers(0, (1 << bits) - 1), max_size=300))
    return bits, np.array(values, dtype=np.uint64)


@settings(max_examples=examples(150), deadline=None)
@given(columns(), st.sampled_from([64, 128, 1 << 22]), st.randoms(use_true_random=False))
def test_what_is_packed_reads_back_at_every_index(column, chunk, rnd):
    bits, values = column
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(packed, "_CHUNK", chunk)  # small chunks: values packed in several, a value's words in two
        c = PackedColumn.pack(values, bits)
        assert c.words.size == -(-values.size * bits // 64) + 1 and not c.words.flags.writeable
        assert np.asarray(c).tolist() == values.tolist() and np.asarray(c).dtype == c.dtype
        assert c.dtype.itemsize * 8 >= bits and (c.dtype.itemsize == 1 or c.dtype.itemsize * 4 < bits)
        if values.size:
            picks = [rnd.randrange(values.size) for _ in range(20)]
            assert c[np.array(picks)].tolist() == values[picks].tolist()
            assert c[-1] == values[-1] and c[0] == values[0]
            mask = values % 2 == 1
            assert c[mask].tolist() == values[mask].tolist() and c[1::3].tolist() == values[1::3].tolist()
            assert c.max() == values.max() and c.sum() == values.sum(dtype=np.uint64)


def test_the_width_is_what_the_largest_value_needs():
    assert [bits_for(v) for v in (0, 1, 2, 255, 256, 8191, 2 ** 62)] == [1, 1, 2, 8, 9, 13, 63]
    assert PackedColumn.pack(np.array([0, 8191, 5])).bits == 13
    with pytest.raises(ValueError, match=r"\[0, 2\^63\)"):
        bits_for(2 ** 63)


def test_values_that_do_not_fit_and_words_that_do_not_match_are_refused():
    with pytest.raises(ValueError, match="8 does not fit in 3 bits"):
        PackedColumn.pack(np.array([1, 8]), 3)
    with pytest.raises(ValueError, match="no negative values"):
        PackedColumn.pack(np.array([1, -1]))
    with pytest.raises(ValueError, match="1-D integer array"):
        PackedColumn.pack(np.array([1.5]))
    words = PackedColumn.pack(np.arange(100)).words
    with pytest.raises(ValueError, match=r"100 values of 7 bits take 12 little-endian 64-bit words; 13 of uint64"):
        PackedColumn(np.concatenate([words, words[:1]]), 7, 100)
    with pytest.raises(ValueError, match="1-63 bits"):
        PackedColumn(words, 64, 100)


def test_indices_out_of_range_are_refused_as_numpy_refuses_them():
    c = PackedColumn.pack(np.arange(10))
    with pytest.raises(IndexError, match="out of bounds"):
        c[10]
    with pytest.raises(IndexError, match="out of bounds"):
        c[np.array([3, -11])]
    with pytest.raises(IndexError, match="boolean index of shape"):
        c[np.ones(9, bool)]
    assert c[np.array([-1, -10])].tolist() == [9, 0] and c[np.array([], dtype=np.int64)].size == 0
