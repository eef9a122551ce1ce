"""Per-sample costs derived from the dataset itself (mimo_accel.datasets).

Ground truth is the real thing: Bridge's MegatronMIMODataset.__getitem__ run with a real HF
tokenizer and image processor (built offline), decoding every image; the derived index must
match it without decoding any.
"""

from __future__ import annotations

import base64
import json
import io
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from mimo_accel.costs import CostIndex, FixedPatches, ResizeRule
from mimo_accel.costs.contents import Contents, file_stamps
from mimo_accel.costs.images import image_size_of
from mimo_accel.datasets import DeriveError, MimoDatasetSource, Probed, QwenFetchResize, qwen_resize_rule, shared_index
from mimo_accel.datasets.megatron_mimo import _mimo_real_tokens
from mimo_accel.datasets.sources import Inputs
from mimo_accel_dev.rehearse.stack import offline_tokenizer
from tests._hypothesis import examples

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for c in m['content'] %}"
    "{% if c['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>{% else %}{{ c['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
)
VISION_TOKEN = 3  # "a": any id works as the placeholder


def qwen_processor(min_pixels=56 * 56, max_pixels=28 * 28 * 1280, **kwargs):
    """Qwen2-VL's image processor. The pixel bounds go in as a fresh ``size``: transformers 5.12
    writes ``min_pixels``/``max_pixels`` arguments into the class-level default dict, which would
    leak into every later processor."""
    from transformers import Qwen2VLImageProcessorPil

    return Qwen2VLImageProcessorPil(size={"shortest_edge": min_pixels, "longest_edge": max_pixels}, **kwargs)


def clip_processor():
    from transformers import CLIPImageProcessorPil

    return CLIPImageProcessorPil()


def mimo_dataset(examples, processor, *, seq_length=64, rows=5, preprocess_fn=None, max_samples=None):
    from megatron.bridge.data.megatron_mimo.dataset import MegatronMIMODataset

    return MegatronMIMODataset(examples=examples, processors={"vision": processor}, tokenizer=offline_tokenizer(),
                               seq_length=seq_length, special_token_ids={"vision": VISION_TOKEN},
                               encoder_seq_lengths={"vision": rows}, modality_columns={"vision": "image"},
                               preprocess_fn=preprocess_fn, max_samples=max_samples)


def write_image(path: Path, width: int, height: int) -> Path:
    Image.new("RGB", (width, height), (width % 255, height % 255, 7)).save(path)
    return path


def encoded(width: int, height: int, fmt: str) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (width, height)).save(buf, format=fmt)
    return buf.getvalue()


SIZES = [(100, 60), (640, 480), (33, 900), (1920, 1080), (28, 28), (3000, 200)]  # (width, height)


def all_kinds_of_examples(root: Path, write: bool = True) -> list[dict]:
    """0/1 image per sample, as a JPEG path, PNG path, PIL image or none. (Bridge's dataset hands the
    cell to the HF processor, which takes paths and images, not bytes: bytes come from HF datasets.)"""
    put = write_image if write else (lambda path, w, h: path)
    ex = []
    for i, (w, h) in enumerate(SIZES):
        ext = "jpg" if i % 2 else "png"
        ex.append({"image": str(put(root / f"{i}.{ext}", w, h)), "text": "describe the cat " * (i + 1)})
    ex.append({"image": Image.new("RGB", (50, 700)), "text": "a dog"})  # a PIL image
    ex.append({"image": Image.open(io.BytesIO(encoded(320, 240, "JPEG"))), "text": "what is this"})  # lazy
    ex.append({"image": None, "text": "a dog " * 30})  # text only, truncated to seq_length
    ex.append({"text": "the picture"})  # no image column at all
    ex.append({"image": str(put(root / "long.png", 400, 300)), "text": "the " * 200})  # truncated
    return ex


