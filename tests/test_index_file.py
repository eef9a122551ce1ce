"""The cost index file (format v4): columns packed in the bits their values need, memory-mapped
where they lie in a stored .npz, bounds on what a column may hold, costs equal to int64 arithmetic,
the older formats (v3's byte-aligned columns still mapped), and damage (truncated, out of range,
another format) named with the file and the fix. At a small size; the 100 M-sample figures are
benchmarks/bench_index.py --parts mapped."""

from __future__ import annotations

import json
import logging
import mmap
import pickle
import re
import zipfile

import numpy as np
import pytest

from mimo_accel.costs import AudioRule, CostIndex, CostModel, FixedPatches, ModuleCost, ResizeRule
from mimo_accel.costs.index_file import MappedArrays, write_arrays
from mimo_accel.costs.packed import PackedColumn
from mimo_accel.modules import Modules

RULE = ResizeRule()


def _index(n=300, seed=0, top_rows=3000, top_tokens=9000):
    rng = np.random.default_rng(seed)
    items = rng.integers(0, 4, n)
    per = rng.integers(1, top_rows, n)
    return CostIndex(rng.integers(0, top_tokens, n), {
        "vision": (items, items * per, items * per * per, RULE),
        "audio": (items, items * 1500, items * 1500 ** 2, AudioRule(16000, 160, 480000, pad=True))})


def _columns(index):
    every = np.arange(len(index))
    return {m: [getattr(index, c)(m, every).tolist() for c in ("items", "rows", "sq_rows")] for m in index.encoders}, \
        index.tokens(every).tolist()


def _header(path):
    return json.loads(str(np.load(path)["header"]))


def _int64_columns(index):
    """The index's columns by file member name, looked up as int64."""
    every = np.arange(len(index))
    arrays = {"tokens": index.tokens(every)}
    for j, m in enumerate(index.encoders):
        arrays.update({f"e{j}_{c}": getattr(index, c)(m, every) for c in ("items", "rows", "sq_rows")})
    return arrays


def _encoder_entries(index):
    return [{"name": m, "rule": index.rule_of(m).to_dict()} for m in index.encoders]


def _save_v3(path, index):
    """A format-v3 file (byte-aligned narrowest columns), which load refuses."""
    narrow = {k: a.astype(np.min_scalar_type(int(a.max()) if a.size else 0))
              for k, a in _int64_columns(index).items()}
    header = {"format": "mimo-accel-cost-index/3", "length": len(index), "digest": index.digest(),
              "encoders": _encoder_entries(index),
              "columns": {k: {"dtype": a.dtype.str, "max": int(a.max()) if a.size else 0} for k, a in narrow.items()}}
    write_arrays(path, {"header": np.array(json.dumps(header)), **narrow})


def _save_v2(path, index):
    """A format-v2 file (np.savez of int64 columns), which load refuses."""
    header = {"format": "mimo-accel-cost-index/2", "length": len(index), "encoders": _encoder_entries(index)}
    with open(path, "wb") as f:
        np.savez(f, header=np.array(json.dumps(header)), **_int64_columns(index))


def test_each_column_is_packed_in_the_bits_its_largest_value_needs_and_mapped_in_place(tmp_path):
    index = CostIndex([0, 255, 7], {
        "vision": ([1, 1, 0], [300, 70000, 0], [300 ** 2, 70000 ** 2, 0], RULE)})
    path = tmp_path / "i.npz"
    index.save(path)
    columns = _header(path)["columns"]
    # 255 needs 8 bits, 1 one, 70 000 seventeen, 70 000² (4.9e9) thirty-three
    assert columns == {"tokens": {"bits": 8}, "e0_items": {"bits": 1}, "e0_rows": {"bits": 17},
                       "e0_sq_rows": {"bits": 33}}
    back = CostIndex.load(path)
    assert back.mapped and not index.mapped
    col = back.encoder("vision")
    for a in (col.items, col.rows, col.sq_rows, back.token_column):
        assert isinstance(a, PackedColumn)
        assert not a.words.flags.writeable and a.words.ctypes.data % 64 == 0  # aligned views of the one map
        assert isinstance(a.words.base.obj, mmap.mmap)  # a view of the file, not a copy
    # what a lookup returns: the narrowest type that holds the width, int64 from the index
    assert col.rows.dtype == np.uint32 and col.items.dtype == np.uint8 and back.rows("vision", [1]).dtype == np.int64
    assert back.rows("vision", [0, 1, 2]).tolist() == [300, 70000, 0]
    assert back.sq_rows("vision", [2, 1]).tolist() == [0, 70000 ** 2] and back.tokens([1]).tolist() == [255]
    # numpy reads the file as any .npz: each column is its words, 3 values of w bits and a spare word
    with np.load(path) as raw:
        assert {k: raw[k].dtype.str for k in columns} == dict.fromkeys(columns, "<u8")
        assert raw["e0_sq_rows"].size == 3 and raw["tokens"].size == 2  # ceil(3·33 / 64) + 1, ceil(3·8 / 64) + 1


