"""Index, cost-model and cache files are written with the process umask's mode.

The writers replace files atomically through ``tempfile.mkstemp``, which creates files 0600: an
index written by one account of a job was unreadable by another. They now take the mode a plain
``open(path, "w")`` would (0666 less the umask).
"""

from __future__ import annotations

import os
import stat

import numpy as np
import pytest

from mimo_accel.costs import CostIndex, CostModel, ResizeRule
from mimo_accel.costs.files import atomic_write
from mimo_accel.datasets import shared_index
from mimo_accel_dev.rehearse import stack as st


@pytest.fixture(params=[0o022, 0o027, 0o002], ids=["umask022", "umask027", "umask002"])
def process_umask(request):
    old = os.umask(request.param)
    try:
        yield request.param
    finally:
        os.umask(old)


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_umask_is_read_without_changing_it(process_umask):
    from mimo_accel.costs.files import file_mode, umask

    assert umask() == process_umask
    assert umask() == process_umask
    assert file_mode() == 0o666 & ~process_umask


def test_index_model_and_plain_files_take_the_umask_mode(tmp_path, process_umask):
    want = 0o666 & ~process_umask
    p = np.array([3, 5, 7])
    CostIndex(np.array([1, 2, 3]), {"vision": (np.ones(3, int), p, p * p, ResizeRule())}).save(tmp_path / "costs.npz")
    CostModel().to_file(tmp_path / "cost.json")
    atomic_write(tmp_path / "plain.bin", b"x")
    for name in ("costs.npz", "cost.json", "plain.bin"):
        assert _mode(tmp_path / name) == want, f"{name}: {oct(_mode(tmp_path / name))}, want {oct(want)}"
    # rewriting keeps the mode (the file is replaced, not opened in place)
    CostModel(a=2.0).to_file(tmp_path / "cost.json")
    assert _mode(tmp_path / "cost.json") == want


def test_the_derived_index_cache_takes_the_umask_mode(tmp_path, process_umask):
    ds = st.images_dataset(tmp_path / "images", 6, seq_length=64, image_rows=4)
    cache = tmp_path / "cache"
    shared_index.derive_cost_index(ds, cache_dir=cache)
    files = sorted(cache.iterdir())
    assert {f.suffix for f in files} == {".npz", ".json"}
    for f in files:
        assert _mode(f) == 0o666 & ~process_umask, f"{f.name}: {oct(_mode(f))}"