def ground_truth(ds) -> tuple[list[int], list[int], list[int]]:
    """(patches, images, num_real_tokens) per sample, from the dataset's own __getitem__."""
    patches, images, tokens = [], [], []
    for i in range(len(ds)):
        item = ds[i]
        vision = item["modality_inputs"].get("vision")
        example = ds.examples[i]
        tokens.append(ds._tokenize_with_placeholders(example.get("text", ""), item["modality_inputs"])[1])
        if vision is None:
            patches.append(0)
            images.append(0)
        elif "image_grid_thw" in vision:
            patches.append(int(vision["image_grid_thw"].prod()))
            images.append(1)
        else:
            assert vision["pixel_values"].shape[-2:] == (224, 224)
            patches.append(ds.encoder_seq_lengths["vision"])
            images.append(1)
    return patches, images, tokens


def columns(index: CostIndex) -> tuple[list[int], list[int], list[int]]:
    a = np.arange(len(index))
    return index.rows("vision", a).tolist(), index.items("vision", a).tolist(), index.tokens(a).tolist()


# ----------------------------------------------------------------------------------------------
# MegatronMIMODataset: the derived index equals what the dataset produces by decoding
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["qwen", "qwen3", "clip"])
def test_mimo_dataset_index_matches_the_decoded_samples(tmp_path, kind):
    processor = {"qwen": qwen_processor, "clip": clip_processor,
                 "qwen3": lambda: qwen_processor(patch_size=16, min_pixels=65536, max_pixels=262144)}[kind]()
    ds = mimo_dataset(all_kinds_of_examples(tmp_path), processor)
    index = shared_index.derive_cost_index(ds, cache_dir=False)
    assert columns(index) == ground_truth(ds)
    assert index.items("vision", np.arange(len(ds))).tolist().count(0) == 2
    if kind == "clip":
        assert index.rule_of("vision") == FixedPatches(5)
    else:
        assert index.rule_of("vision") == qwen_resize_rule(processor)
    a = np.arange(len(index))
    assert (index.sq_rows("vision", a) == index.rows("vision", a) ** 2).all()  # one image per sample here


def test_rule_comes_from_the_processor_settings():
    assert qwen_resize_rule(qwen_processor()) == ResizeRule()
    assert qwen_resize_rule(qwen_processor(patch_size=16, merge_size=2, min_pixels=65536,
                                                 max_pixels=16777216)) == ResizeRule(
        patch_size=16, min_pixels=65536, max_pixels=16777216)
    # a collate's overrides win over the processor's size
    assert qwen_resize_rule(qwen_processor(), min_pixels=200704, max_pixels=1003520).min_pixels == 200704
    assert qwen_resize_rule(clip_processor()) is None


def test_several_images_per_sample_and_max_samples(tmp_path):
    paths = [str(write_image(tmp_path / f"{i}.png", 60 + 40 * i, 90)) for i in range(3)]
    ex = [{"image": paths, "text": "a"}, {"image": paths[:1], "text": "a"}, {"image": None, "text": "a"},
          {"image": paths[1], "text": "a"}]
    rule = ResizeRule()
    p = [rule.patches(90, 60 + 40 * i) for i in range(3)]
    ds = mimo_dataset(ex, qwen_processor(), max_samples=3)
    index = shared_index.derive_cost_index(ds, cache_dir=False)
    a = np.arange(3)
    assert len(index) == 3
    assert index.items("vision", a).tolist() == [3, 1, 0]
    assert index.rows("vision", a).tolist() == [sum(p), p[0], 0]
    assert index.sq_rows("vision", a).tolist() == [sum(x * x for x in p), p[0] ** 2, 0]
    # the real processor agrees on the three-image sample
    out = qwen_processor()([Image.open(x) for x in paths], return_tensors="pt")
    assert int(out["image_grid_thw"].prod(-1).sum()) == sum(p)


def test_preprocess_fn_is_applied(tmp_path):
    paths = {i: str(write_image(tmp_path / f"{i}.jpg", 100 * (i + 1), 80)) for i in range(3)}
    ex = [{"file": i, "caption": "a cat"} for i in range(3)]

    def to_example(row):
        return {"image": paths[row["file"]], "text": row["caption"] + " dog"}

    ds = mimo_dataset(ex, qwen_processor(), preprocess_fn=to_example)
    index = shared_index.derive_cost_index(ds, cache_dir=False)
    assert columns(index) == ground_truth(_Preprocessed(ds, to_example))


