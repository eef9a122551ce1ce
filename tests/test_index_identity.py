"""A cost index knows what it describes: an index for another dataset, another split or another
length is refused naming both sides; a derived index follows its files (one re-exported in place is
probed again); a configured file that differs from the index a dataset carries is said.

Real Bridge MegatronMIMODatasets over real image files, read by a real Qwen2-VL image processor.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from mimo_accel.config import AccelConfig
from mimo_accel.datasets import derive_cost_index
from mimo_accel.datasets.split_index import cost_index_for
from mimo_accel.runtime.state import Runtime
from tests.test_derive import mimo_dataset, qwen_processor, write_image


def _examples(root, heights):
    root.mkdir(parents=True, exist_ok=True)
    return [{"image": str(write_image(root / f"{i}.png", 56, h)), "text": "describe " * (i + 1)}
            for i, h in enumerate(heights)]


def _index_file(tmp_path, dataset, name="costs.npz", split="train"):
    path = tmp_path / name
    derive_cost_index(dataset, cache_dir=False).with_identity(split=split).save(path)
    return str(path)


def test_an_index_of_another_dataset_of_the_same_length_is_refused_naming_both(tmp_path):
    a = mimo_dataset(_examples(tmp_path / "a", [56, 112, 224, 56]), qwen_processor())
    b = mimo_dataset(_examples(tmp_path / "b", [448, 56, 56, 112]), qwen_processor())
    path = _index_file(tmp_path, a)
    assert len(cost_index_for(a, path, "train")) == len(a)  # its own dataset: accepted
    with pytest.raises(ValueError, match=r"describes another dataset: its dataset fingerprint \w{16} .*this "
                                         r"train dataset's \w{16} .*mimo-accel index --dataset"):
        cost_index_for(b, path, "train")


def test_an_index_longer_or_shorter_than_the_dataset_is_refused(tmp_path):
    short = mimo_dataset(_examples(tmp_path / "s", [56, 112, 224]), qwen_processor())
    long = mimo_dataset(_examples(tmp_path / "l", [56, 112, 224, 56, 112]), qwen_processor())
    path = _index_file(tmp_path, long)
    with pytest.raises(ValueError, match="covers 5 samples but the train dataset has 3"):
        cost_index_for(short, path, "train")


def test_an_index_of_another_split_is_refused(tmp_path):
    ds = mimo_dataset(_examples(tmp_path / "v", [56, 112, 224, 56]), qwen_processor())
    template = str(tmp_path / "costs-{split}.npz")
    _index_file(tmp_path, ds, "costs-validation.npz", split="train")  # built with the wrong --split
    with pytest.raises(ValueError, match=r"built for the train split, but the validation loader plans from it.*\{split\}"):
        cost_index_for(ds, template, "validation")


def test_a_file_rewritten_in_place_is_probed_again(tmp_path):
    """The issue's case: derive the costs into the cache, overwrite one image in place with a
    larger one; the next derive reads the new size (the processor's), not the cached one."""
    examples = _examples(tmp_path / "img", [56, 56, 56, 56])
    cache = tmp_path / "cache"
    before = derive_cost_index(mimo_dataset(examples, qwen_processor()), cache_dir=cache)
    again = derive_cost_index(mimo_dataset(examples, qwen_processor()), cache_dir=cache)  # from the cache
    assert again.digest() == before.digest() and len(list(cache.glob("*.npz"))) == 1
    target = examples[2]["image"]
    mtime = os.stat(target).st_mtime_ns
    write_image(__import__("pathlib").Path(target), 56, 560)  # re-exported in place, ten times taller
    os.utime(target, ns=(mtime + 1, mtime + 1))  # a distinct modification time even on a coarse clock
    after = derive_cost_index(mimo_dataset(examples, qwen_processor()), cache_dir=cache)
    rows = after.rows("vision", np.arange(4)).tolist()
    was = before.rows("vision", np.arange(4)).tolist()
    assert rows[2] > was[2] and rows[:2] + rows[3:] == was[:2] + was[3:]
    ds = mimo_dataset(examples, qwen_processor())
    item = ds[2]["modality_inputs"]["vision"]
    assert rows[2] == int(item["image_grid_thw"].prod())  # what the processor gives
    # and an index file built before the rewrite describes other files now: refused
    old = tmp_path / "old.npz"
    before.with_identity(split="train").save(old)
    with pytest.raises(ValueError, match=r"its files \(sizes and modification times\)"):
        cost_index_for(ds, str(old), "train")


def test_a_file_that_differs_from_the_dataset_s_own_index_is_said(tmp_path):
    ds = mimo_dataset(_examples(tmp_path / "c", [56, 112, 224, 56]), qwen_processor())
    path = _index_file(tmp_path, ds)
    other = derive_cost_index(mimo_dataset(_examples(tmp_path / "d", [112, 112, 56, 448]), qwen_processor()),
                              cache_dir=False)
    ds.mimo_accel_cost_index = other  # the dataset carries another index
    runtime = Runtime(AccelConfig(reorder=True))
    index = cost_index_for(ds, path, "train", notify=runtime.say_once)
    assert index.digest() != other.digest()
    notes = list(runtime.notices().values())
    assert any("carries its own cost index" in n and "planning from the configured file" in n for n in notes)