def test_a_large_index_takes_the_sum_of_its_widths_per_sample(tmp_path):
    # the 100 M benchmark's mix: tokens < 2^13, 0-3 images of < 2^14 patches: 13 + 2 + 16 + 30 bits
    rng = np.random.default_rng(3)
    n = 200_000
    items = rng.integers(0, 4, n)
    per = rng.integers(64, 16384, (n, 3)) * (np.arange(3) < items[:, None])
    index = CostIndex(rng.integers(16, 8192, n), {
        "vision": (items, per.sum(1), (per * per).sum(1), RULE)})
    path = tmp_path / "i.npz"
    index.save(path)
    bits = {k: c["bits"] for k, c in _header(path)["columns"].items()}
    assert bits == {"tokens": 13, "e0_items": 2, "e0_rows": 16, "e0_sq_rows": 30}
    assert path.stat().st_size < n * 61 / 8 + 4096  # the header, the zip's records and padding: < 4 KiB
    back = CostIndex.load(path)
    every = rng.permutation(n)
    assert back.sq_rows("vision", every).tolist() == index.sq_rows("vision", every).tolist()
    assert back.digest() == index.digest()


def test_round_trip_digest_and_the_file_are_deterministic(tmp_path):
    index = _index()
    index.save(tmp_path / "a.npz")
    index.save(tmp_path / "b.npz")
    assert (tmp_path / "a.npz").read_bytes() == (tmp_path / "b.npz").read_bytes()  # no clock in the file
    back = CostIndex.load(tmp_path / "a.npz")
    assert _columns(back) == _columns(index) and back.encoders == ("vision", "audio")
    assert back.digest() == index.digest() == _header(tmp_path / "a.npz")["digest"]
    assert back.rule_of("audio") == AudioRule(16000, 160, 480000, pad=True)
    # narrow or wide input of the same values: the same index
    every = np.arange(len(index))
    wide = CostIndex(index.tokens(every).astype(np.int64), {
        m: (index.items(m, every), index.rows(m, every), index.sq_rows(m, every), index.rule_of(m))
        for m in index.encoders})
    assert wide.digest() == index.digest()