class _Preprocessed:
    """The dataset with its examples preprocessed, for ground_truth()."""

    def __init__(self, ds, fn):
        self._ds, self.examples = ds, [fn(e) for e in ds.examples]
        self.encoder_seq_lengths = ds.encoder_seq_lengths

    def __len__(self):
        return len(self._ds)

    def __getitem__(self, i):
        return self._ds[i]

    def _tokenize_with_placeholders(self, *a):
        return self._ds._tokenize_with_placeholders(*a)


# ----------------------------------------------------------------------------------------------
# HF datasets: Image columns are read from the arrow table, never decoded
# ----------------------------------------------------------------------------------------------


def test_hf_image_column_is_read_undecoded(tmp_path, monkeypatch):
    import datasets

    sizes = [(100, 60), (640, 480), (33, 900), (1200, 1300)]
    cells = [{"bytes": None, "path": str(write_image(tmp_path / f"{i}.jpg", w, h))} for i, (w, h) in enumerate(sizes[:2])]
    cells += [{"bytes": encoded(*sizes[2], "PNG"), "path": None}, {"bytes": encoded(*sizes[3], "JPEG"), "path": None}]
    features = datasets.Features({"image": datasets.Image(), "text": datasets.Value("string"),
                                  "other": datasets.Value("int64")})
    hf = datasets.Dataset.from_dict({"image": cells + [None], "text": ["a cat", "the dog", "a", "what is this", "a"],
                                     "other": list(range(5))}, features=features)
    ds = mimo_dataset(hf, qwen_processor())
    expected = ground_truth(ds)  # decodes (before the guard below)

    def no_decoding(*a, **k):
        raise AssertionError("an image was decoded")

    monkeypatch.setattr(datasets.Image, "decode_example", no_decoding)
    index = shared_index.derive_cost_index(ds, cache_dir=False)
    assert columns(index) == expected
    assert columns(index)[0][:4] == [ResizeRule().patches(h, w) for w, h in sizes]


def test_hf_list_of_images_column(tmp_path):
    import datasets

    paths = [str(write_image(tmp_path / f"{i}.png", 64 * (i + 1), 64)) for i in range(3)]
    hf = datasets.Dataset.from_dict({"image": [paths, paths[:1], None], "text": ["a", "a", "a"]})
    hf = hf.cast_column("image", datasets.Sequence(datasets.Image()))
    index = shared_index.derive_cost_index(mimo_dataset(hf, qwen_processor()), cache_dir=False)
    p = [ResizeRule().patches(64, 64 * (i + 1)) for i in range(3)]
    assert columns(index)[:2] == ([sum(p), p[0], 0], [3, 1, 0])


# ----------------------------------------------------------------------------------------------
# Bridge's direct HF SFT dataset (the Qwen3.5-VL MegatronMIMO example's data)
# ----------------------------------------------------------------------------------------------


def qwen_vl_processor(**image_kwargs):
    """A real Qwen2VLProcessor (its video processor is a stand-in: torchvision is absent here)."""
    from transformers import Qwen2VLProcessor
    from transformers.processing_utils import ProcessorMixin

    video_base = ProcessorMixin.get_possibly_dynamic_module("BaseVideoProcessor")
    video = type("NoVideo", (video_base,), {"__init__": lambda self: None})()
    return Qwen2VLProcessor(image_processor=qwen_processor(**image_kwargs), tokenizer=offline_tokenizer(),
                            video_processor=video, chat_template=CHAT_TEMPLATE)


def conversation(*parts, answer="a cat"):
    return {"conversation": [{"role": "user", "content": list(parts)},
                             {"role": "assistant", "content": [{"type": "text", "text": answer}]}]}


