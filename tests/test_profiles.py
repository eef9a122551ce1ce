"""Workload profiles (mimo_accel.workloads): shipped files, validation messages, sampling."""

from __future__ import annotations

import numpy as np
import pytest

from mimo_accel.costs import CostIndex, CostModel, SampleShape
from mimo_accel.workloads import (
    PROFILES_DIR,
    REHEARSAL_MAX_IMAGES,
    REHEARSAL_MAX_PATCHES,
    Profile,
    ProfileError,
    list_profiles,
    load_profile,
)

SHIPPED = ("documents", "mixed_chat", "receipts", "uniform")

VALID = """
[profile]
name = "mini"

[images]
count = { 0 = 0.5, 1 = 0.3, 2 = 0.2 }
height = { dist = "lognormal", median = 800, sigma = 0.5, min = 100, max = 4000 }
width = { dist = "uniform", min = 200, max = 1200 }
bytes_per_pixel = 0.3

[text]
tokens = { dist = "choice", values = [64, 256], p = [0.5, 0.5] }

[resize]
patch_size = 16
merge_size = 2
min_pixels = 200704
max_pixels = 1048576

[layout]
micro_batch_size = 16
seq_length = 8192
vision = { tp = 1, pp = 1, dp = 4 }
language = { tp = 2, pp = 1, dp = 2 }

[rehearsal]
steps = 2
micro_batch_size = 8
seq_length = 128
vision = { dp = 2 }
language = { dp = 2 }

[rehearsal.images]
height = { dist = "uniform", min = 2, max = 8 }
width = 4

[rehearsal.text]
tokens = { dist = "uniform", min = 4, max = 16 }
"""


def _write(tmp_path, text, name="p.toml"):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


# ---------------------------------------------------------------------------------- shipped


def test_shipped_profiles_are_listed_and_load():
    assert set(SHIPPED) <= set(list_profiles())
    for name in SHIPPED:
        p = load_profile(name)
        assert isinstance(p, Profile) and p.name == name
        assert p.path == PROFILES_DIR / f"{name}.toml"
        assert p.rule.patch_size == 16 and p.rule.merge_size == 2 and p.rule.min_pixels == 200704
        assert p.micro_batch_size % p.modules.grid == 0
        assert [(m.name, m.kind) for m in p.modules] == [("vision", "image"), ("language", "text")]
        r = p.rehearsal
        assert r.seq_length <= 256 and r.micro_batch_size % r.modules.grid == 0 and r.steps >= 1


def test_load_by_path_and_unknown_name(tmp_path):
    path = _write(tmp_path, VALID)
    assert load_profile(path).name == "mini"
    assert load_profile(str(path)).name == "mini"
    with pytest.raises(ProfileError, match="shipped profiles .*receipts"):
        load_profile("no_such_profile")


