"""A cost index knows its processor: one built with another resize rule than the dataset's
processor gives is refused, naming both rules and the command that rebuilds it; `mimo-accel index
--processor` reads the rule from the processor itself, and a manifest with images has no default
rule to fall back on.

Real Bridge MegatronMIMODatasets over real image files, read by a real Qwen2-VL image processor
(patch 16, as Qwen3-VL and Qwen3.5-VL configure it), saved with save_pretrained and loaded back by
transformers' AutoImageProcessor.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from mimo_accel.costs import CostIndex, ResizeRule
from mimo_accel.datasets import derive_cost_index
from mimo_accel.datasets.split_index import cost_index_for
from mimo_accel.tools import indexing
from tests.test_derive import mimo_dataset, qwen_processor, write_image
from tests.test_index_identity import QWEN2_RULE, _manifest_index

# The six images, (height, width), and what each rule makes of them.
SIZES = [(224, 224), (336, 448), (112, 112), (840, 1148), (56, 56), (300, 300)]
PATCH14_ROWS = [256, 768, 64, 4920, 16, 484]  # Qwen2-VL's rule: patch 14, pixels [3,136, 1,003,520]
PATCH16_ROWS = [256, 560, 256, 936, 256, 324]  # patch 16, pixels [65,536, 262,144]
PATCH16 = ["--patch-size", "16", "--merge-size", "2", "--min-pixels", "65536", "--max-pixels", "262144"]


def _patch16():
    return qwen_processor(min_pixels=65536, max_pixels=262144, patch_size=16)


def _examples(root):
    root.mkdir(parents=True, exist_ok=True)
    return [{"image": str(write_image(root / f"{i}.png", w, h)), "text": "describe " * (i + 1)}
            for i, (h, w) in enumerate(SIZES)]


def _rows(index):
    return index.rows("vision", np.arange(len(index))).tolist()


def test_a_manifest_index_of_another_rule_is_refused_naming_both_rules_and_the_rebuild(tmp_path):
    examples = _examples(tmp_path / "img")
    ds = mimo_dataset(examples, _patch16())
    assert [int(ds[i]["modality_inputs"]["vision"]["image_grid_thw"].prod()) for i in range(6)] == PATCH16_ROWS
    path, manifest = _manifest_index(tmp_path, examples, rule=QWEN2_RULE)  # the same files, Qwen2-VL's rule
    assert _rows(CostIndex.load(path)) == PATCH14_ROWS
    with pytest.raises(ValueError) as err:
        cost_index_for(ds, path, "train")
    message = str(err.value)
    assert (f"the cost index {path} was built with another resize rule than the train dataset's processor: its "
            "'vision' rows follow patch 14, merge 2, pixels [3,136, 1,003,520]; the processor of 'vision' gives "
            "patch 16, merge 2, pixels [65,536, 262,144]") in message
    assert ("`mimo-accel index MANIFEST --patch-size 16 --merge-size 2 --min-pixels 65536 --max-pixels 262144 --split "
            f"train --out {path}`, or `--processor PROCESSOR`") in message
    # rebuilt as the message says: accepted, and its rows are the processor's
    rebuilt, _ = _manifest_index(tmp_path, examples, name="again.jsonl", rule=PATCH16)
    assert _rows(cost_index_for(ds, rebuilt, "train")) == PATCH16_ROWS


def test_the_index_takes_the_rule_from_a_saved_processor(tmp_path, capsys):
    examples = _examples(tmp_path / "img")
    processor = tmp_path / "qwen3-vl-like"
    _patch16().save_pretrained(processor)
    path, _ = _manifest_index(tmp_path, examples, rule=["--processor", str(processor)])
    index = CostIndex.load(path)
    assert index.rule_of("vision") == ResizeRule(patch_size=16, min_pixels=65536, max_pixels=262144)
    assert _rows(cost_index_for(mimo_dataset(examples, _patch16()), path, "train")) == PATCH16_ROWS
    assert "patch 16, merge 2, pixels [65,536, 262,144]" in capsys.readouterr().out  # the summary says the rule
    # --max-pixels overrides the processor's bound, as a collate's max_pixels does
    _, _ = _manifest_index(tmp_path, examples, name="capped.jsonl",
                           rule=["--processor", str(processor), "--max-pixels", "131072"])
    capped = CostIndex.load(tmp_path / "capped.jsonl.npz")
    assert capped.rule_of("vision") == ResizeRule(patch_size=16, min_pixels=65536, max_pixels=131072)
    assert _rows(capped) != PATCH16_ROWS


def test_a_derived_index_of_another_processor_is_refused_naming_the_rules(tmp_path):
    examples = _examples(tmp_path / "img")
    path = tmp_path / "derived.npz"
    derive_cost_index(mimo_dataset(examples, qwen_processor()), cache_dir=False).with_identity(split="train").save(path)
    with pytest.raises(ValueError, match=r"its 'vision' rows follow patch 14, .* gives patch 16, .*rebuild it with "
                                         r"the processor's rule: `mimo-accel index --dataset MODULE:FACTORY --split "
                                         r"train --out "):
        cost_index_for(mimo_dataset(examples, _patch16()), str(path), "train")


def _one_error(capsys, argv) -> str:
    assert indexing.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("mimo-accel index: error: ") and err.count("\n") == 1
    return err


def test_a_manifest_with_images_needs_a_rule_and_one_without_does_not(tmp_path, capsys):
    write_image(tmp_path / "a.png", 64, 48)
    manifest = tmp_path / "m.jsonl"
    manifest.write_text(json.dumps({"tokens": 3}) + "\n" + json.dumps({"images": ["a.png"], "tokens": 5}) + "\n")
    err = _one_error(capsys, [str(manifest)])
    assert f"{manifest}:2: a sample with images, and no resize rule to price them" in err
    assert "--processor NAME_OR_PATH" in err and "--patch-size, --min-pixels and --max-pixels" in err
    err = _one_error(capsys, [str(manifest), "--patch-size", "16"])
    assert "--patch-size without --min-pixels and --max-pixels: give the whole rule" in err
    err = _one_error(capsys, [str(manifest), "--processor", str(tmp_path / "proc"), "--patch-size", "16"])
    assert "--patch-size: with --processor the patch, merge and temporal sizes are the processor's own" in err
    err = _one_error(capsys, [str(manifest), "--processor", str(tmp_path / "nowhere")])
    assert f"--processor {tmp_path / 'nowhere'}: no such directory" in err
    from transformers import CLIPImageProcessorPil

    CLIPImageProcessorPil().save_pretrained(tmp_path / "clip")
    err = _one_error(capsys, [str(manifest), "--processor", str(tmp_path / "clip")])
    assert "is not a Qwen-VL image processor" in err and "--dataset MODULE:NAME" in err
    # text only: no rule needed, and the summary says so
    texts = tmp_path / "texts.jsonl"
    texts.write_text(json.dumps({"tokens": 3}) + "\n" + json.dumps({"text": "abcdefgh"}) + "\n")
    assert indexing.main([str(texts), "--out", str(tmp_path / "t.npz")]) == 0
    assert "none needed: no items to price" in capsys.readouterr().out
    assert CostIndex.load(tmp_path / "t.npz").tokens(np.arange(2)).tolist() == [3, 2]