def test_direct_sft_conversations_follow_the_qwen_collate(tmp_path):
    from megatron.bridge.data.datasets.direct_sft import DirectSFTDataset
    from megatron.bridge.models.qwen_vl.data.collate_fn import QWEN_VL_MAX_PIXELS, QWEN_VL_MIN_PIXELS, qwen2_5_collate_fn

    jpg = str(write_image(tmp_path / "a.jpg", 1000, 700))
    png = str(write_image(tmp_path / "b.png", 90, 60))
    pil = Image.new("RGB", (3000, 2000))
    b64 = "data:image/png;base64," + base64.b64encode(encoded(300, 200, "PNG")).decode()
    text = {"type": "text", "text": "describe the picture"}
    examples = [
        conversation({"type": "image", "image": jpg}, text),
        conversation({"type": "image", "image": "file://" + png}, {"type": "image", "image": pil}, text),
        conversation(text),
        conversation({"type": "image", "image": b64}, text, answer="a dog"),
        conversation({"type": "image", "image": jpg, "resized_height": 280, "resized_width": 420}, text),
        conversation({"type": "image", "image": png, "min_pixels": 200000, "max_pixels": 400000}, text),
    ]
    processor = qwen_vl_processor()
    ds = DirectSFTDataset(examples, target_length=9, processor=processor, collate_impl=qwen2_5_collate_fn)
    index = shared_index.derive_cost_index(ds, cache_dir=False)
    assert len(index) == 9  # wraps around the 6 examples, as the dataset does
    assert index.rule_of("vision") == ResizeRule(min_pixels=QWEN_VL_MIN_PIXELS, max_pixels=QWEN_VL_MAX_PIXELS)

    # Ground truth: qwen_vl_utils' first resize (sizes below by hand), then the real processor with
    # the collate's pixel bounds, on the resized images: input_ids length and grid.
    first = {  # (width, height) after fetch_image: factor 28, [4, 16384] x 28^2 pixels
        jpg: (1008, 700), png: (84, 56), "pil": (2996, 1988), b64: (308, 196),
    }
    resized = [
        [first[jpg]], [first[png], first["pil"]], [], [first[b64]], [(420, 280)], [(560, 392)],
    ]
    for i, sizes in enumerate(resized):
        prompt = processor.apply_chat_template(examples[i]["conversation"], tokenize=False)
        kwargs = {"images": [Image.new("RGB", s) for s in sizes]} if sizes else {}
        out = processor(text=[prompt], min_pixels=QWEN_VL_MIN_PIXELS, max_pixels=QWEN_VL_MAX_PIXELS,
                        return_tensors="pt", **kwargs)
        grids = out["image_grid_thw"].prod(-1).tolist() if sizes else []
        for j in (i, i + 6) if i < 3 else (i,):
            assert index.rows("vision", [j]).tolist() == [sum(grids)], i
            assert index.sq_rows("vision", [j]).tolist() == [sum(g * g for g in grids)], i
            assert index.items("vision", [j]).tolist() == [len(sizes)], i
            assert index.tokens([j]).tolist() == [out["input_ids"].shape[1]], i


def test_qwen_vl_utils_first_resize_by_hand():
    pre = QwenFetchResize()
    assert pre.size(700, 1000, {}) == (700, 1008)
    assert pre.size(10, 20, {}) == (56, 84)  # below 4 x 28^2 pixels: scaled up
    assert pre.size(8000, 6000, {}) == (4116, 3080)  # above 16384 x 28^2: scaled down
    assert pre.size(60, 90, {"min_pixels": 200000, "max_pixels": 400000}) == (392, 560)
    assert pre.size(1, 1, {"resized_height": 280, "resized_width": 420}) == (280, 420)
    with pytest.raises(ValueError, match="aspect ratio"):
        pre.size(1, 300, {})


@settings(max_examples=examples(200), deadline=None)
@given(st.integers(1, 20000), st.integers(1, 20000))
def test_qwen_vl_utils_resize_properties(h, w):
    pre = QwenFetchResize()
    if max(h, w) / min(h, w) > 200:
        with pytest.raises(ValueError):
            pre.size(h, w, {})
        return
    rh, rw = pre.size(h, w, {})
    f = pre.factor
    assert rh % f == 0 and rw % f == 0 and rh >= f and rw >= f
    assert 4 * f * f <= rh * rw <= 16384 * f * f
    assert pre.size(w, h, {}) == (rw, rh)  # symmetric: EXIF rotation cannot change the cost


