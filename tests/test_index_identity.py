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
from mimo_accel.costs import CostIndex
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
    with pytest.raises(ValueError, match=r"describes another dataset: its files \(names, sizes, first bytes\) \w{16} "
                                         r".*this train dataset's \w{16} .*mimo-accel index --dataset"):
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
    with pytest.raises(ValueError, match=r"its files \(names, sizes, first bytes\)"):
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


# ----------------------------------------------------------------------------------------------
# What is compared: the files by name, size and first bytes, wherever they lie
# ----------------------------------------------------------------------------------------------


QWEN2_RULE = ["--patch-size", "14", "--min-pixels", str(56 * 56), "--max-pixels", str(28 * 28 * 1280)]  # qwen_processor()'s


def _manifest_index(tmp_path, examples, name="manifest.jsonl", rule=QWEN2_RULE):
    """``mimo-accel index MANIFEST`` over the examples' image files (relative to the manifest), with
    the resize rule ``rule`` gives (options)."""
    import json
    from pathlib import Path

    from mimo_accel.tools import indexing

    manifest = tmp_path / name
    lines = [{"images": [os.path.relpath(e["image"], tmp_path)], "text": e["text"]} for e in examples]
    manifest.write_text("".join(json.dumps(line) + "\n" for line in lines))
    out = tmp_path / (name + ".npz")
    assert indexing.main([str(manifest), *rule, "--out", str(out)]) == 0
    return str(out), Path(manifest)


def _copied(examples, root):
    """The examples over copies of their images in ``root``, as ``cp`` without ``-p`` makes them
    (new modification times), each one second newer than its original."""
    import shutil

    root.mkdir(parents=True)
    out = []
    for e in examples:
        copy = shutil.copy(e["image"], root / os.path.basename(e["image"]))
        t = os.stat(e["image"]).st_mtime_ns + 10**9
        os.utime(copy, ns=(t, t))
        out.append({**e, "image": str(copy)})
    return out


def _notices(runtime):
    return list(runtime.notices().values())


def test_a_manifest_index_of_another_dataset_of_the_same_length_is_refused(tmp_path, capsys):
    a = _examples(tmp_path / "a", [56, 112, 224, 56])
    b = mimo_dataset(_examples(tmp_path / "b", [448, 56, 56, 112]), qwen_processor())
    path, _ = _manifest_index(tmp_path, a)
    with pytest.raises(ValueError, match=r"describes another dataset: its files \(names, sizes, first bytes\) \w{16} "
                                         r"\(4 files; manifest manifest.jsonl\), this train dataset's \w{16} \(4 files; "
                                         r"MegatronMIMODataset of 4 samples\); .*`mimo-accel index MANIFEST --processor "
                                         r"PROCESSOR --split train --out "):
        cost_index_for(b, path, "train")


def test_a_manifest_index_of_the_dataset_s_own_files_is_checked_and_accepted(tmp_path, capsys):
    examples = _examples(tmp_path / "a", [56, 112, 224, 56])
    ds = mimo_dataset(examples, qwen_processor())
    path, _ = _manifest_index(tmp_path, examples)
    runtime = Runtime(AccelConfig(reorder=True))
    index = cost_index_for(ds, path, "train", notify=runtime.say_once)
    assert _notices(runtime) == []  # checked: nothing to say
    every = np.arange(len(ds))
    derived = derive_cost_index(ds, cache_dir=False)
    assert index.rows("vision", every).tolist() == derived.rows("vision", every).tolist()
    assert index.identity["contents"] == derived.identity["contents"]  # one digest, built both ways


def test_the_same_files_copied_elsewhere_are_accepted(tmp_path, capsys):
    examples = _examples(tmp_path / "a", [56, 112, 224, 56])
    built = _index_file(tmp_path, mimo_dataset(examples, qwen_processor()))
    from_manifest, _ = _manifest_index(tmp_path, examples)
    copies = _copied(examples, tmp_path / "scratch" / "node0")
    assert all(os.stat(c["image"]).st_mtime_ns != os.stat(e["image"]).st_mtime_ns for c, e in zip(copies, examples))
    ds = mimo_dataset(copies, qwen_processor())
    for path in (built, from_manifest):
        runtime = Runtime(AccelConfig(reorder=True))
        assert len(cost_index_for(ds, path, "train", notify=runtime.say_once)) == len(ds)
        assert _notices(runtime) == []
    # and the copy's derived index finds the original's cache
    cache = tmp_path / "cache"
    derive_cost_index(mimo_dataset(examples, qwen_processor()), cache_dir=cache)
    assert derive_cost_index(ds, cache_dir=cache).mapped and len(list(cache.glob("*.npz"))) == 1


