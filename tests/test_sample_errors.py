"""A sample that fails to load names its index and its file.

Bridge's ``MegatronMIMODataset`` hands the example row's image path to the HF processor, which
decodes it; a truncated JPEG then stopped the job with PIL's bare ``OSError: image file is
truncated`` — no sample index, no file. The sharded loader reads samples through
``runtime.sampler.ReadsOf``, which now raises ``SampleLoadError`` naming both (the original error
is its cause), in the main process and through DataLoader workers alike.
"""

from __future__ import annotations

import os
import re
import traceback

import pytest
from torch.utils.data import DataLoader

from mimo_accel_dev.rehearse import stack as st
from mimo_accel.runtime.reading.sampler import ReadsOf, SamplesRead, ShardedBatchSampler, tagged_loader
from mimo_accel.runtime.context import ShardContext

N = 8


@pytest.fixture(scope="module")
def truncated(tmp_path_factory):
    """Bridge's MegatronMIMODataset over real image files (Qwen2-VL's image processor), one of
    whose JPEGs is cut to half its bytes, as an interrupted copy leaves it; -> (dataset, index)."""
    root = tmp_path_factory.mktemp("images")
    ds = st.images_dataset(root, N, seq_length=64, image_rows=4)
    jpegs = [i for i, ex in enumerate(ds.examples) if (ex.get("image") or "").endswith(".jpg")]
    bad = jpegs[len(jpegs) // 2]
    path = ds.examples[bad]["image"]
    data = open(path, "rb").read()
    with open(path, "r+b") as f:
        f.truncate(len(data) // 2)
    return ds, bad


def test_upstream_error_names_neither_sample_nor_file(truncated):
    ds, bad = truncated
    with pytest.raises(OSError, match="truncated") as err:
        ds[bad]
    assert str(bad) not in str(err.value) and "jpg" not in str(err.value)


def test_a_truncated_jpeg_names_its_sample_and_file(truncated):
    ds, bad = truncated
    reads = ReadsOf(ds)
    good = [i for i in range(N) if i != bad][:2]
    read = reads.__getitems__(good)  # upstream's plain batch of indices: read as a share without a plan
    assert isinstance(read, SamplesRead) and len(read.samples) == 2 and read.share.indices == tuple(good)
    path = ds.examples[bad]["image"]
    for read in (lambda: reads.__getitems__([good[0], bad]), lambda: reads[bad]):
        with pytest.raises(RuntimeError, match=rf"sample {bad} of \w*MIMODataset \(file {re.escape(path)}\) "
                                               r"failed to load: OSError: image file is truncated") as err:
            read()
        assert err.value.index == bad and err.value.files == (path,)
        assert isinstance(err.value.__cause__, OSError)


@pytest.mark.parametrize("workers", [0, 1])
def test_the_sharded_loader_names_them_through_its_workers(truncated, workers):
    ds, bad = truncated
    ctx = ShardContext("vision", 0, 1, 1, {"vision": 1, "language": 1})
    upstream = DataLoader(ds, batch_size=2, num_workers=workers, collate_fn=lambda s: {"n": len(s)})
    sampler = ShardedBatchSampler([[i, i + 1] for i in range(0, N, 2)], ctx)
    loader = tagged_loader(upstream, ctx, sampler)
    with pytest.raises(RuntimeError, match=rf"sample {bad} of \w+ \(file {re.escape(ds.examples[bad]['image'])}\)") as err:
        for _ in loader:
            pass
    # torch re-raises a worker's error from a frame that holds it: a cycle through the loader's
    # iterator. Left to the cyclic GC, the iterator's queues close before its workers are told to
    # stop, and its __del__ then waits 5 s on each worker, in whichever later test the GC runs.
    traceback.clear_frames(err.tb)


def test_a_dataset_without_examples_still_names_the_index():
    class Broken:
        def __len__(self):
            return 4

        def __getitem__(self, i):
            if i == 2:
                raise ValueError("bad bytes")
            return i

    with pytest.raises(RuntimeError, match=r"sample 2 of Broken failed to load: ValueError: bad bytes"):
        ReadsOf(Broken()).__getitems__([1, 2])
    with pytest.raises(IndexError):  # out of range stays IndexError (the iteration protocol)
        ReadsOf([1])[5]