# ----------------------------------------------------------------------------------------------
# The cache
# ----------------------------------------------------------------------------------------------


def test_second_call_reads_the_cache(tmp_path, monkeypatch):
    ds = mimo_dataset(all_kinds_of_examples(tmp_path), qwen_processor())
    cache = tmp_path / "cache"
    first = shared_index.derive_cost_index(ds, cache_dir=cache)
    files = sorted(p.name for p in cache.iterdir())
    assert len(files) == 2 and files[0].endswith(".json") and files[1].endswith(".npz")

    calls = []
    real = MimoDatasetSource._probe_chunk
    monkeypatch.setattr(MimoDatasetSource, "_probe_chunk", lambda self, *a: calls.append(a) or real(self, *a))
    again = shared_index.derive_cost_index(mimo_dataset(ds.examples, qwen_processor()), cache_dir=cache)
    assert calls == [] and again.digest() == first.digest()
    assert again.mapped and not first.mapped  # the cache file is memory-mapped, shared by a node's ranks

    shared_index.derive_cost_index(ds, cache_dir=cache, refresh=True)
    assert len(calls) == 1

    # other resize settings are another key: probed again, a second file
    other = shared_index.derive_cost_index(mimo_dataset(ds.examples, qwen_processor(max_pixels=200704)), cache_dir=cache)
    assert len(calls) == 2 and other.digest() != first.digest()
    assert len(list(cache.glob("*.npz"))) == 2


def test_a_cache_of_an_older_format_is_rebuilt(tmp_path, caplog):
    ds = mimo_dataset(all_kinds_of_examples(tmp_path), qwen_processor())
    cache = tmp_path / "cache"
    first = shared_index.derive_cost_index(ds, cache_dir=cache)
    (npz,) = cache.glob("*.npz")
    every = np.arange(len(first))
    header = {"format": "mimo-accel-cost-index/2", "length": len(first), "identity": first.identity,
              "encoders": [{"name": m, "rule": first.rule_of(m).to_dict()} for m in first.encoders]}
    arrays = {"tokens": first.tokens(every)}
    for j, m in enumerate(first.encoders):
        arrays.update({f"e{j}_{c}": getattr(first, c)(m, every) for c in ("items", "rows", "sq_rows")})
    with open(npz, "wb") as f:  # a format-2 file: np.savez of int64 columns
        np.savez(f, header=np.array(json.dumps(header)), **arrays)
    again = shared_index.derive_cost_index(ds, cache_dir=cache)
    assert again.digest() == first.digest() and "found 'mimo-accel-cost-index/2'" in caplog.text
    assert json.loads(str(np.load(npz)["header"]))["format"] == "mimo-accel-cost-index/4"
    assert shared_index.derive_cost_index(ds, cache_dir=cache).mapped


def test_cache_dir_defaults_and_env(tmp_path, monkeypatch):
    monkeypatch.setenv(shared_index.ENV_CACHE_DIR, str(tmp_path / "env"))
    assert shared_index.default_cache_dir() == tmp_path / "env"
    monkeypatch.delenv(shared_index.ENV_CACHE_DIR)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert shared_index.default_cache_dir() == tmp_path / "xdg" / "mimo_accel"
    assert shared_index.cache_path("ab" * 32, False) is None
    assert shared_index.cache_path("ab" * 32, tmp_path).parent == tmp_path


def test_a_damaged_cache_is_rebuilt(tmp_path, caplog):
    ds = mimo_dataset(all_kinds_of_examples(tmp_path), qwen_processor())
    first = shared_index.derive_cost_index(ds, cache_dir=tmp_path / "c")
    (npz,) = (tmp_path / "c").glob("*.npz")
    npz.write_bytes(b"garbage")
    assert shared_index.derive_cost_index(ds, cache_dir=tmp_path / "c").digest() == first.digest()
    assert "unreadable cost-index cache" in caplog.text
    assert CostIndex.load(npz).digest() == first.digest()