def test_the_same_files_with_other_texts_or_settings_are_another_dataset(tmp_path):
    examples = _examples(tmp_path / "a", [56, 112, 224, 56])
    path = _index_file(tmp_path, mimo_dataset(examples, qwen_processor()))
    other = mimo_dataset([{**e, "text": "another caption"} for e in examples], qwen_processor())
    with pytest.raises(ValueError, match=r"describes another dataset: its texts \w{16} \(4 texts; MegatronMIMODataset of "
                                         r"4 samples\), this train dataset's \w{16} \(4 texts; .*its token counts are "
                                         r"the other texts'"):
        cost_index_for(other, path, "train")
    longer = mimo_dataset(examples, qwen_processor(), seq_length=65)  # the same rows, cut elsewhere
    with pytest.raises(ValueError, match=r"its files are this one's but its dataset fingerprint \(every row's cost "
                                         r"inputs, tokenizer, processors\) \w{16} .*this train dataset's \w{16}"):
        cost_index_for(longer, path, "train")


def test_a_manifest_index_refuses_an_edited_text_as_it_refuses_an_edited_image(tmp_path):
    """The issue's case: the manifest index digested its image files only, so a dataset whose
    text was edited after indexing passed the check with the old token counts."""
    examples = _examples(tmp_path / "a", [56, 112, 224, 56])
    path, _ = _manifest_index(tmp_path, examples)
    runtime = Runtime(AccelConfig(reorder=True))
    assert len(cost_index_for(mimo_dataset(examples, qwen_processor()), path, "train", notify=runtime.say_once)) == 4
    assert _notices(runtime) == []  # files, rule and texts all checked
    edited = [dict(e) for e in examples]
    edited[2]["text"] = "describe " * 200
    with pytest.raises(ValueError, match=r"describes another dataset: its texts \w{16} \(4 texts; manifest "
                                         r"manifest.jsonl\), this train dataset's \w{16} \(4 texts; MegatronMIMODataset "
                                         r"of 4 samples\)"):
        cost_index_for(mimo_dataset(edited, qwen_processor()), path, "train")


def test_a_manifest_of_token_counts_is_checked_without_its_texts_said_once(tmp_path):
    import json

    from mimo_accel.tools import indexing

    examples = _examples(tmp_path / "a", [56, 112, 224, 56])
    manifest = tmp_path / "counts.jsonl"
    manifest.write_text("".join(json.dumps({"images": [os.path.relpath(e["image"], tmp_path)], "tokens": 9}) + "\n"
                                for e in examples))
    out = tmp_path / "counts.npz"
    assert indexing.main([str(manifest), *QWEN2_RULE, "--out", str(out)]) == 0
    runtime = Runtime(AccelConfig(reorder=True))
    for _ in range(2):
        assert len(cost_index_for(mimo_dataset(examples, qwen_processor()), str(out), "train",
                                  notify=runtime.say_once)) == 4
    (note,) = _notices(runtime)
    assert "records no digest of its texts" in note and "give each line's \"text\" too" in note


def test_an_index_fingerprinted_by_an_older_scheme_is_checked_by_what_it_shares_said_once(tmp_path):
    examples = _examples(tmp_path / "a", [56, 112, 224, 56])
    ds = mimo_dataset(examples, qwen_processor())
    index = derive_cost_index(ds, cache_dir=False)
    old = tmp_path / "old.npz"
    # as an older mimo_accel wrote it: its dataset fingerprinted by sampled rows, no texts recorded
    index.with_identity(format=None, texts=None, dataset="ab" * 32, split="train").save(old)
    runtime = Runtime(AccelConfig(reorder=True))
    assert cost_index_for(ds, str(old), "train", notify=runtime.say_once).digest() == index.digest()
    (note,) = _notices(runtime)
    assert "fingerprints its dataset's rows as another mimo_accel did (an older scheme" in note
    assert "its files and resize rule were checked against the train dataset, its rows' other inputs" in note


def test_one_file_re_exported_at_another_size_is_another_dataset_and_a_missing_one_is_named(tmp_path):
    examples = _examples(tmp_path / "a", [56, 112, 224, 56])
    path, _ = _manifest_index(tmp_path, examples)
    write_image(__import__("pathlib").Path(examples[1]["image"]), 56, 140)
    with pytest.raises(ValueError, match="describes another dataset: its files"):
        cost_index_for(mimo_dataset(examples, qwen_processor()), path, "train")
    os.remove(examples[2]["image"])
    with pytest.raises(ValueError, match=r"\(4 files, 1 unreadable: .*2\.png: No such file or directory; "):
        cost_index_for(mimo_dataset(examples, qwen_processor()), path, "train")