def test_shapes_fit_the_layout_and_the_story_of_each_profile():
    receipts = load_profile("receipts").sample_table(2000, seed=1)
    assert (receipts.images == 1).all()
    assert (receipts.heights > receipts.widths).mean() > 0.8  # tall
    p = receipts.image_patches
    assert p.max() > 4 * np.median(p)  # a long tail

    docs = load_profile("documents").sample_table(2000, seed=1)
    assert docs.images.min() == 1 and docs.images.max() == 8

    for name in SHIPPED:
        prof = load_profile(name)
        t = prof.sample_table(500, seed=3)
        assert (t.tokens <= prof.seq_length).all()
        assert (t.tokens >= t.patches // 4).all() and (t.bytes > 0).all()


def test_mixed_chat_is_about_sixty_percent_text_only():
    t = load_profile("mixed_chat").sample_table(2000, seed=0)
    assert abs((t.images == 0).mean() - 0.6) < 0.04
    assert set(np.unique(t.images)) <= {0, 1, 2, 4}


def test_uniform_has_zero_cost_variance():
    prof = load_profile("uniform")
    costs = prof.sample_table(1000, seed=5).costs(CostModel(a=1.0, b=0.0009))
    assert costs.max() == costs.min() > 0
    shapes = prof.sample_shapes(10, seed=9)
    assert len(set(shapes)) == 1


def test_sampling_is_deterministic_and_consistent():
    prof = load_profile("documents")
    a, b = prof.sample_shapes(300, seed=7), prof.sample_shapes(300, seed=7)
    assert a == b and all(isinstance(s, SampleShape) for s in a)
    assert prof.sample_shapes(300, seed=8) != a
    index = prof.cost_index(300, seed=7)
    rebuilt = CostIndex.from_shapes(a, prof.rule)  # the scalar path agrees with the arrays
    idx = np.arange(300)
    assert np.array_equal(index.rows("vision", idx), rebuilt.rows("vision", idx))
    assert np.array_equal(index.sq_rows("vision", idx), rebuilt.sq_rows("vision", idx))
    assert np.array_equal(index.tokens(idx), rebuilt.tokens(idx))
    assert prof.sample_shapes(0) == []


@pytest.mark.parametrize("name", SHIPPED)
def test_rehearsal_shapes_are_small_and_fit(name):
    prof = load_profile(name)
    r = prof.rehearsal
    shapes = prof.rehearsal_shapes(200, seed=2)
    assert shapes == prof.rehearsal_shapes(200, seed=2)
    m = r.merge_size
    for s in shapes:
        assert len(s.images) <= REHEARSAL_MAX_IMAGES
        for h, w in s.images:
            assert h % m == 0 and w % m == 0 and h * w <= REHEARSAL_MAX_PATCHES
        assert s.patches // (m * m) + s.text_tokens <= r.seq_length and s.text_tokens >= 0
    if name == "mixed_chat":
        assert any(not s.images for s in shapes) and any(s.images for s in shapes)


# ------------------------------------------------------------------------------- validation


BAD = [
    # (old, new, substrings the message must contain)
    ("bytes_per_pixel = 0.3", "bytes_per_pixel = 0.3\ncolour = 1", ["images.colour", "unknown key", "remove it"]),
    ("{ 0 = 0.5, 1 = 0.3, 2 = 0.2 }", "{ 0 = 0.5, 1 = 0.3 }", ["images.count", "sum to 0.8", "sum to 1"]),
    ("min = 100, max = 4000", "min = -5, max = 4000", ["images.height.min", "negative"]),
    ("micro_batch_size = 16", "micro_batch_size = 18", ["layout.micro_batch_size", "lcm", "16 or 20"]),
    ('dist = "uniform", min = 200', 'dist = "gaussian", min = 200', ["images.width.dist", "gaussian", "lognormal"]),
    ("median = 800", "median = 8000", ["images.height.median", "outside"]),
    ("seq_length = 8192", "seq_length = 512", ["layout.seq_length", "raise it to at least"]),
    ("width = 4\n", "width = 400\n", ["rehearsal.images", f"<= {REHEARSAL_MAX_PATCHES}"]),
    ("seq_length = 128", "seq_length = 4096", ["rehearsal.seq_length", "at most 256"]),
    ("vision = { dp = 2 }", "vision = { dp = 0 }", ["rehearsal.vision.dp", ">= 1"]),
    ("values = [64, 256], p = [0.5, 0.5]", "values = [64, 256], p = [1.0]", ["text.tokens.p", "one probability per value"]),
    ("[profile]", "[profiles]", ["profiles", "unknown key"]),
    ("patch_size = 16", "patch_size = 16\nmin_pixels_x = 3", ["resize.min_pixels_x", "unknown key"]),
    ("min_pixels = 200704", "min_pixels = 2000000", ["resize", "min_pixels", "exceeds max_pixels"]),
    ("{ 0 = 0.5, 1 = 0.3, 2 = 0.2 }", "{ 0 = 0.5, 1 = 0.3, 6 = 0.2 }", ["images.count", "too many", "at most 4"]),
    ("min = 200, max = 1200", "min = 10, max = 1200", ["aspect ratio", "200"]),
]


@pytest.mark.parametrize("old,new,expect", BAD, ids=[b[2][0] + "-" + str(i) for i, b in enumerate(BAD)])
def test_bad_profiles_name_file_key_and_fix(tmp_path, old, new, expect):
    assert old in VALID
    path = _write(tmp_path, VALID.replace(old, new, 1))
    with pytest.raises(ProfileError) as info:
        load_profile(path)
    msg = str(info.value)
    assert str(path) in msg
    for part in expect:
        assert part in msg, msg


def test_missing_table_and_bad_syntax(tmp_path):
    start = VALID.index("[text]")
    path = _write(tmp_path, VALID[:start] + VALID[VALID.index("[resize]"):])
    with pytest.raises(ProfileError, match=r"p\.toml: text: missing"):
        load_profile(path)
    path = _write(tmp_path, VALID.replace("steps = 2", "steps = = 2"), "syntax.toml")
    with pytest.raises(ProfileError, match=r"syntax\.toml: not valid TOML"):
        load_profile(path)


def test_fixed_sizes_and_text_only_profiles(tmp_path):
    text = VALID.replace(
        'height = { dist = "lognormal", median = 800, sigma = 0.5, min = 100, max = 4000 }\n'
        'width = { dist = "uniform", min = 200, max = 1200 }',
        'size = { dist = "choice", values = [[448, 448], [1024, 768]], p = [0.25, 0.75] }',
    )
    t = load_profile(_write(tmp_path, text)).sample_table(400, seed=0)
    assert set(zip(t.heights.tolist(), t.widths.tolist())) == {(448, 448), (1024, 768)}

    both = text.replace("bytes_per_pixel = 0.3", "bytes_per_pixel = 0.3\nheight = 5")
    with pytest.raises(ProfileError, match="images.size: given together with height/width"):
        load_profile(_write(tmp_path, both, "both.toml"))

    text_only = VALID.replace("{ 0 = 0.5, 1 = 0.3, 2 = 0.2 }", "{ 0 = 1.0 }")
    prof = load_profile(_write(tmp_path, text_only, "text_only.toml"))
    t = prof.sample_table(50, seed=0)
    assert (t.images == 0).all() and (t.patches == 0).all()
    assert all(not s.images for s in prof.rehearsal_shapes(20))


# ------------------------------------------------------------------------------ a second encoder


AUDIO = """
[audio]
count = { 0 = 0.5, 1 = 0.3, 2 = 0.2 }
seconds = { dist = "lognormal", median = 6, sigma = 0.7, min = 1, max = 30 }
rows_per_second = 50
rows_per_token = 4
"""


def _with_audio(text: str = VALID, audio: str = AUDIO, dp: int = 2) -> str:
    return (text.replace("[layout]", audio + "\n[layout]", 1)
            .replace("language = { tp = 2, pp = 1, dp = 2 }", f"language = {{ tp = 2, pp = 1, dp = 2 }}\naudio = {{ dp = {dp} }}", 1))


def test_a_profile_may_declare_an_audio_encoder(tmp_path):
    plain = load_profile(_write(tmp_path, VALID, "plain.toml"))
    prof = load_profile(_write(tmp_path, _with_audio()))
    assert prof.audio is not None and prof.audio.rows_per_second == 50 and prof.audio.pad_to_seconds is None
    assert prof.modules.dp_sizes == {"vision": 4, "audio": 2, "language": 2} and prof.modules.grid == 4
    assert prof.modules.world_size == 4 + 2 + 4 and prof.modules["audio"].kind == "audio"
    t, p = prof.sample_table(2000, seed=3), plain.sample_table(2000, seed=3)
    # the images and the text drawn are those of the profile without audio; the clips come on top
    assert np.array_equal(t.patches, p.patches) and np.array_equal(t.images, p.images)
    audio = t.encoders["audio"]
    clips = audio.items
    assert set(np.unique(clips)) == {0, 1, 2} and abs((clips == 0).mean() - 0.5) < 0.05
    assert (audio.rows[clips == 0] == 0).all() and (audio.rows[clips > 0] >= 50).all() and (audio.rows % 50 == 0).all()
    assert (audio.sq_rows >= audio.rows**2 / np.maximum(clips, 1)).all()  # Σr² >= (Σr)² / n
    one = clips == 1
    assert np.array_equal(t.placeholders["audio"][one], -(-audio.rows[one] // 4))
    assert np.array_equal(t.placeholders["audio"][clips == 0], np.zeros((clips == 0).sum()))
    two = clips == 2  # each clip's placeholders rounded up on its own
    assert (t.placeholders["audio"][two] - -(-audio.rows[two] // 4) <= 1).all()
    assert (t.placeholders["audio"][two] >= -(-audio.rows[two] // 4)).all()
    assert np.array_equal(t.tokens, t.patches // 4 + t.placeholders["audio"] + t.text_tokens)
    assert (t.tokens <= prof.seq_length).all() and (t.bytes > p.bytes)[clips > 0].all()
    # what a sample costs each module is what the planner prices from the table's cost index
    model = CostModel(a=1.0, b=0.001)
    costs = t.cost_index().module_costs(np.arange(len(t)), model, prof.modules)
    assert set(costs) == {"vision", "audio", "language"}
    assert np.allclose(costs["audio"], audio.rows + 0.001 * audio.sq_rows)
    assert np.allclose(costs["language"], t.tokens + t.tokens.astype(float) ** 2 / 8192)
    assert plain.sample_table(10).cost_index().encoders == ("vision",)
    s = prof.summary()
    assert 0.45 < s["audio_free_fraction"] < 0.55 and s["audio_clips_per_sample_mean"] > 0


def test_a_padding_extractor_makes_every_clip_cost_the_same(tmp_path):
    whisper = AUDIO.replace("rows_per_token = 4", "pad_to_seconds = 30")
    t = load_profile(_write(tmp_path, _with_audio(audio=whisper))).sample_table(500, seed=1)
    audio = t.encoders["audio"]
    assert np.array_equal(audio.rows, 1500 * audio.items) and np.array_equal(audio.sq_rows, 1500**2 * audio.items)
    assert audio.rule.rows_many([1, 20 * 50, 30 * 50]).tolist() == [1500] * 3


AUDIO_BAD = [
    (_with_audio(dp=3), ["layout.micro_batch_size", "audio dp 3", "lcm"]),
    (_with_audio().replace("audio = { dp = 2 }", ""), ["layout.audio", "missing", "add audio ="]),
    (VALID.replace("language = { tp = 2, pp = 1, dp = 2 }", "language = { tp = 2, pp = 1, dp = 2 }\naudio = { dp = 2 }"),
     ["layout.audio", "without an [audio] table"]),
    (_with_audio(audio=AUDIO.replace("rows_per_token = 4", "pad_to_seconds = 20")),
     ["audio.seconds", "longer than pad_to_seconds"]),
    (_with_audio(audio=AUDIO.replace("rows_per_second = 50", "rows_per_sec = 50")), ["audio.rows_per_sec", "unknown key"]),
    (_with_audio(audio=AUDIO.replace("rows_per_token = 4", "rows_per_token = 1")).replace("seq_length = 8192", "seq_length = 4200"),
     ["layout.seq_length", "audio tokens", "or the audio clips"]),
]


@pytest.mark.parametrize("text,expect", AUDIO_BAD, ids=[b[1][0] + "-" + str(i) for i, b in enumerate(AUDIO_BAD)])
def test_bad_audio_sections_name_the_key_and_the_fix(tmp_path, text, expect):
    path = _write(tmp_path, text)
    with pytest.raises(ProfileError) as info:
        load_profile(path)
    for part in expect:
        assert part in str(info.value), str(info.value)