def test_fingerprint_follows_the_content(tmp_path):
    ex = all_kinds_of_examples(tmp_path)
    ds = mimo_dataset(ex, qwen_processor())
    key = MimoDatasetSource(ds).fingerprint()
    ds[len(ds) - 1]  # tokenizing with truncation leaves call state in the HF tokenizer: not part of the key
    assert MimoDatasetSource(ds).fingerprint() == key
    assert MimoDatasetSource(mimo_dataset([dict(e) for e in ex], qwen_processor())).fingerprint() == key
    changed = [dict(e) for e in ex]
    changed[3]["text"] = "another text"
    assert MimoDatasetSource(mimo_dataset(changed, qwen_processor())).fingerprint() != key
    assert MimoDatasetSource(mimo_dataset(ex, qwen_processor(), seq_length=65)).fingerprint() != key
    assert MimoDatasetSource(mimo_dataset(ex, qwen_processor(), max_samples=5)).fingerprint() != key


def _copy_tree(src: Path, dst: Path) -> Path:
    """``cp -r`` without ``-p``: the files copied, their modification times new (set a second on)."""
    import os
    import shutil

    shutil.copytree(src, dst, copy_function=shutil.copy)
    for f in dst.iterdir():
        t = os.stat(src / f.name).st_mtime_ns + 10**9
        os.utime(f, ns=(t, t))
    return dst


def test_the_identity_is_the_same_for_the_files_copied_elsewhere(tmp_path):
    """The dataset fingerprint and the files' digest name files by base name, size and first
    bytes: a list, an HF dataset and a conversation dataset over copies in another directory
    identify as the originals; one file re-exported at another size does not."""
    import datasets
    from megatron.bridge.data.datasets.direct_sft import DirectSFTDataset
    from megatron.bridge.models.qwen_vl.data.collate_fn import qwen2_5_collate_fn

    from mimo_accel.datasets import dataset_identity

    src = tmp_path / "data"
    src.mkdir()
    ex = all_kinds_of_examples(src)
    dst = _copy_tree(src, tmp_path / "scratch" / "data")
    moved = [{**e, "image": str(dst / Path(e["image"]).name)} if isinstance(e.get("image"), str) else e for e in ex]

    def lists(examples):
        return mimo_dataset(examples, qwen_processor())

    def hf(examples):
        paths = [e["image"] if isinstance(e.get("image"), str) else None for e in examples]
        table = datasets.Dataset.from_dict({"image": paths, "text": [e["text"] for e in examples]})
        return mimo_dataset(table.cast_column("image", datasets.Image()), qwen_processor())

    def conversations(examples):
        convs = [conversation({"type": "image", "image": e["image"]}, {"type": "text", "text": e["text"]})
                 for e in examples if isinstance(e.get("image"), str)]
        return DirectSFTDataset(convs, target_length=11, processor=qwen_vl_processor(), collate_impl=qwen2_5_collate_fn)

    for build in (lists, hf, conversations):
        (there, contents), (here, _) = dataset_identity(build(ex)), dataset_identity(build(moved))
        assert here == there, build.__name__
        assert contents.files > 0 and contents.unreadable == 0
    # a repeated conversation counts at every position it takes, as a manifest of those samples would
    files = [e["image"] for e in moved if isinstance(e.get("image"), str)]
    by_hand = Contents()
    for i in range(11):
        by_hand.add(i, [files[i % len(files)]], file_stamps([files[i % len(files)]]))
    assert dataset_identity(conversations(moved))[1].digest == by_hand.digest and by_hand.files == 11
    write_image(dst / "1.jpg", 700, 480)  # re-exported in place, at another size
    for build in (lists, hf, conversations):
        assert dataset_identity(build(moved))[0]["contents"] != dataset_identity(build(ex))[0]["contents"]


# ----------------------------------------------------------------------------------------------
# Errors and other sources
# ----------------------------------------------------------------------------------------------


def test_unknown_datasets_name_the_three_ways_out():
    class Mine:
        def __len__(self):
            return 3

    with pytest.raises(DeriveError) as err:
        shared_index.derive_cost_index(Mine(), cache_dir=False)
    msg = str(err.value)
    assert "Mine" in msg and "mimo-accel index" in msg and "cost_index=PATH" in msg
    assert "mimo_accel_cost_index" in msg and "reorder_mode='exchange'" in msg


