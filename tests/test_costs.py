"""Resize rule, cost model, cost index and image-header parsing (mimo_accel.costs)."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import json
import math
import pickle
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mimo_accel.costs import (
    CostIndex,
    CostModel,
    FixedPatches,
    ResizeRule,
    SampleShape,
    image_size_from_bytes,
    image_size_from_header,
    rule_from_dict,
)
from mimo_accel.modules import Modules
from tests._hypothesis import examples

RULE = ResizeRule()

# --------------------------------------------------------------------------------------------
# ResizeRule
# --------------------------------------------------------------------------------------------

# Worked by hand with factor 28, min_pixels 3136, max_pixels 1003520 (Qwen2-VL defaults).
HAND_COMPUTED = [
    # (height, width) -> resized (h, w), grid_thw
    ((224, 224), (224, 224), (1, 16, 16)),  # already multiples of 28, area in range
    ((1000, 500), (1008, 504), (1, 72, 36)),  # round(35.7) = 36, round(17.9) = 18
    # area too big: beta = sqrt(12e6 / 1003520) = 3.458; floor(41.3) * 28, floor(30.98) * 28
    ((4000, 3000), (1148, 840), (1, 82, 60)),
    # area too small: beta = sqrt(3136 / 1200) = 1.617; ceil(1.73) * 28, ceil(2.31) * 28
    ((30, 40), (56, 84), (1, 4, 6)),
    ((42, 70), (56, 56), (1, 4, 4)),  # 1.5 and 2.5 round half to even, both to 2, like round()
    ((100, 20000), (56, 14140), (1, 4, 1010)),  # aspect ratio exactly 200 is still accepted
    # Sides below the factor are accepted (transformers 5.x): round(20 / 28) = 1, round(100 / 28) = 4,
    ((20, 100), (28, 112), (1, 2, 8)),  # area 3136 is exactly min_pixels
    # round(10 / 28) = 0 gives area 0 < min_pixels: beta = sqrt(3136 / 1000); ceil(0.63), ceil(6.3)
    ((10, 100), (28, 196), (1, 2, 14)),
]


@pytest.mark.parametrize(("size", "resized", "grid"), HAND_COMPUTED)
def test_resize_rule_matches_hand_computed_values(size, resized, grid):
    assert RULE.resized(*size) == resized
    assert RULE.grid_thw(*size) == grid
    assert RULE.patches(*size) == grid[0] * grid[1] * grid[2]


def _transformers_smart_resize():
    """transformers' own smart_resize, or a reason why it is not available.

    The module imports torchvision at import time, which the CPU test environment lacks, so
    fall back to compiling just the function from the installed source (it needs only math).
    """
    name = "transformers.models.qwen2_vl.image_processing_qwen2_vl"
    try:
        return importlib.import_module(name).smart_resize, None
    except ImportError as exc:
        reason = str(exc)
    try:
        spec = importlib.util.find_spec(name)
    except ImportError:
        spec = None
    if spec is None or spec.origin is None:
        return None, reason
    tree = ast.parse(Path(spec.origin).read_text(encoding="utf-8"))
    funcs = [node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == "smart_resize"]
    if not funcs:
        return None, f"{spec.origin} defines no smart_resize"
    namespace = {"math": math}
    exec(compile(ast.Module(body=funcs, type_ignores=[]), spec.origin, "exec"), namespace)
    return namespace["smart_resize"], None


def test_resize_rule_matches_transformers_smart_resize():
    smart_resize, reason = _transformers_smart_resize()
    # transformers is installed with the Megatron runtime (make setup): its absence is a failure.
    assert smart_resize is not None, f"transformers' smart_resize not available ({reason})"
    rng = np.random.default_rng(0)
    sizes = [(int(h), int(w)) for h, w in rng.integers(1, 6000, size=(400, 2))]
    sizes += [(int(h), int(w)) for h, w in rng.integers(1, 60, size=(200, 2))]
    sizes += [size for size, _, _ in HAND_COMPUTED]
    for h, w in sizes:
        if max(h, w) / min(h, w) > 200:
            continue
        assert RULE.resized(h, w) == tuple(smart_resize(h, w, factor=28, min_pixels=3136, max_pixels=1003520)), (h, w)


@pytest.mark.parametrize(
    ("size", "message"),
    [
        ((28, 5601), "aspect ratio above 200"),
        ((1, 201), "aspect ratio above 200"),
        ((0, 100), "height must be a positive integer"),
    ],
)
def test_resize_rule_rejects_what_the_processor_rejects(size, message):
    with pytest.raises(ValueError, match=message):
        RULE.patches(*size)
    with pytest.raises(ValueError, match=message):
        RULE.patches_many([size[0]], [size[1]])


def test_resize_rule_validates_its_fields():
    with pytest.raises(ValueError, match="min_pixels .* exceeds max_pixels"):
        ResizeRule(min_pixels=10_000, max_pixels=5_000)
    with pytest.raises(ValueError, match="patch_size must be a positive integer"):
        ResizeRule(patch_size=0)


@settings(max_examples=examples(200), deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 20000), st.integers(1, 20000)), min_size=1, max_size=30),
    st.sampled_from([ResizeRule(), ResizeRule(patch_size=16, min_pixels=64 * 64, max_pixels=512 * 512)]),
)
def test_vectorised_patches_equal_the_scalar_rule(sizes, rule):
    sizes = [(h, w) for h, w in sizes if max(h, w) / min(h, w) <= 200]
    expected = [rule.patches(h, w) for h, w in sizes]
    got = rule.patches_many([h for h, _ in sizes], [w for _, w in sizes])
    assert got.dtype == np.int64
    assert got.tolist() == expected
    for (h, w), p in zip(sizes, expected):
        rh, rw = rule.resized(h, w)
        assert rh % rule.factor == 0 and rw % rule.factor == 0
        # The area lands in range unless the factor grid forces it outside (extreme aspect ratios).
        assert rh * rw <= rule.max_pixels or min(rh, rw) == rule.factor
        assert rh * rw >= rule.min_pixels
        assert p == (rh // rule.patch_size) * (rw // rule.patch_size)


# --------------------------------------------------------------------------------------------
# CostModel
# --------------------------------------------------------------------------------------------


def test_cost_model_arithmetic():
    model = CostModel(a=1.0, b=0.001)
    # an encoder without its own entry, images of 100 and 200 patches: 300 + 0.001 * (100^2 + 200^2)
    np.testing.assert_allclose(model.encoder_costs("vision", [300, 0], [50_000, 0], [2, 0]), [350, 0])
    # the language model: 50 + 50^2 / 8192 tokens
    np.testing.assert_allclose(model.language_costs([50, 0]), [50 + 2500 / 8192, 0])


def test_default_cost_model_mirrors_the_cpu_measurement():
    model = CostModel()
    assert model.b / model.a == pytest.approx(6.1e-8 / 6.6e-5, rel=0.03)


@pytest.mark.parametrize("bad", [-1.0, math.nan, math.inf, "1", True, None])
def test_cost_model_rejects_bad_coefficients(bad):
    with pytest.raises(ValueError, match="CostModel.b must be"):
        CostModel(b=bad)


def test_cost_model_file_round_trip(tmp_path):
    model = CostModel(a=2.0, b=0.003, fit={"r2": 0.987, "n": 412})
    path = tmp_path / "cost_model.json"
    model.to_file(path)
    doc = json.loads(path.read_text())
    assert doc["format"] == "mimo-accel-cost-model/3" and doc["modules"] == {}
    assert set(doc) == {"format", "a", "b", "modules", "fit"}
    loaded = CostModel.from_file(path)
    assert loaded == model
    assert loaded.fit == {"r2": 0.987, "n": 412}
    assert pickle.loads(pickle.dumps(loaded)) == model  # travels to data-loader workers
    assert list(tmp_path.iterdir()) == [path]  # no temporary file left behind


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("not json", "not a JSON cost model"),
        ('{"a": 1, "b": 0}', 'expected "format": "mimo-accel-cost-model/3", found None'),
        ('{"format": "mimo-accel-cost-model/9", "a": 1, "b": 0}', "found 'mimo-accel-cost-model/9'"),
        ('{"format": "mimo-accel-cost-model/3", "a": 1}', r"missing coefficients \['b'\]"),
        ('{"format": "mimo-accel-cost-model/3", "a": 1, "b": 0, "B": 2}', r"unknown keys \['B'\]"),
        ('{"format": "mimo-accel-cost-model/3", "a": 1, "b": 0, "c": 0}', r"unknown keys \['c'\]"),
        ('{"format": "mimo-accel-cost-model/3", "a": 1, "b": -3}', "CostModel.b must be finite and >= 0"),
        ("[1, 2]", "found 'list'"),
    ],
)
def test_cost_model_bad_files(tmp_path, content, message):
    path = tmp_path / "model.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=message) as err:
        CostModel.from_file(path)
    assert str(path) in str(err.value)


# --------------------------------------------------------------------------------------------
# CostIndex
# --------------------------------------------------------------------------------------------

SHAPES = [
    SampleShape(((224, 224),), 100),  # 256 patches
    SampleShape((), 40),  # text only
    SampleShape(((1000, 500), (224, 224)), 7),  # 2592 + 256 patches
    SampleShape([[4000, 3000]], 0),  # lists are normalised: 4920 patches
]


def test_cost_index_from_shapes():
    index = CostIndex.from_shapes(SHAPES, RULE)
    assert len(index) == 4
    assert index.encoders == ("vision",)
    assert index.rows("vision", [0, 1, 2, 3]).tolist() == [256, 0, 2592 + 256, 4920]
    assert index.sq_rows("vision", [2]).tolist() == [2592**2 + 256**2]
    assert index.items("vision", np.arange(4)).tolist() == [1, 0, 2, 1]
    assert index.tokens([3, 0]).tolist() == [0, 100]
    model = CostModel(a=1.0, b=0.001)
    per_image = [[RULE.patches(h, w) for h, w in s.image_sizes] for s in SHAPES]
    expected = [sum(p) + 0.001 * sum(x * x for x in p) for p in per_image]
    vision = Modules.from_dp_sizes({"vision": 1})
    np.testing.assert_allclose(index.module_costs(np.arange(4), model, vision)["vision"], expected)
    np.testing.assert_allclose(index.module_costs([2, 2], model, vision)["vision"], [expected[2]] * 2)
    assert index.module_costs([], model, vision)["vision"].shape == (0,)


def test_cost_index_save_load_round_trip(tmp_path):
    rule = ResizeRule(patch_size=16, min_pixels=4096, max_pixels=262144)
    index = CostIndex.from_shapes(SHAPES, rule)
    path = tmp_path / "costs.mimo-index"  # saved at exactly this name, no suffix added
    index.save(path)
    assert [p.name for p in tmp_path.iterdir()] == ["costs.mimo-index"]
    loaded = CostIndex.load(path)
    assert loaded.rule_of("vision") == rule
    assert len(loaded) == len(index)
    idx = np.arange(len(index))
    for getter in ("rows", "sq_rows", "items"):
        assert getattr(loaded, getter)("vision", idx).tolist() == getattr(index, getter)("vision", idx).tolist()
    assert loaded.tokens(idx).tolist() == index.tokens(idx).tolist()
    assert pickle.loads(pickle.dumps(loaded)).rows("vision", idx).tolist() == index.rows("vision", idx).tolist()


def test_cost_index_out_of_range_names_the_fix():
    index = CostIndex.from_shapes(SHAPES, RULE)
    with pytest.raises(IndexError) as err:
        index.tokens([0, 4])
    message = str(err.value)
    assert "sample index 4" in message and "cost index of 4 samples" in message
    assert "mimo-accel index" in message
    with pytest.raises(IndexError, match="sample index -1"):
        index.rows("vision", [-1])
    with pytest.raises(TypeError, match="integers"):
        index.rows("vision", [0.5])


def _save_raw(path, header, **arrays):
    base = {
        "patches": np.array([4, 0]),
        "sq_patches": np.array([16, 0]),
        "tokens": np.array([3, 2]),
        "images": np.array([1, 0]),
    }
    base.update(arrays)
    with open(path, "wb") as f:
        np.savez(f, header=np.array(json.dumps(header)), **{k: v for k, v in base.items() if v is not None})


GOOD_HEADER = {"format": "mimo-accel-cost-index/1", "length": 2, "rule": ResizeRule().to_dict()}


@pytest.mark.parametrize(
    ("header", "arrays", "message"),
    [
        ({**GOOD_HEADER, "format": "other/1"}, {}, "expected format 'mimo-accel-cost-index/4', found 'other/1'"),
        # the formats before 4 (1: one vision encoder; 2: int64 columns; 3: byte-aligned) are refused
        (GOOD_HEADER, {}, "expected format 'mimo-accel-cost-index/4', found 'mimo-accel-cost-index/1'"),
        ({**GOOD_HEADER, "format": "mimo-accel-cost-index/2"}, {}, "found 'mimo-accel-cost-index/2'"),
        ({**GOOD_HEADER, "format": "mimo-accel-cost-index/3"}, {}, "found 'mimo-accel-cost-index/3'"),
        ({"format": "mimo-accel-cost-index/1"}, {}, "header is malformed"),
    ],
)
def test_cost_index_refuses_bad_files(tmp_path, header, arrays, message):
    path = tmp_path / "index.npz"
    _save_raw(path, header, **arrays)
    with pytest.raises(ValueError, match=message) as err:
        CostIndex.load(path)
    assert str(err.value).endswith("rebuild it with `mimo-accel index`") and "\n" not in str(err.value)


def test_cost_index_refuses_garbage(tmp_path):
    path = tmp_path / "index.npz"
    path.write_bytes(b"definitely not a zip file")
    with pytest.raises(ValueError, match="not a cost index"):
        CostIndex.load(path)
    with pytest.raises(FileNotFoundError):
        CostIndex.load(tmp_path / "missing.npz")


def test_costs_are_never_nan_or_negative():
    with pytest.raises(ValueError, match="negative"):
        CostIndex([-1], {"vision": ([1], [1], [1], RULE)})
    with pytest.raises(ValueError, match=">= 0"):
        CostModel().encoder_costs("vision", [-1], [1], [0])
    with pytest.raises(ValueError, match="overflowed"):
        CostModel(b=1e300).encoder_costs("vision", [1], [10**18], [0])


@pytest.mark.parametrize(
    ("sizes", "tokens", "message"),
    [
        (((0, 10),), 1, "two positive integers"),
        (((10.5, 10),), 1, "two positive integers"),
        (((10, 10, 3),), 1, "two positive integers"),
        ((None,), 1, "two positive integers"),
        ((), None, "non-negative integer"),
        ((), -1, "non-negative integer"),
        ((), True, "non-negative integer"),
    ],
)
def test_sample_shape_validation(sizes, tokens, message):
    with pytest.raises(ValueError, match=message):
        SampleShape(sizes, tokens)


# --------------------------------------------------------------------------------------------
# Image headers
# --------------------------------------------------------------------------------------------


def _png(width: int, height: int) -> bytes:
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)  # 8-bit grayscale
    rows = b"".join(b"\x00" + b"\x80" * width for _ in range(height))
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


def _segment(marker: int, body: bytes) -> bytes:
    return bytes([0xFF, marker]) + struct.pack(">H", len(body) + 2) + body


def _jpeg(width: int, height: int, sof: int = 0xC0) -> bytes:
    app0 = _segment(0xE0, b"JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00")
    dqt = _segment(0xDB, b"\x00" + bytes(range(64)))
    dht = _segment(0xC4, b"\x00" + bytes(16))  # DHT shares the SOF range but is not a frame header
    frame = _segment(sof, struct.pack(">BHHB", 8, height, width, 1) + b"\x01\x11\x00")
    sos = _segment(0xDA, b"\x01\x01\x00\x00\x3f\x00")
    # A fill byte before the frame marker is legal and must be skipped.
    return b"\xff\xd8" + app0 + dqt + dht + b"\xff" + frame + sos + b"\x00\x00\xff\xd9"


def _gif(width: int, height: int) -> bytes:
    return b"GIF89a" + struct.pack("<HHBBB", width, height, 0, 0, 0) + b"\x3b"


def _bmp(width: int, height: int) -> bytes:
    dib = struct.pack("<IiiHHIIiiII", 40, width, -height, 1, 24, 0, 0, 0, 0, 0, 0)  # top-down rows
    return b"BM" + struct.pack("<IHHI", 14 + len(dib), 0, 0, 14 + len(dib)) + dib


def _webp(chunk: bytes, payload: bytes) -> bytes:
    body = b"WEBP" + chunk + struct.pack("<I", len(payload)) + payload
    return b"RIFF" + struct.pack("<I", len(body)) + body


def _webp_lossy(width: int, height: int) -> bytes:
    return _webp(b"VP8 ", b"\x00\x00\x00\x9d\x01\x2a" + struct.pack("<HH", width, height) + bytes(8))


def _webp_lossless(width: int, height: int) -> bytes:
    bits = (width - 1) | ((height - 1) << 14)
    return _webp(b"VP8L", b"\x2f" + struct.pack("<I", bits) + bytes(4))


def _webp_extended(width: int, height: int) -> bytes:
    return _webp(b"VP8X", bytes(4) + (width - 1).to_bytes(3, "little") + (height - 1).to_bytes(3, "little"))


@pytest.mark.parametrize(
    "make",
    [_png, _jpeg, lambda w, h: _jpeg(w, h, sof=0xC2), _gif, _bmp, _webp_lossy, _webp_lossless, _webp_extended],
    ids=["png", "jpeg-baseline", "jpeg-progressive", "gif", "bmp", "webp-vp8", "webp-vp8l", "webp-vp8x"],
)
def test_image_size_from_header(tmp_path, make):
    path = tmp_path / "image"
    path.write_bytes(make(37, 23))  # width 37, height 23: catches swapped axes
    assert image_size_from_header(path) == (23, 37)


def test_image_headers_feed_the_cost_index(tmp_path):
    (tmp_path / "a.png").write_bytes(_png(224, 224))
    (tmp_path / "b.jpg").write_bytes(_jpeg(500, 1000))
    shapes = [SampleShape((image_size_from_header(tmp_path / name),), 10) for name in ("a.png", "b.jpg")]
    assert CostIndex.from_shapes(shapes, RULE).rows("vision", [0, 1]).tolist() == [256, 2592]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (_jpeg(40, 30)[:30], "truncated"),
        (b"\xff\xd8\xff\xda\x00\x02", "no frame header before its scan"),
        (_png(5, 5)[:20], "truncated"),
        (b"\x89PNG\r\n\x1a\n\x00\x00\x00\x0dIDAT" + bytes(20), "without IHDR"),
        (_png(0, 5), "zero size"),
        (b"this is no image at all", "image"),
    ],
)
def test_bad_image_headers(tmp_path, content, message):
    path = tmp_path / "bad"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=message) as err:
        image_size_from_header(path)
    assert str(path) in str(err.value)


# --------------------------------------------------------------------------------------------
# Additions for costs derived without an index: bytes headers, fixed resolution, digests
# --------------------------------------------------------------------------------------------

_MAKERS = [_png, _jpeg, lambda w, h: _jpeg(w, h, sof=0xC2), _gif, _bmp, _webp_lossy, _webp_lossless, _webp_extended]


@pytest.mark.parametrize("make", _MAKERS, ids=["png", "jpeg", "jpeg-progressive", "gif", "bmp", "webp-vp8",
                                               "webp-vp8l", "webp-vp8x"])
def test_image_size_from_bytes_equals_the_file_reader(tmp_path, make):
    data = make(37, 23)
    (tmp_path / "image").write_bytes(data)
    assert image_size_from_bytes(data) == image_size_from_header(tmp_path / "image") == (23, 37)
    assert image_size_from_bytes(memoryview(data)) == (23, 37)


def test_image_size_from_bytes_errors_name_the_image():
    with pytest.raises(ValueError, match="sample 7: image header is truncated"):
        image_size_from_bytes(_png(5, 5)[:20], "sample 7")
    with pytest.raises(ValueError, match="cell 3: cannot read image size"):
        image_size_from_bytes(b"this is no image at all", "cell 3")


def test_image_size_from_bytes_falls_back_to_pillow_for_other_formats():
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (41, 17)).save(buf, format="TIFF")
    assert image_size_from_bytes(buf.getvalue()) == (17, 41)


def test_fixed_patches_rule():
    rule = FixedPatches(577)
    assert rule.patches(10, 4000) == 577 and rule.patches_many([1, 2], [3, 4]).tolist() == [577, 577]
    assert rule_from_dict(rule.to_dict()) == rule and rule_from_dict(RULE.to_dict()) == RULE
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="patches_per_image"):
            FixedPatches(bad)
    with pytest.raises(ValueError, match="only"):
        rule_from_dict({"fixed_patches": 5, "patch_size": 14})
    index = CostIndex.from_shapes([SampleShape(((10, 20), (3000, 4000)), 9), SampleShape((), 4)], rule)
    assert index.rows("vision", [0, 1]).tolist() == [1154, 0]
    assert index.sq_rows("vision", [0]).tolist() == [2 * 577 ** 2]


def test_an_index_with_a_fixed_rule_round_trips(tmp_path):
    index = CostIndex([600, 20], {"vision": ([1, 0], [577, 0], [577 ** 2, 0], FixedPatches(577))})
    index.save(tmp_path / "i.npz")
    again = CostIndex.load(tmp_path / "i.npz")
    assert again.rule_of("vision") == FixedPatches(577) and again.digest() == index.digest()


def test_an_index_refuses_other_rules():
    with pytest.raises(ValueError, match="rule must be a ResizeRule"):
        CostIndex([1], {"vision": ([1], [1], [1], {"patch_size": 14})})


def test_digest_covers_every_array_and_the_rule():
    base = dict(patches=[4, 0], sq_patches=[16, 0], tokens=[9, 3], images=[1, 0])

    def index(rule=RULE, patches=(), sq_patches=(), tokens=(), images=()):
        return CostIndex(tokens, {"vision": (images, patches, sq_patches, rule)})

    d = index(**base).digest()
    assert index(**base).digest() == d and len(d) == 64
    for changed in ({"tokens": [9, 4]}, {"sq_patches": [10, 0]}, {"patches": [4, 1], "sq_patches": [16, 1], "images": [1, 1]},
                    {"patches": [4, 1], "sq_patches": [16, 1], "images": [1, 2]}):
        assert index(**{**base, **changed}).digest() != d
    assert index(**base, rule=ResizeRule(patch_size=16)).digest() != d
