"""Empty inputs are named before the job, by what they are: a modality cell holding an empty list
(Bridge's MegatronMIMODataset hands it to the processor, which fails with numpy's "need at least
one array to concatenate", naming neither sample nor file) and an empty file (its decoder says only
that it cannot identify it).

Real Bridge MegatronMIMODatasets over real image files, read by a real Qwen2-VL image processor.
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from mimo_accel.datasets import derive_cost_index
from mimo_accel.datasets.sources import SampleError
from mimo_accel.datasets.split_index import cost_index_for
from mimo_accel.runtime.reading.sampler import ReadsOf, SampleLoadError
from mimo_accel.tools import indexing
from tests.test_derive import mimo_dataset, qwen_processor, write_image
from tests.test_index_identity import QWEN2_RULE

EMPTY_LIST = (r"sample 2 \(id 'rec-2'\), column 'image': an empty list; Bridge's MegatronMIMODataset hands it to the "
              r"processor, which fails \(\"need at least one array to concatenate\"\). Give None, or leave the "
              r"column out, for a sample without one")


def _examples(root, image_of_2):
    root.mkdir(exist_ok=True)
    rows = [{"id": f"rec-{i}", "image": str(write_image(root / f"{i}.png", 56, 28 * (i + 2))), "text": "describe the cat"}
            for i in range(4)]
    rows[2]["image"] = image_of_2
    return rows


FACTORY = '''
import json
from pathlib import Path
from tests.test_derive import mimo_dataset, qwen_processor

def build():
    return mimo_dataset(json.loads((Path(__file__).parent / "rows.json").read_text()), qwen_processor())
'''


def test_upstream_fails_on_an_empty_list_naming_nothing(tmp_path):
    ds = mimo_dataset(_examples(tmp_path / "img", []), qwen_processor())
    with pytest.raises(ValueError, match="^need at least one array to concatenate$"):
        ds[2]


def test_an_empty_image_list_is_named_when_the_costs_are_derived(tmp_path):
    ds = mimo_dataset(_examples(tmp_path / "img", []), qwen_processor())
    with pytest.raises(SampleError, match=EMPTY_LIST):
        derive_cost_index(ds, cache_dir=False)
    # None is a sample without an image: derived
    index = derive_cost_index(mimo_dataset(_examples(tmp_path / "img", None), qwen_processor()), cache_dir=False)
    assert index.items("vision", np.arange(4)).tolist() == [1, 1, 0, 1]


def test_an_empty_image_list_is_named_when_an_index_file_is_checked(tmp_path):
    path = tmp_path / "costs.npz"
    rows = _examples(tmp_path / "img", None)
    derive_cost_index(mimo_dataset(rows, qwen_processor()), cache_dir=False).with_identity(split="train").save(path)
    with pytest.raises(SampleError, match=EMPTY_LIST):  # refused, not passed with a notice
        cost_index_for(mimo_dataset(_examples(tmp_path / "img", []), qwen_processor()), str(path), "train")


def test_index_and_verify_name_the_empty_list(tmp_path, capsys):
    (tmp_path / "rows.json").write_text(json.dumps(_examples(tmp_path / "img", [])))
    (tmp_path / "train_rows.py").write_text(FACTORY)
    spec = f"{tmp_path / 'train_rows.py'}:build"
    assert indexing.main(["--dataset", spec, "--cache-dir", str(tmp_path / "cache")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("mimo-accel index: error: ") and err.count("\n") == 1
    assert "sample 2 (id 'rec-2'), column 'image': an empty list" in err
    assert indexing.main(["--dataset", spec, "--verify", "--cache-dir", str(tmp_path / "cache")]) == 2
    captured = capsys.readouterr()
    assert captured.out.splitlines()[0].startswith("sample 2 (id 'rec-2'), column 'image': an empty list; ")
    assert captured.err == ("mimo-accel index: error: 1 sample cannot be loaded (listed above): fix or drop them and "
                            "index again; nothing was written\n")
    assert not (tmp_path / "cache").exists()


EMPTY_FILE = "the file is empty (0 bytes): copy or export it again, or drop the sample"


def test_an_empty_image_file_is_called_empty(tmp_path, capsys):
    rows = _examples(tmp_path / "img", None)
    empty = tmp_path / "img" / "2.png"
    empty.write_bytes(b"")
    rows[2]["image"] = str(empty)
    # deriving
    with pytest.raises(ValueError, match=rf"sample 2, column 'image': cannot read the image size: .*2\.png: "
                                         rf"{re.escape(EMPTY_FILE)}"):
        derive_cost_index(mimo_dataset(rows, qwen_processor()), cache_dir=False)
    # a manifest, and --verify
    manifest = tmp_path / "m.jsonl"
    manifest.write_text("".join(json.dumps({"images": [r["image"]], "text": r["text"]}) + "\n" for r in rows))
    assert indexing.main([str(manifest), *QWEN2_RULE, "--out", str(tmp_path / "m.npz")]) == 2
    assert f"m.jsonl:3: cannot read the image size: {empty}: {EMPTY_FILE}" in capsys.readouterr().err
    assert indexing.main([str(manifest), *QWEN2_RULE, "--verify", "--out", str(tmp_path / "m.npz")]) == 2
    assert capsys.readouterr().out.splitlines() == [f"{manifest}:3: {empty}: {EMPTY_FILE}"]
    # and while training: the loader's error names the file as empty
    with pytest.raises(SampleLoadError, match=rf"sample 2 of MegatronMIMODataset \(file {empty}, empty: 0 bytes\) "
                                              r"failed to load"):
        ReadsOf(mimo_dataset(rows, qwen_processor()))[2]


def test_an_empty_audio_file_is_called_empty(tmp_path):
    from mimo_accel.costs.audio import AudioSizeError, audio_samples_of
    from mimo_accel.tools.decode_check import decode_error

    clip = tmp_path / "clip.wav"
    clip.write_bytes(b"")
    with pytest.raises(AudioSizeError, match=re.escape(f"sample 1: {clip}: {EMPTY_FILE}")):
        audio_samples_of(str(clip), 16000, "sample 1")
    assert decode_error(str(clip), "audio") == EMPTY_FILE