def test_a_dataset_carrying_an_index_gives_it():
    class Carrying:
        mimo_accel_cost_index = CostIndex.from_shapes([], ResizeRule())

        def __len__(self):
            return 0

    assert shared_index.derive_cost_index(Carrying()) is Carrying.mimo_accel_cost_index
    Carrying.mimo_accel_cost_index = "not an index"
    with pytest.raises(DeriveError, match="must be a mimo_accel.costs.CostIndex"):
        shared_index.derive_cost_index(Carrying())


@pytest.mark.parametrize("image, message", [
    ("nowhere.jpg", "sample 1, column 'image': image file not found"),
    ("https://example.com/a.jpg", "is a URL"),
    (b"not an image", "cannot read the image size"),
    (object(), "given as object"),
])
def test_bad_samples_are_named(tmp_path, image, message):
    ex = [{"image": str(write_image(tmp_path / "ok.png", 10, 10)), "text": "a"}, {"image": image, "text": "a"}]
    with pytest.raises(DeriveError, match=message):
        shared_index.derive_cost_index(mimo_dataset(ex, qwen_processor()), cache_dir=False)


def test_an_image_the_processor_refuses_is_named(tmp_path):
    ex = [{"image": str(write_image(tmp_path / "thin.png", 2010, 10)), "text": "a"}]
    with pytest.raises(DeriveError, match="sample 0, column 'image'.*aspect ratio"):
        shared_index.derive_cost_index(mimo_dataset(ex, qwen_processor()), cache_dir=False)


def test_a_modality_without_a_usable_rule_is_refused(tmp_path):
    class Odd:  # neither Qwen-like nor fixed-resolution
        size = {"shortest_edge": 224}
        do_resize = True

    ex = [{"image": str(write_image(tmp_path / "a.png", 10, 10)), "text": "a"}]
    with pytest.raises(DeriveError, match="cannot tell how many encoder rows.*Three ways out"):
        shared_index.derive_cost_index(mimo_dataset(ex, Odd()), cache_dir=False)


def test_image_size_of_every_form(tmp_path):
    path = write_image(tmp_path / "a.jpg", 123, 45)
    for form in (str(path), path, "file://" + str(path), path.read_bytes(), bytearray(path.read_bytes()),
                 {"bytes": None, "path": str(path)}, {"bytes": path.read_bytes(), "path": "ignored"},
                 Image.open(path), np.zeros((45, 123, 3)), np.zeros((3, 45, 123)), np.zeros((45, 123)),
                 "data:image/jpeg;base64," + base64.b64encode(path.read_bytes()).decode()):
        assert image_size_of(form) == (45, 123), type(form)


@settings(max_examples=examples(60), deadline=None)
@given(st.integers(1, 3000), st.integers(1, 3000), st.sampled_from(["PNG", "JPEG", "GIF", "BMP", "WEBP", "TIFF"]))
def test_header_sizes_equal_pillow_sizes(width, height, fmt):
    data = encoded(width, height, fmt)
    assert image_size_of(data) == (height, width)


@given(st.integers(0, 10_000), st.integers(1, 64))
def test_shares_cover_every_sample_once(n, world):
    spans = [shared_index.share(r, world, n) for r in range(world)]
    assert spans[0][0] == 0 and spans[-1][1] == n
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
    assert max(hi - lo for lo, hi in spans) - min(hi - lo for lo, hi in spans) <= 1


@given(st.integers(0, 300), st.integers(0, 300), st.integers(1, 256))
def test_real_tokens_follow_the_datasets_slicing(text, prefix, seq):
    ids = list(range(min(text, seq)))  # tokenizer(truncation=True, max_length=seq)
    if prefix:
        ids = [-1] * prefix + ids[:seq - prefix]
    expected = min(len(ids), seq)
    got = _mimo_real_tokens(np.array([min(text, seq)]), np.array([prefix]), seq)
    assert got.tolist() == [expected]