def test_costs_from_narrow_columns_equal_int64_arithmetic(tmp_path):
    # sq_rows near 2^62, where float64 rounds: the counts become float64 before any product
    big = 2 ** 31 - 1
    rows = np.array([big, 5, 0, 2 ** 20], np.int64)
    items = np.array([1, 2, 0, 3], np.int64)
    sq = np.array([big * big, 13, 0, 3 * (2 ** 20 // 3) ** 2 + 2], np.int64)
    tokens = np.array([2 ** 31 - 1, 40, 3, 65536], np.int64)
    index = CostIndex(tokens, {"vision": (items, rows, sq, RULE)})
    index.save(tmp_path / "i.npz")
    back = CostIndex.load(tmp_path / "i.npz")
    model = CostModel(modules={"vision": ModuleCost(1.5, 3e-4, 7.0), "language": ModuleCost(1.0, 1 / 8192)})
    modules = Modules.from_dp_sizes({"vision": 2, "language": 2})
    picks = np.array([0, 3, 1, 2, 0])
    expected = {"vision": 1.5 * rows[picks].astype(np.float64) + 3e-4 * sq[picks].astype(np.float64)
                + 7.0 * items[picks].astype(np.float64),
                "language": tokens[picks].astype(np.float64) + (1 / 8192) * tokens[picks].astype(np.float64) ** 2}
    for which in (index, back):
        costs = which.module_costs(picks, model, modules)
        for m in expected:
            np.testing.assert_array_equal(costs[m], expected[m])  # bit for bit


@pytest.mark.parametrize(("column", "value", "bound"), [
    ("tokens", 2 ** 31, "2^31"), ("items", 2 ** 31, "2^31"), ("rows", 2 ** 31, "2^31"), ("sq_rows", 2 ** 62, "2^62")])
def test_values_no_sample_can_have_are_refused_when_built(column, value, bound):
    cols = {"tokens": [1, 2], "items": [1, 1], "rows": [4, 4], "sq_rows": [16, 16]}
    cols[column] = [cols[column][0], value]
    if column == "rows":
        cols["sq_rows"] = [16, value * value]
    with pytest.raises(ValueError, match=rf"holds {value:,} \(sample 1\), at or above {re.escape(bound)}.*mimo-accel index"):
        CostIndex(cols["tokens"], {"vision": (cols["items"], cols["rows"], cols["sq_rows"], RULE)})


def test_counts_no_items_can_give_are_refused():
    # Σr² above (Σr)²: four rows cannot square to more than 16
    with pytest.raises(ValueError, match="inconsistent patch/image counts.*sample 1"):
        CostIndex([1, 2], {"vision": ([1, 1], [4, 4], [16, 17], RULE)})
    with pytest.raises(ValueError, match="inconsistent patch/image counts"):
        CostIndex([1], {"vision": ([1], [4], [17], RULE)})


def _rewrite_header(path, **changes):
    """The file again, its header changed (the columns as they were)."""
    with np.load(path) as raw:
        arrays = {k: raw[k] for k in raw.files}
    header = json.loads(str(arrays.pop("header")))
    for key, value in changes.items():
        node = header
        *parents, last = key.split(".")
        for p in parents:
            node = node[p]
        node[last] = value
    write_arrays(path, {"header": np.array(json.dumps(header)), **arrays})


@pytest.mark.parametrize(("changes", "message"), [
    ({"columns.e0_rows.bits": 32}, r"column e0_rows has 32-bit values, which reach 2\^31 or more"),
    ({"columns.e0_sq_rows.bits": 63}, r"column e0_sq_rows has 63-bit values, which reach 2\^62 or more"),
    ({"columns.e0_rows.bits": 0}, r"header is malformed \(column e0_rows of 0 bits\)"),
    ({"columns.e0_rows.bits": 5}, r"column e0_rows: 300 values of 5 bits take 25 .* words; 67 of uint64 given"),
    ({"length": 301}, r"column \w+: 301 values of \d+ bits take \d+ .* words; \d+ of uint64 given"),
    ({"length": 9000}, "column tokens: 9000 values of 14 bits take 1970 .* words; 67"),
    ({"format": "mimo-accel-cost-index/9"},
     "expected format 'mimo-accel-cost-index/4', found 'mimo-accel-cost-index/9'"),
    ({"digest": "abc"}, "header is malformed"),
    ({"columns.tokens": None}, "header is malformed"),
    ({"columns.tokens.bits": True}, "header is malformed"),
])
def test_a_damaged_header_is_refused_naming_the_file_and_the_fix(tmp_path, changes, message):
    path = tmp_path / "i.npz"
    _index().save(path)
    _rewrite_header(path, **changes)
    with pytest.raises(ValueError, match=message) as err:
        CostIndex.load(path)
    assert str(err.value).startswith(f"{path}: ") and "`mimo-accel index`" in str(err.value)


def test_a_truncated_file_is_refused_naming_the_file_and_the_fix(tmp_path):
    path = tmp_path / "i.npz"
    _index().save(path)
    whole = path.read_bytes()
    for keep in (len(whole) - 1, len(whole) // 2, 100):
        path.write_bytes(whole[:keep])
        with pytest.raises(ValueError, match="truncated") as err:
            CostIndex.load(path)
        assert str(err.value).startswith(f"{path}: ") and "`mimo-accel index`" in str(err.value)


def test_a_column_longer_than_its_zip_entry_is_found_before_any_value_is_read(tmp_path):
    import io

    head = io.BytesIO()
    np.lib.format.write_array_header_1_0(head, {"descr": "<u2", "fortran_order": False, "shape": (1000,)})
    path = tmp_path / "short.npz"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as zf:
        zf.writestr("tokens.npy", head.getvalue() + bytes(20))  # 10 of the 1000 entries
    with MappedArrays(path) as f, pytest.raises(ValueError, match="of 1000 entries does not fit its zip entry"):
        f.mapped("tokens")


def test_compressed_columns_are_refused(tmp_path):
    path = tmp_path / "i.npz"
    _index().save(path)
    with np.load(path) as raw:
        arrays = {k: raw[k] for k in raw.files}
    np.savez_compressed(path, **arrays)
    with pytest.raises(ValueError, match="compressed; it cannot be memory-mapped.*`mimo-accel index`"):
        CostIndex.load(path)


def test_files_of_older_formats_are_refused_naming_the_command_that_rebuilds_them(tmp_path):
    for fmt, save in ((2, _save_v2), (3, _save_v3)):
        path = tmp_path / f"v{fmt}.npz"
        save(path, _index())
        with pytest.raises(ValueError) as err:
            CostIndex.load(path)
        assert str(err.value) == (f"{path}: expected format 'mimo-accel-cost-index/4', found "
                                  f"'mimo-accel-cost-index/{fmt}'; rebuild it with `mimo-accel index`")


def test_a_mapped_index_pickles_as_its_file(tmp_path):
    path = tmp_path / "i.npz"
    _index().save(path)
    back = CostIndex.load(path).with_identity(split="validation")
    blob = pickle.dumps(back)
    assert len(blob) < 2000  # the path, not the columns
    again = pickle.loads(blob)
    assert again.mapped and _columns(again) == _columns(back) and again.identity == {"split": "validation"}
    _index(seed=1).save(path)  # the file replaced: another process would plan from other costs
    with pytest.raises(ValueError, match="changed after it was loaded"):
        pickle.loads(blob)
    in_memory = _index()
    assert _columns(pickle.loads(pickle.dumps(in_memory))) == _columns(in_memory)


def test_an_empty_index_and_a_fixed_rule_round_trip(tmp_path):
    empty = CostIndex([], {"vision": ([], [], [], FixedPatches(577))})
    empty.save(tmp_path / "e.npz")
    back = CostIndex.load(tmp_path / "e.npz")
    assert len(back) == 0 and back.digest() == empty.digest()
    assert back.rule_of("vision") == FixedPatches(577)
    assert back.module_costs([], CostModel(), Modules.from_dp_sizes({"vision": 1, "language": 1}))["vision"].size == 0
