"""`mimo-accel index`: cost index from a JSONL manifest (image headers only) or an in-memory dataset,
round trip through the .npz file, errors that name the manifest line, and the CLI entry point."""

from __future__ import annotations

import json
import re
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest

from mimo_accel.tools import index_builder, indexing
from mimo_accel.costs import CostIndex, ResizeRule, SampleShape


# ----------------------------------------------------------------------------------------------
# Minimal image files, written by hand (Pillow is not guaranteed)
# ----------------------------------------------------------------------------------------------


def _png(path: Path, height: int, width: int) -> Path:
    """A valid 8-bit grayscale PNG of height x width pixels."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    raw = b"".join(b"\x00" + bytes(width) for _ in range(height))  # filter byte + one row
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0))
                     + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))
    return path


def _jpeg(path: Path, height: int, width: int) -> Path:
    """A JPEG header chain (SOI, APP0/JFIF, DQT, SOF0, EOI): what a header reader walks."""
    app0 = b"JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00"
    dqt = b"\x00" + bytes(64)
    sof = struct.pack(">BHHB", 8, height, width, 1) + b"\x01\x11\x00"

    def seg(marker: int, body: bytes) -> bytes:
        return bytes([0xFF, marker]) + struct.pack(">H", len(body) + 2) + body

    path.write_bytes(b"\xff\xd8" + seg(0xE0, app0) + seg(0xDB, dqt) + seg(0xC0, sof) + b"\xff\xd9")
    return path


def _manifest(path: Path, lines) -> Path:
    path.write_text("".join((json.dumps(line) if not isinstance(line, str) else line) + "\n" for line in lines))
    return path


@pytest.fixture
def dataset_dir(tmp_path):
    imgs = tmp_path / "imgs"
    imgs.mkdir()
    _png(imgs / "a.png", 480, 640)
    _jpeg(imgs / "b.jpg", 1080, 1920)
    _png(imgs / "c.png", 30, 40)
    lines = [
        {"images": ["imgs/a.png"], "tokens": 100},
        {"images": ["imgs/b.jpg", "imgs/c.png"], "text": "x" * 10},
        {"tokens": 7},
        "",  # blank lines are skipped
        {"image_sizes": [[224, 224], [448, 112]], "tokens": 3},
        {"images": [], "text": ""},
    ]
    return _manifest(tmp_path / "train.jsonl", lines)


RULE = ResizeRule()  # Qwen2-VL's, the rule these tests price by (a manifest with images needs one)
RULE_ARGS = ["--patch-size", "14", "--min-pixels", "3136", "--max-pixels", "1003520"]  # the same on the command line

EXPECTED = [  # (image sizes, tokens) of the samples in dataset_dir
    ([(480, 640)], 100),
    ([(1080, 1920), (30, 40)], 3),  # ceil(10 / 4)
    ([], 7),
    ([(224, 224), (448, 112)], 3),
    ([], 0),
]


def _check(index: CostIndex, rule: ResizeRule, expected=EXPECTED):
    assert len(index) == len(expected)
    (module,) = index.encoders  # "vision" unless the index was built for another module name
    every = np.arange(len(expected))
    for i, (sizes, tokens) in enumerate(expected):
        p = [rule.patches(h, w) for h, w in sizes]
        assert index.rows(module, every)[i] == sum(p)
        assert index.sq_rows(module, every)[i] == sum(x * x for x in p)
        assert index.items(module, every)[i] == len(sizes)
        assert index.tokens(every)[i] == tokens


# ----------------------------------------------------------------------------------------------
# Library
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("rule", [ResizeRule(), ResizeRule(patch_size=16, min_pixels=65536, max_pixels=16777216)],
                         ids=["qwen2vl", "qwen3vl-like"])
def test_manifest_index_matches_the_resize_rule_on_header_sizes(dataset_dir, rule):
    _check(index_builder.build_index_from_manifest(dataset_dir, rule), rule)


def test_round_trip_through_the_saved_file(dataset_dir, tmp_path):
    rule = ResizeRule(patch_size=16)
    index = index_builder.build_index_from_manifest(dataset_dir, rule)
    out = index_builder.default_index_path(dataset_dir)
    assert out.name == "train.jsonl.mimo-cost-index.npz" and out.parent == dataset_dir.parent
    index.save(out)
    back = CostIndex.load(out)
    assert back.rule_of("vision") == rule
    _check(back, rule)


def test_parallel_header_reads_give_the_serial_result(tmp_path):
    rng = np.random.default_rng(0)
    lines, expected = [], []
    for i in range(150):
        h, w = (int(x) for x in rng.integers(20, 2000, size=2))
        make = _png if i % 2 else _jpeg
        make(tmp_path / f"{i}.img", h, w)
        # every third sample reuses an earlier file: read once, counted per use
        names = [f"{i}.img"] + ([f"{i - 1}.img"] if i % 3 == 0 and i else [])
        lines.append({"images": names, "tokens": i})
        expected.append(names)
    manifest = _manifest(tmp_path / "m.jsonl", lines)
    serial = index_builder.build_index_from_manifest(manifest, RULE, workers=1)
    parallel = index_builder.build_index_from_manifest(manifest, RULE, workers=8)
    every = np.arange(150)
    for what in ("rows", "sq_rows", "items"):
        assert np.array_equal(getattr(serial, what)("vision", every), getattr(parallel, what)("vision", every))
    assert np.array_equal(serial.tokens(every), parallel.tokens(every))
    assert parallel.items("vision", every).sum() == sum(len(n) for n in expected)


def test_the_manifest_is_indexed_chunk_by_chunk_with_the_same_result(tmp_path, monkeypatch):
    rng = np.random.default_rng(1)
    lines = []
    for i in range(25):
        if i % 3 == 0:
            _png(tmp_path / f"{i}.png", int(rng.integers(20, 900)), int(rng.integers(20, 900)))
            lines.append({"images": [f"{i}.png", "0.png"], "tokens": i})  # 0.png in every chunk
        elif i % 3 == 1:
            lines.append({"image_sizes": [[int(rng.integers(20, 3000)), int(rng.integers(20, 3000))]], "text": "x" * i})
        else:
            lines.append({"tokens": 3 * i})
    manifest = _manifest(tmp_path / "m.jsonl", lines[:10] + [""] + lines[10:])
    whole = index_builder.build_index_from_manifest(manifest, RULE)
    monkeypatch.setattr(index_builder, "CHUNK_LINES", 4)
    seen = []
    chunked = index_builder.build_index_from_manifest(manifest, RULE, on_progress=seen.append)
    assert chunked.digest() == whole.digest() and len(chunked) == 25
    every = np.arange(25)
    assert chunked.items("vision", every).tolist() == [(2, 1, 0)[i % 3] for i in range(25)]
    assert len(seen) == 7 and seen == sorted(seen) and seen[-1] == manifest.stat().st_size
    # a bad line in a later chunk is named by its own line number
    _manifest(manifest, lines[:22] + [{"images": ["gone.png"], "tokens": 1}])
    with pytest.raises(index_builder.ManifestError, match="m.jsonl:23: image not found"):
        index_builder.build_index_from_manifest(manifest, RULE, workers=2)


def test_dataset_index_from_shapes(tmp_path):
    rule = ResizeRule()
    shapes = [SampleShape(tuple(s), t) for s, t in EXPECTED]
    index = index_builder.build_index_from_dataset(list(range(len(shapes))), lambda i: shapes[i], rule)
    _check(index, rule)
    with pytest.raises(TypeError, match="must return a SampleShape"):
        index_builder.build_index_from_dataset([0], lambda i: ((1, 1), 3), rule)
    with pytest.raises(ValueError, match="sample 1: .*aspect ratio"):
        index_builder.build_index_from_dataset([0, 1], lambda i: SampleShape(((10, 10 + 5000 * i),), 1), rule)


def test_summary_counts():
    rule = ResizeRule()
    index = CostIndex.from_shapes([SampleShape(tuple(s), t) for s, t in EXPECTED], rule)
    s = index_builder.summarize(index)
    assert s["samples"] == 5 and s["images"] == 5 and s["text_only_samples"] == 2
    assert s["text_only_fraction"] == pytest.approx(0.4) and s["max_images_per_sample"] == 2
    per = sorted(sum(rule.patches(h, w) for h, w in sz) for sz, _ in EXPECTED if sz)
    assert s["patches_per_image_sample"]["max"] == per[-1]
    assert s["patches_per_image_sample"]["p50"] == pytest.approx(float(np.percentile(per, 50)))


def test_text_tokens_are_estimated_as_a_quarter_of_the_characters():
    assert [index_builder.estimate_tokens("x" * n) for n in (0, 1, 4, 5, 400)] == [0, 1, 1, 2, 100]


# ----------------------------------------------------------------------------------------------
# Errors name the manifest line
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("line, message", [
    ("{not json", "not valid JSON"),
    ("[1, 2]", "expected a JSON object"),
    ({"images": ["a.png"], "image_sizes": [[1, 1]], "tokens": 1}, "not both"),
    ({"images": "a.png", "tokens": 1}, "list of file paths"),
    ({"image_sizes": [[0, 5]], "tokens": 1}, "positive integers"),
    ({"image_sizes": [[5]], "tokens": 1}, "height, width"),
    ({"image_sizes": [[5, 5]]}, "needs \"tokens\""),
    ({"tokens": -1}, "non-negative integer"),
    ({"tokens": True}, "non-negative integer"),
    ({"text": 5}, "\"text\" must be a string"),
    ({"images": ["missing.png"], "tokens": 1}, "image not found: .*missing.png"),
    ({"images": ["junk.bin"], "tokens": 1}, "cannot read the image size"),
    ({"image_sizes": [[10, 5000]], "tokens": 1}, "aspect ratio"),
])
def test_bad_lines_are_named(tmp_path, line, message):
    (tmp_path / "junk.bin").write_bytes(b"\x00" * 64)
    _png(tmp_path / "ok.png", 10, 10)
    manifest = _manifest(tmp_path / "m.jsonl", [{"images": ["ok.png"], "tokens": 1}, {"tokens": 2}, "", line])
    with pytest.raises(index_builder.ManifestError, match=f"m.jsonl:4: .*{message}"):
        index_builder.build_index_from_manifest(manifest, RULE)


def test_missing_or_empty_manifest(tmp_path):
    with pytest.raises(index_builder.ManifestError, match="manifest not found"):
        index_builder.build_index_from_manifest(tmp_path / "nope.jsonl", RULE)
    with pytest.raises(index_builder.ManifestError, match="no samples"):
        index_builder.build_index_from_manifest(_manifest(tmp_path / "empty.jsonl", ["", "  "]), RULE)


def test_the_earliest_bad_line_is_reported_with_parallel_reads(tmp_path):
    lines = []
    for i in range(100):
        _png(tmp_path / f"{i}.png", 20 + i, 30)
        lines.append({"images": [f"{i}.png"], "tokens": 1})
    lines[40] = {"images": ["gone-40.png"], "tokens": 1}
    lines[70] = {"images": ["gone-70.png"], "tokens": 1}
    manifest = _manifest(tmp_path / "m.jsonl", lines)
    with pytest.raises(index_builder.ManifestError, match="m.jsonl:41: image not found"):
        index_builder.build_index_from_manifest(manifest, RULE, workers=8)


# ----------------------------------------------------------------------------------------------
# CLI
# ----------------------------------------------------------------------------------------------


def test_cli_writes_the_index_beside_the_manifest_and_prints_a_summary(dataset_dir, capsys):
    assert indexing.main([str(dataset_dir), *RULE_ARGS]) == 0
    out = dataset_dir.parent / "train.jsonl.mimo-cost-index.npz"
    _check(CostIndex.load(out), ResizeRule())
    text = capsys.readouterr().out
    assert "samples" in text and "text-only samples" in text and "40.0%" in text
    assert "p50" in text and "p90" in text and "time" in text


def test_cli_options_reach_the_rule_and_out_path(dataset_dir, tmp_path, capsys):
    out = tmp_path / "sub" / "idx.npz"
    out.parent.mkdir()  # an output's directory must exist (docs/usage.md)
    argv = [str(dataset_dir), "--out", str(out), "--patch-size", "16", "--merge-size", "2",
            "--min-pixels", "65536", "--max-pixels", "16777216", "--workers", "2"]
    assert indexing.main(argv) == 0
    rule = ResizeRule(patch_size=16, min_pixels=65536, max_pixels=16777216)
    index = CostIndex.load(out)
    assert index.rule_of("vision") == rule
    _check(index, rule)


def test_cli_errors_are_reported_with_an_exit_code(tmp_path, capsys):
    bad = _manifest(tmp_path / "bad.jsonl", [{"images": ["nowhere.png"], "tokens": 1}])
    assert indexing.main([str(bad), *RULE_ARGS]) == 2
    err = capsys.readouterr().err
    assert err.startswith("mimo-accel index: error: ") and err.count("\n") == 1
    assert "bad.jsonl:1" in err and "image not found" in err
    assert not index_builder.default_index_path(bad).exists()
    assert indexing.main([str(bad), "--min-pixels", "10", "--max-pixels", "5"]) == 2
    assert "--min-pixels 10 exceeds --max-pixels 5" in capsys.readouterr().err
    assert indexing.main([str(bad), "--workers", "0"]) == 2
    assert "argument --workers: must be a positive integer" in capsys.readouterr().err
    assert indexing.main(["--patch-size"]) == 2  # argparse usage error
    assert indexing.main(["--help"]) == 0


def test_pillow_written_files_agree_with_the_header_reader(tmp_path):
    from PIL import Image  # Pillow comes with matplotlib (a declared dependency)
    for fmt, ext in (("JPEG", "jpg"), ("PNG", "png"), ("WEBP", "webp"), ("GIF", "gif"), ("BMP", "bmp")):
        Image.new("RGB", (123, 45)).save(tmp_path / f"x.{ext}", fmt)
    manifest = _manifest(tmp_path / "m.jsonl", [{"images": [f"x.{e}"], "tokens": 1}
                                                for e in ("jpg", "png", "webp", "gif", "bmp")])
    rule = ResizeRule()
    index = index_builder.build_index_from_manifest(manifest, rule)
    assert index.rows("vision", np.arange(5)).tolist() == [rule.patches(45, 123)] * 5


# ----------------------------------------------------------------------------------------------
# CLI from the training dataset itself (--dataset): the cache a training job reads
# ----------------------------------------------------------------------------------------------

FACTORY = '''
from pathlib import Path
from tests.test_derive import all_kinds_of_examples, mimo_dataset, qwen_processor

ROOT = Path(__file__).parent / "images"

def build():
    return mimo_dataset(all_kinds_of_examples(ROOT, write=False), qwen_processor())

class Unknown:
    def __len__(self):
        return 1

unknown = Unknown()
'''


@pytest.fixture
def factory(tmp_path):
    from tests.test_derive import all_kinds_of_examples

    (tmp_path / "images").mkdir()
    all_kinds_of_examples(tmp_path / "images")
    path = tmp_path / "my_train.py"
    path.write_text(FACTORY)
    return path


def test_cli_builds_the_cache_the_training_job_reads(factory, tmp_path, capsys, monkeypatch):
    from mimo_accel.datasets import MimoDatasetSource, derive_cost_index

    monkeypatch.setenv("COLUMNS", "400")
    cache, out, log = tmp_path / "cache", tmp_path / "copy.npz", tmp_path / "index.log"
    argv = ["--dataset", f"{factory}:build", "--cache-dir", str(cache), "--out", str(out), "--log", str(log)]
    assert indexing.main(argv) == 0
    text = capsys.readouterr().out
    assert "MegatronMIMODataset of 11 samples" in text and "pixels [3,136, 1,003,520]" in text
    assert str(out) in text and str(cache) in text
    assert text.strip().splitlines()[-1] == f"third-party import output: {log}"  # the imports' noise went there
    assert log.read_text().startswith(f"mimo-accel index --dataset {factory}:build")

    # The training job, no index configured: the cache answers, nothing is probed.
    monkeypatch.setattr(MimoDatasetSource, "_probe_chunk", lambda *a: pytest.fail("probed again"))
    spec = indexing.load_dataset_spec(f"{factory}:build")
    index = derive_cost_index(spec, cache_dir=cache)
    assert index.digest() == CostIndex.load(out).digest()


def test_cli_dataset_errors(factory, dataset_dir, tmp_path, capsys, monkeypatch):
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the default --log
    assert indexing.main([]) == 2
    assert indexing.main([str(dataset_dir), "--dataset", f"{factory}:build"]) == 2
    assert "one of the two" in capsys.readouterr().err
    assert indexing.main(["--dataset", f"{factory}:build", "--patch-size", "16"]) == 2
    assert indexing.main(["--dataset", f"{factory}:build", "--module", "images"]) == 2
    assert "--patch-size applies to manifests only" in capsys.readouterr().err
    assert indexing.main([str(dataset_dir), "--cache-dir", str(tmp_path)]) == 2
    assert "--cache-dir and --refresh apply to --dataset only" in capsys.readouterr().err
    assert indexing.main(["--dataset", f"{factory}:unknown", "--cache-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("mimo-accel index: error: ") and err.count("\n") == 1
    assert "Unknown" in err and "Three ways out" in err
    assert indexing.main(["--dataset", f"{factory}:nothing"]) == 2
    assert "has no attribute 'nothing'" in capsys.readouterr().err
    assert indexing.main(["--dataset", "no_colon"]) == 2
    assert "expected MODULE:NAME" in capsys.readouterr().err


def test_module_names_the_encoder_and_the_file_is_v4(dataset_dir, tmp_path, capsys):
    import json

    out = tmp_path / "images.npz"
    assert indexing.main([str(dataset_dir), *RULE_ARGS, "--module", "images", "--out", str(out)]) == 0
    index = CostIndex.load(out)
    assert index.encoders == ("images",)
    assert json.loads(str(np.load(out)["header"]))["format"] == "mimo-accel-cost-index/4" and index.mapped
    _check(index, ResizeRule())
    assert "encoder module" in capsys.readouterr().out
    # the default is "vision"; "language" is not an encoder
    assert indexing.main([str(dataset_dir), *RULE_ARGS]) == 0
    assert CostIndex.load(dataset_dir.parent / "train.jsonl.mimo-cost-index.npz").encoders == ("vision",)
    assert indexing.main([str(dataset_dir), *RULE_ARGS, "--module", "language", "--out", str(out)]) == 2
    assert "language module" in capsys.readouterr().err


def test_summary_of_several_encoders(capsys):
    from rich.console import Console

    from mimo_accel.costs import AudioRule

    index = CostIndex([5, 6, 7], {"vision": ([1, 0, 2], [4, 0, 8], [16, 0, 32], ResizeRule()),
                                               "audio": ([1, 1, 0], [1500, 1500, 0], [1500 ** 2] * 2 + [0],
                                                         AudioRule(16000, 160, 480000, pad=True))})
    s = index_builder.summarize(index)
    assert "images" not in s and set(s["encoders"]) == {"vision", "audio"}
    assert s["encoders"]["audio"]["items"] == 2 and s["encoders"]["audio"]["samples_without"] == 1
    assert s["encoders"]["vision"]["rows_per_sample_with"]["max"] == 8
    console = Console(record=True, width=200)
    indexing._print_summary(console, s, "x.npz", 0.1, None)
    text = console.export_text()
    assert "audio: items" in text and "every clip padded to 30 s" in text and "vision: rule" in text


# ----------------------------------------------------------------------------------------------
# What the index records of its files, and --verify
# ----------------------------------------------------------------------------------------------


def _photo(path: Path, width: int = 96, height: int = 64) -> Path:
    """A real JPEG, Pillow-encoded from noise (so its scan data is long enough to cut short)."""
    from PIL import Image

    rng = np.random.default_rng(width * height)
    Image.fromarray(rng.integers(0, 255, (height, width, 3), dtype=np.uint8)).save(path, quality=95)
    return path


def _cut(path: Path, keep: float = 0.5) -> Path:
    """The file cut short after ``keep`` of its bytes: its header reads, its pixels do not decode."""
    data = path.read_bytes()
    path.write_bytes(data[:int(len(data) * keep)])
    return path


def test_the_index_records_its_files_by_name_size_and_first_bytes_wherever_they_lie(tmp_path):
    import os
    import shutil

    from mimo_accel.costs.contents import SCHEME

    (tmp_path / "a" / "imgs").mkdir(parents=True)
    for i in range(3):
        _photo(tmp_path / "a" / "imgs" / f"{i}.jpg", 96 + 32 * i)
    lines = [{"images": [f"imgs/{i}.jpg"], "tokens": 5} for i in range(3)] + [{"tokens": 3}]
    manifest = _manifest(tmp_path / "a" / "m.jsonl", lines)
    recorded = index_builder.build_index_from_manifest(manifest, RULE).identity["contents"]
    assert recorded["scheme"] == SCHEME and recorded["files"] == 3
    # cp -r without -p: new modification times, another directory; the same digest
    shutil.copytree(tmp_path / "a", tmp_path / "b", copy_function=shutil.copy)
    for f in (tmp_path / "b" / "imgs").iterdir():
        os.utime(f, ns=(1, 1))
    assert index_builder.build_index_from_manifest(tmp_path / "b" / "m.jsonl", RULE).identity["contents"] == recorded
    _photo(tmp_path / "b" / "imgs" / "1.jpg", 300)  # re-exported at another size
    assert index_builder.build_index_from_manifest(tmp_path / "b" / "m.jsonl", RULE).identity["contents"] != recorded
    swapped = _manifest(tmp_path / "a" / "swapped.jsonl", [lines[1], lines[0], *lines[2:]])
    assert index_builder.build_index_from_manifest(swapped, RULE).identity["contents"]["digest"] != recorded["digest"]
    # sizes given instead of files: nothing to compare with the dataset's files, none recorded
    sized = _manifest(tmp_path / "a" / "sized.jsonl", lines + [{"image_sizes": [[32, 32]], "tokens": 1}])
    assert "contents" not in index_builder.build_index_from_manifest(sized, RULE).identity


def test_verify_lists_the_files_that_cannot_be_decoded_and_writes_nothing(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")  # the summary's rows on one line each
    imgs = tmp_path / "imgs"
    imgs.mkdir()
    _photo(imgs / "good.jpg")
    _photo(imgs / "other.jpg", 128)
    _cut(_photo(imgs / "cut.jpg"))
    lines = [{"images": ["imgs/good.jpg"], "tokens": 4}, {"images": ["imgs/other.jpg", "imgs/cut.jpg"], "tokens": 4},
             {"tokens": 2}, {"images": ["imgs/good.jpg"], "tokens": 4}]
    manifest = _manifest(tmp_path / "m.jsonl", lines)
    out = tmp_path / "costs.npz"
    assert indexing.main([str(manifest), *RULE_ARGS, "--out", str(out)]) == 0  # headers only: the cut file passes indexing
    out.unlink()
    capsys.readouterr()
    assert indexing.main([str(manifest), *RULE_ARGS, "--verify", "--workers", "2", "--out", str(out)]) == 2
    captured = capsys.readouterr()
    (line,) = captured.out.splitlines()  # the cut file alone, named by its manifest line
    named = re.escape(f"{manifest}:2: {imgs / 'cut.jpg'}")
    assert re.fullmatch(rf"{named}: OSError: image file is truncated \(\d+ bytes not processed\)", line)
    assert captured.err.splitlines() == ["mimo-accel index: error: 1 of 3 files cannot be decoded (listed above): fix "
                                         "or drop them and index again; nothing was written"]
    assert not out.exists()
    # the good files alone: decoded, then indexed and written
    good = _manifest(tmp_path / "good.jsonl", [lines[0], {"images": ["imgs/other.jpg"], "tokens": 4}])
    assert indexing.main([str(good), *RULE_ARGS, "--verify", "--out", str(out)]) == 0
    assert "2 files, every one decodable" in capsys.readouterr().out and len(CostIndex.load(out)) == 2


def test_verify_names_a_missing_file_with_the_others(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")  # the summary's rows on one line each
    imgs = tmp_path / "imgs"
    imgs.mkdir()
    _cut(_photo(imgs / "cut.jpg"), 0.3)
    manifest = _manifest(tmp_path / "m.jsonl", [{"images": ["imgs/gone.png"], "tokens": 1},
                                                {"images": ["imgs/cut.jpg"], "tokens": 1}])
    assert indexing.main([str(manifest), *RULE_ARGS, "--verify"]) == 2
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"{manifest}:1: {imgs / 'gone.png'}: not found"
    assert lines[1].startswith(f"{manifest}:2: {imgs / 'cut.jpg'}: ") and len(lines) == 2
    # no file to decode: said, not passed in silence
    sized = _manifest(tmp_path / "sized.jsonl", [{"image_sizes": [[32, 32]], "tokens": 1}, {"tokens": 2}])
    assert indexing.main([str(sized), *RULE_ARGS, "--verify"]) == 0
    assert "nothing: no sample names an image or audio file" in capsys.readouterr().out


MEDIA_FACTORY = '''
from pathlib import Path
from mimo_accel_dev.rehearse import stack

def build():
    return stack.media_dataset(Path(__file__).parent / "media", 8, seq_length=64, image_rows=4)
'''


def test_verify_decodes_a_dataset_s_images_and_audio_before_anything_is_cached(factory, tmp_path, capsys):
    import soundfile

    from mimo_accel_dev.rehearse import stack

    cache = tmp_path / "cache"
    cut = _cut(factory.parent / "images" / "1.jpg", 0.6)
    assert indexing.main(["--dataset", f"{factory}:build", "--verify", "--cache-dir", str(cache)]) == 2
    captured = capsys.readouterr()
    (line,) = captured.out.splitlines()
    assert re.fullmatch(rf"sample 1: {re.escape(str(cut))}: OSError: image file is truncated \(\d+ bytes not "
                        r"processed\)", line)
    assert "1 of 7 files cannot be decoded" in captured.err and not cache.exists()

    # audio: a FLAC clip whose header reads (its length) and whose frames do not decode
    examples = stack.media_examples(tmp_path / "media", 8)
    clip = Path(next(e["audio"] for e in examples if e["audio"]))
    rate = soundfile.info(clip).samplerate
    flac = tmp_path / "clip.flac"
    soundfile.write(flac, np.sin(np.arange(rate) / 7).astype(np.float32), rate)
    clip.write_bytes(flac.read_bytes()[:flac.stat().st_size // 2])
    (tmp_path / "media_train.py").write_text(MEDIA_FACTORY)
    spec = f"{tmp_path / 'media_train.py'}:build"
    assert indexing.main(["--dataset", spec, "--verify", "--cache-dir", str(cache)]) == 2
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 1 and out[0].startswith(f"sample {next(i for i, e in enumerate(examples) if e['audio'])}: "
                                               f"{clip}: LibsndfileError") and not cache.exists()
    clip.write_bytes(flac.read_bytes())  # a whole clip: every file decodes, the cache is written
    assert indexing.main(["--dataset", spec, "--verify", "--cache-dir", str(cache)]) == 0
    assert "every one decodable" in capsys.readouterr().out and list(cache.glob("*.npz"))