# ----------------------------------------------------------------------------------------------
# Two gloo ranks: each probes its half, both hold the identical index, the cache serves restarts
# ----------------------------------------------------------------------------------------------


def _two_ranks(rank, world, root, cache):
    from mimo_accel.runtime.store import RankSet

    root = Path(root)
    probed = []
    real = MimoDatasetSource._probe_chunk
    MimoDatasetSource._probe_chunk = lambda self, start, stop, workers: probed.append((start, stop)) or real(
        self, start, stop, workers)
    group = RankSet(range(world))  # the data-loading ranks, gathering through the job's store
    ds = mimo_dataset(all_kinds_of_examples(root, write=False), qwen_processor())  # the parent wrote them
    first = shared_index.derive_cost_index(ds, group=group, cache_dir=cache)
    built = list(probed)
    again = shared_index.derive_cost_index(ds, group=group, cache_dir=cache)
    probed_again = probed[len(built):]
    bad = list(ds.examples)
    bad[-1] = {"image": str(root / "missing.png"), "text": "a"}
    try:
        shared_index.derive_cost_index(mimo_dataset(bad, qwen_processor()), group=group, cache_dir=False)
        error = None
    except DeriveError as exc:
        error = str(exc)
    return {"digest": first.digest(), "again": again.digest(), "columns": columns(first), "built": built,
            "probed_again": probed_again, "error": error}


@pytest.mark.distributed
def test_two_ranks_derive_the_identical_index_each_probing_its_half(tmp_path):
    from mimo_accel_dev.rehearse.ranks import run_ranks

    single = shared_index.derive_cost_index(mimo_dataset(all_kinds_of_examples(tmp_path), qwen_processor()),
                                      cache_dir=False)
    results = run_ranks(_two_ranks, 2, str(tmp_path), str(tmp_path / "cache"), cpu_layer=False, deadline_s=200)
    n = len(single)
    assert results[0]["digest"] == results[1]["digest"] == single.digest()
    assert results[0]["columns"] == results[1]["columns"] == columns(single)
    assert results[0]["built"] == [(0, n // 2)] and results[1]["built"] == [(n // 2, n)]
    assert results[0]["again"] == results[1]["again"] == single.digest()
    assert results[0]["probed_again"] == results[1]["probed_again"] == []  # a restart reads the cache
    # a missing image in rank 1's share: both ranks raise the same error, naming rank 1
    msgs = {r["error"] for r in results}
    assert len(msgs) == 1 and "rank 1" in msgs.pop() and "missing.png" in results[0]["error"]
    assert len(list((tmp_path / "cache").glob("*.npz"))) == 1


def test_rank_zero_shows_a_progress_bar(tmp_path, capsys):
    ds = mimo_dataset(all_kinds_of_examples(tmp_path), qwen_processor())
    shared_index.derive_cost_index(ds, cache_dir=False, progress=True)
    err = capsys.readouterr().err
    assert "probing samples" in err and "11/11" in err
    shared_index.derive_cost_index(ds, cache_dir=False)  # small share: no bar by default
    assert "probing samples" not in capsys.readouterr().err


def test_more_ranks_than_samples_and_world_size_independence(tmp_path):
    """Shares may be empty; the assembled index never depends on how the samples were split."""
    ds = mimo_dataset(all_kinds_of_examples(tmp_path), qwen_processor())
    source = MimoDatasetSource(ds)
    whole = source.to_index(source.probe(0, source.base_length)).digest()
    inputs = source.read_inputs(0, source.base_length)
    for world in (2, 3, 16):
        parts = [source.probe(*shared_index.share(r, world, source.base_length)) for r in range(world)]
        assert source.to_index(Probed.concat(parts)).digest() == whole
        shares = [source.read_inputs(*shared_index.share(r, world, source.base_length)) for r in range(world)]
        added = sum(shares, Inputs.none())
        assert added.contents.digest == inputs.contents.digest and inputs.contents.files == 7
        assert added.texts.digest == inputs.texts.digest and inputs.texts.samples == len(ds)
        assert added.rows.digest == inputs.rows.digest and inputs.rows.samples == len(ds)