def test_an_index_recording_no_files_is_checked_by_its_length_alone_said_once(tmp_path):
    """An index whose identity holds no contents digest (built by hand) is used; the notice says
    once that only its length was checked."""
    examples = _examples(tmp_path / "a", [56, 112, 224, 56])
    ds = mimo_dataset(examples, qwen_processor())
    index = derive_cost_index(ds, cache_dir=False)
    old = tmp_path / "old.npz"
    every = np.arange(len(index))
    by_hand = CostIndex(index.tokens(every), {"vision": index.encoder("vision")})
    by_hand.with_identity(dataset="ab" * 32, split="train", describe="by hand").save(old)
    runtime = Runtime(AccelConfig(reorder=True))
    for _ in range(2):
        assert cost_index_for(ds, str(old), "train", notify=runtime.say_once).digest() == index.digest()
    (note,) = _notices(runtime)
    assert "records no fingerprint of its files" in note and "only its length and resize rule could be checked" in note


def test_an_index_file_keeps_the_contents_digest_in_its_header(tmp_path):
    from mimo_accel.costs import CostIndex
    from mimo_accel.costs.contents import SCHEME

    examples = _examples(tmp_path / "a", [56, 112])
    path = _index_file(tmp_path, mimo_dataset(examples, qwen_processor()))
    loaded = CostIndex.load(path)
    assert loaded.mapped and loaded.identity["contents"]["scheme"] == SCHEME
    assert loaded.identity["contents"]["files"] == 2 and len(loaded.identity["contents"]["digest"]) == 64


def test_the_contents_digest_adds_up_over_shares_and_follows_positions(tmp_path):
    from mimo_accel.costs.contents import Contents, file_stamps

    paths = [str(write_image(tmp_path / f"{i}.png", 56, 28 * (i + 1))) for i in range(6)]
    stamps = file_stamps(paths)
    whole = Contents()
    for i, (p, s) in enumerate(zip(paths, stamps)):
        whole.add(i, [p], [s])
    for cut in (0, 2, 5):
        left, right = Contents(), Contents()
        for i, (p, s) in enumerate(zip(paths, stamps)):
            (left if i < cut else right).add(i, [p], [s])
        assert (left + right).digest == whole.digest and (left + right).files == 6
    swapped = Contents()
    for i, (p, s) in enumerate(zip(paths[::-1], stamps[::-1])):
        swapped.add(i, [p], [s])
    assert swapped.digest != whole.digest  # the same files in another order are another index
    assert Contents.from_record(whole.record()).digest == whole.digest
    assert Contents.from_record({**whole.record(), "scheme": "mimo-accel-contents/0"}) is None


# ----------------------------------------------------------------------------------------------
# Two gloo ranks: each reads its share's files; both check alike
# ----------------------------------------------------------------------------------------------


def _two_ranks_check(rank, world, root):
    from pathlib import Path

    from mimo_accel.runtime.store import RankSet

    root = Path(root)
    group = RankSet(range(world))  # the data-loading ranks, gathering through the job's store
    mine = [{"image": str(root / "copy" / f"{i}.png"), "text": "describe " * (i + 1)} for i in range(5)]
    ds = mimo_dataset(mine, qwen_processor())
    accepted = len(cost_index_for(ds, str(root / "manifest.jsonl.npz"), "train", group=group))
    other = mimo_dataset([{**e, "image": str(root / "b" / os.path.basename(e["image"]))} for e in mine],
                         qwen_processor())
    try:
        cost_index_for(other, str(root / "manifest.jsonl.npz"), "train", group=group)
        refused = None
    except ValueError as exc:
        refused = str(exc)
    return {"accepted": accepted, "refused": refused}


@pytest.mark.distributed
def test_two_ranks_accept_the_copied_files_and_refuse_others_alike(tmp_path):
    from mimo_accel_dev.rehearse.ranks import run_ranks

    heights = [56, 112, 224, 56, 448]
    examples = _examples(tmp_path / "a", heights)
    _manifest_index(tmp_path, examples)
    _copied(examples, tmp_path / "copy")
    _examples(tmp_path / "b", heights[::-1])
    results = run_ranks(_two_ranks_check, 2, str(tmp_path), cpu_layer=False, deadline_s=200)
    assert [r["accepted"] for r in results] == [5, 5]
    refused = {r["refused"] for r in results}
    assert len(refused) == 1 and "describes another dataset: its files" in refused.pop()
