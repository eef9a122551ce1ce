"""Per-module costs: the cost index v2 and cost model v2 (pure parts, property tests), and what a
MegatronMIMODataset's samples cost every encoder before decoding — audio clips from real WAV files
(written here with soundfile) through a real ``transformers.WhisperFeatureExtractor()``, images as
before, videos grouped as the Qwen-VL video processors group frames.
"""

from __future__ import annotations

import functools
import json
import math

import numpy as np
import pytest
import soundfile
from hypothesis import given, settings
from hypothesis import strategies as st

from mimo_accel.costs import AudioRule, CostIndex, CostModel, FixedPatches, ModuleCost, ResizeRule, rule_from_dict
from mimo_accel.costs.audio import audio_samples_of
from mimo_accel.costs.index import IndexModulesError
from mimo_accel.datasets import DeriveError, shared_index
from mimo_accel.datasets.processors import audio_rule, qwen_video_rule
from mimo_accel.modules import Modules
from mimo_accel_dev.rehearse.stack import offline_tokenizer
from tests._hypothesis import examples
from tests.test_derive import VISION_TOKEN, qwen_processor, write_image

AUDIO_TOKEN = 4

# --------------------------------------------------------------------------------------------
# Cost index v2 / cost model v2: pure parts
# --------------------------------------------------------------------------------------------

_RULES = [ResizeRule(), FixedPatches(577), AudioRule(16000, 160, 480000), AudioRule(16000, 160, 480000, pad=True),
          ResizeRule(patch_size=16, frames_in_budget=True)]


@st.composite
def indexes(draw, max_encoders=3):
    n = draw(st.integers(0, 24))
    k = draw(st.integers(1, max_encoders))
    names = draw(st.lists(st.sampled_from(["vision", "audio", "images", "audios", "video"]), min_size=k,
                          max_size=k, unique=True))
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    encoders = {}
    for name in names:
        rule = draw(st.sampled_from(_RULES))
        items = rng.integers(0, 4, n)
        per = [rng.integers(1, 3000, c) for c in items]
        rows = np.array([int(p.sum()) for p in per], dtype=np.int64)
        sq = np.array([int((p * p).sum()) for p in per], dtype=np.int64)
        encoders[name] = (items, rows, sq, rule)
    return CostIndex(rng.integers(0, 9000, n), encoders)


def _columns(index):
    every = np.arange(len(index))
    return ({m: (index.items(m, every).tolist(), index.rows(m, every).tolist(), index.sq_rows(m, every).tolist(),
                 index.rule_of(m)) for m in index.encoders}, index.tokens(every).tolist())


@settings(max_examples=examples(60), deadline=None)
@given(indexes())
def test_the_index_round_trips_through_its_file(tmp_path_factory, index):
    path = tmp_path_factory.mktemp("index") / "index.npz"
    index.save(path)
    back = CostIndex.load(path)
    assert back.mapped and not index.mapped
    assert back.encoders == index.encoders and _columns(back) == _columns(index)
    assert back.digest() == index.digest()
    assert json.loads(str(np.load(path)["header"]))["format"] == "mimo-accel-cost-index/4"


@settings(max_examples=examples(60), deadline=None)
@given(indexes(), st.floats(0, 10), st.floats(0, 1e-3), st.floats(0, 50), st.floats(0, 3), st.floats(0, 1e-3),
       st.floats(0, 50))
def test_module_costs_equal_a_direct_computation(index, a, b, k, la, lb, lk):
    names = list(index.encoders)
    model = CostModel(modules={names[0]: ModuleCost(a, b, k), "language": ModuleCost(la, lb, lk)})
    modules = Modules.from_dp_sizes({**{n: 2 for n in names}, "language": 1})
    rng = np.random.default_rng(len(index))
    picks = rng.integers(0, len(index), 16) if len(index) else np.zeros(0, np.int64)
    costs = index.module_costs(picks, model, modules)
    assert list(costs) == [*names, "language"]
    every = np.arange(len(index))
    for j, name in enumerate(names):
        co = (a, b, k) if j == 0 else (model.a, model.b, 0.0)  # the default encoder's coefficients
        rows, sq, items = index.rows(name, every), index.sq_rows(name, every), index.items(name, every)
        direct = [co[0] * rows[i] + co[1] * sq[i] + co[2] * items[i] for i in picks]
        np.testing.assert_allclose(costs[name], direct, rtol=1e-12)
    t = index.tokens(every).astype(float)
    np.testing.assert_allclose(costs["language"], [la * t[i] + lb * t[i] ** 2 + lk for i in picks], rtol=1e-12)


def test_an_index_of_several_encoders_is_asked_by_module_name():
    index = CostIndex([5, 6], {"vision": ([1, 0], [4, 0], [16, 0], ResizeRule()),
                           "audio": ([1, 1], [1500, 1500], [1500 ** 2] * 2, _RULES[3])})
    assert index.rows("vision", [0, 1]).tolist() == [4, 0] and index.rows("audio", [0, 1]).tolist() == [1500, 1500]
    assert index.rule_of("vision") == ResizeRule() and index.rule_of("audio") == _RULES[3]
    with pytest.raises(KeyError, match="no encoder 'video'"):
        index.rule_of("video")
    with pytest.raises(KeyError, match="no encoder 'video'"):
        index.rows("video", [0])
    with pytest.raises(IndexModulesError, match=r"prices the encoders \['vision', 'audio'\].*\['images'\]"):
        index.module_costs([0], CostModel(), Modules.from_dp_sizes({"images": 1, "language": 1}))
    with pytest.raises(ValueError, match="inconsistent row/item counts.*'audio', sample 1"):
        CostIndex([5, 6], {"audio": ([1, 0], [4, 3], [16, 9], _RULES[2])})
    with pytest.raises(ValueError, match="'language' is the language module"):
        CostIndex([5], {"language": ([1], [1], [1], ResizeRule())})


def test_digest_covers_every_encoder_and_the_tokens():
    base = {"vision": ([1, 0], [4, 0], [16, 0], ResizeRule()), "audio": ([1, 1], [3, 5], [9, 25], _RULES[2])}
    d = CostIndex([5, 6], base).digest()
    assert CostIndex([5, 6], dict(reversed(base.items()))).digest() == d  # order-free
    for changed in ({"audio": ([1, 1], [3, 6], [9, 36], _RULES[2])}, {"audio": ([1, 1], [3, 5], [9, 25], _RULES[3])},
                    {"audio": ([1, 2], [3, 5], [9, 25], _RULES[2])}):
        assert CostIndex([5, 6], {**base, **changed}).digest() != d
    assert CostIndex([5, 7], base).digest() != d
    renamed = {("audios" if k == "audio" else k): v for k, v in base.items()}
    assert CostIndex([5, 6], renamed).digest() != d


def test_cost_model_file_round_trip_and_older_files_refused(tmp_path):
    model = CostModel(a=2.0, b=0.003, fit={"r2": 0.9},
                      modules={"audio": ModuleCost(1e-5, 2e-9, 3e-3), "language": ModuleCost(1e-6, 1e-10, 2e-2)})
    model.to_file(tmp_path / "m.json")
    doc = json.loads((tmp_path / "m.json").read_text())
    assert doc["format"] == "mimo-accel-cost-model/3"
    assert doc["modules"]["audio"] == {"a": 1e-5, "b": 2e-9, "k": 3e-3}
    back = CostModel.from_file(tmp_path / "m.json")
    assert back == model and back.of("audio") == ModuleCost(1e-5, 2e-9, 3e-3)
    assert back.of("language").k == 2e-2  # a sample's share of what a micro-batch costs whatever its length
    assert back.of("vision") == ModuleCost(2.0, 0.003)  # no entry: the default encoder's a, b
    # files of formats 1 (a, b, c, no modules table) and 2 (a, b, c, a modules table) are refused,
    # naming the command that recreates them
    older = {"mimo-accel-cost-model/1": {}, "mimo-accel-cost-model/2": {"modules": {"language": {"a": 1, "b": 0}}}}
    for version, (found, extra) in enumerate(older.items(), start=1):
        path = tmp_path / f"v{version}.json"
        path.write_text(json.dumps({"format": found, "a": 3.0, "b": 0.5, "c": 0, **extra}))
        with pytest.raises(ValueError) as err:
            CostModel.from_file(path)
        assert str(err.value) == (f"{path}: expected \"format\": \"mimo-accel-cost-model/3\", found "
                                  f"'{found}'; recreate it with `mimo-accel calibrate`")
    (tmp_path / "bad.json").write_text(json.dumps({"format": "mimo-accel-cost-model/3", "a": 3.0, "b": 0.5,
                                                   "layers": {}}))
    with pytest.raises(ValueError, match=r"unknown keys \['layers'\]"):
        CostModel.from_file(tmp_path / "bad.json")
    for bad, message in (({"audio": {"a": 1}}, "needs a and b"),
                         ({"audio": {"a": -1, "b": 0}}, "ModuleCost|must be finite")):
        with pytest.raises(ValueError, match=message):
            CostModel(modules=bad)


@settings(max_examples=examples(80), deadline=None)
@given(st.integers(0, 2_000_000), st.sampled_from([8000, 16000, 44100]), st.sampled_from([128, 160, 320]),
       st.one_of(st.none(), st.integers(1, 1_000_000)), st.booleans(), st.integers(1, 4))
def test_audio_rule_rows(samples, rate, hop, cap, pad, per_row):
    if pad and cap is None:
        with pytest.raises(ValueError, match="pad needs max_samples"):
            AudioRule(rate, hop, cap, pad, per_row)
        return
    rule = AudioRule(rate, hop, cap, pad, per_row)
    n = cap if pad else (samples if cap is None else min(samples, cap))
    assert rule.rows(samples) == math.ceil((n // hop) / per_row)
    assert rule.rows_many([samples, samples]).tolist() == [rule.rows(samples)] * 2
    assert rule_from_dict(rule.to_dict()) == rule


# --------------------------------------------------------------------------------------------
# Video: frames grouped as the Qwen-VL video processors group them
# --------------------------------------------------------------------------------------------


def _qwen3_video_smart_resize():
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import smart_resize  # needs no torchvision

    return smart_resize


@settings(max_examples=examples(300), deadline=None)
@given(st.integers(1, 200), st.integers(32, 3000), st.integers(32, 3000), st.sampled_from([1, 2, 3]))
def test_qwen3_video_grid_matches_transformers(frames, h, w, tps):
    if max(h, w) / min(h, w) > 200:
        return
    rule = ResizeRule(patch_size=16, merge_size=2, temporal_patch_size=tps, min_pixels=128 * 32 * 32,
                      max_pixels=768 * 32 * 32, frames_in_budget=True)
    hb, wb = _qwen3_video_smart_resize()(frames, h, w, temporal_factor=tps, factor=32, min_pixels=rule.min_pixels,
                                         max_pixels=rule.max_pixels)
    t = math.ceil(frames / tps)  # the processor repeats the last frame up to a multiple of tps
    assert rule.grid_thw(h, w, frames) == (t, hb // 16, wb // 16)
    rows, sq = rule.video_rows(frames, h, w)
    assert rows == t * (hb // 16) * (wb // 16) and sq == t * ((hb // 16) * (wb // 16)) ** 2


@settings(max_examples=examples(200), deadline=None)
@given(st.integers(1, 64), st.integers(1, 3000), st.integers(1, 3000))
def test_qwen2_video_frames_are_resized_as_images_and_grouped_in_time(frames, h, w):
    rule = ResizeRule()
    if max(h, w) / min(h, w) > 200:
        with pytest.raises(ValueError, match="aspect ratio"):
            rule.grid_thw(h, w, frames)
        return
    _, gh, gw = rule.grid_thw(h, w)  # an image: t = 1
    assert rule.grid_thw(h, w, frames) == (math.ceil(frames / 2), gh, gw)
    assert rule.temporal_patches(frames) > 1 or frames <= 2
    # one video of t temporal patches costs t frames' rows, but attends within each
    assert rule.video_rows(frames, h, w) == (math.ceil(frames / 2) * gh * gw, math.ceil(frames / 2) * (gh * gw) ** 2)


def test_a_video_rule_round_trips_and_image_rules_keep_their_dict():
    assert "frames_in_budget" not in ResizeRule().to_dict()
    rule = ResizeRule(patch_size=16, frames_in_budget=True)
    assert rule_from_dict(rule.to_dict()) == rule
    with pytest.raises(ValueError, match="side below 32"):
        rule.grid_thw(20, 400, 4)


# --------------------------------------------------------------------------------------------
# MegatronMIMODataset: every modality column costed with its own processor
# --------------------------------------------------------------------------------------------


class PathAudio:
    """What a dataset's audio processor looks like when its column holds file paths: it reads the
    file and hands the waveform to a real feature extractor (as ``WhisperProcessor`` holds one)."""

    def __init__(self, feature_extractor):
        self.feature_extractor = feature_extractor

    def __call__(self, path, **kwargs):
        wave, rate = soundfile.read(path, dtype="float32")
        assert rate == kwargs.get("sampling_rate", rate) == 16000
        return self.feature_extractor(wave, **kwargs)


def write_wav(path, seconds: float, rate: int = 16000):
    t = np.arange(int(seconds * rate)) / rate
    soundfile.write(path, (0.1 * np.sin(2 * np.pi * 440 * t)).astype(np.float32), rate)
    return str(path)


def av_dataset(examples, audio_processor, *, image_processor=None, seq_length=64):
    from megatron.bridge.data.megatron_mimo.dataset import MegatronMIMODataset

    return MegatronMIMODataset(
        examples=examples, processors={"vision": image_processor or qwen_processor(), "audio": audio_processor},
        tokenizer=offline_tokenizer(), seq_length=seq_length,
        special_token_ids={"vision": VISION_TOKEN, "audio": AUDIO_TOKEN},
        encoder_seq_lengths={"vision": 5, "audio": 7}, modality_columns={"vision": "image", "audio": "audio"})


def av_examples(root):
    sizes = [(100, 60), (640, 480), None, (33, 900), None]
    seconds = [2.5, None, 31.0, 0.4, None]
    out = []
    for i, (size, sec) in enumerate(zip(sizes, seconds)):
        ex = {"text": "describe what you hear " * (i + 1)}
        if size is not None:
            ex["image"] = str(write_image(root / f"{i}.png", *size))
        if sec is not None:
            ex["audio"] = write_wav(root / f"{i}.wav", sec)
        out.append(ex)
    return out


def av_ground_truth(ds):
    """Per module, from the dataset's own __getitem__ (decoding everything): items, rows per
    sample, and num_real_tokens."""
    truth = {"vision": [], "audio": [], "tokens": []}
    for i in range(len(ds)):
        item = ds[i]
        mi = item["modality_inputs"]
        truth["vision"].append(int(mi["vision"]["image_grid_thw"].prod()) if "vision" in mi else 0)
        # Whisper's encoder halves the mel frames (a stride-2 convolution)
        truth["audio"].append(math.ceil(mi["audio"]["input_features"].shape[-1] / 2) if "audio" in mi else 0)
        truth["tokens"].append(ds._tokenize_with_placeholders(ds.examples[i].get("text", ""), mi)[1])
    return truth


def test_audio_and_image_columns_are_costed_each_by_its_own_processor(tmp_path):
    from transformers import WhisperFeatureExtractor

    ds = av_dataset(av_examples(tmp_path), PathAudio(WhisperFeatureExtractor()))
    index = shared_index.derive_cost_index(ds, cache_dir=False)
    every = np.arange(len(ds))
    truth = av_ground_truth(ds)
    assert index.encoders == ("vision", "audio")
    assert index.rows("vision", every).tolist() == truth["vision"]
    # Whisper pads every clip to 30 s: 3000 mel frames, 1500 encoder rows, whatever its length; none: 0
    assert index.rows("audio", every).tolist() == truth["audio"] == [1500, 0, 1500, 1500, 0]
    assert index.items("audio", every).tolist() == [1, 0, 1, 1, 0]
    assert index.sq_rows("audio", every).tolist() == [1500 ** 2, 0, 1500 ** 2, 1500 ** 2, 0]
    # the language column: text + every present modality's placeholders, as the dataset counts them
    assert index.tokens(every).tolist() == truth["tokens"]
    assert index.rule_of("audio") == AudioRule(16000, 160, 480000, pad=True)
    # the planner prices each module with its own column
    costs = index.module_costs(every, CostModel(), Modules.from_dp_sizes({"vision": 1, "audio": 1, "language": 1}))
    assert (costs["audio"] > 0).tolist() == [True, False, True, True, False]


def test_variable_length_clips_cost_their_own_length(tmp_path):
    from transformers import WhisperFeatureExtractor

    # a partial that asks Whisper for the clip's own length (still cut at 30 s); waveforms in the column
    longest = functools.partial(WhisperFeatureExtractor(), padding="longest")
    examples = av_examples(tmp_path)
    for ex in examples:
        if "audio" in ex:
            ex["audio"] = soundfile.read(ex["audio"], dtype="float32")[0]
    ds = av_dataset(examples, longest)
    index = shared_index.derive_cost_index(ds, cache_dir=False)
    truth = av_ground_truth(ds)
    every = np.arange(len(ds))
    assert index.rows("audio", every).tolist() == truth["audio"]  # 2.5 s -> 125 rows, 31 s cut at 30 s
    assert truth["audio"][0] == 125 and truth["audio"][2] == 1500
    assert index.rule_of("audio") == AudioRule(16000, 160, 480000, pad=False)
    # the same from the files' headers, the partial held as the processor's feature extractor
    ds = av_dataset(av_examples(tmp_path), PathAudio(longest))
    index = shared_index.derive_cost_index(ds, cache_dir=False)
    assert index.rows("audio", every).tolist() == av_ground_truth(ds)["audio"] == truth["audio"]


def test_an_hf_audio_column_is_read_from_the_file_headers(tmp_path, monkeypatch):
    import datasets
    from transformers import WhisperFeatureExtractor

    from megatron.bridge.data.megatron_mimo.dataset import MegatronMIMODataset

    seconds = [1.0, None, 3.3, 0.5]
    hf = datasets.Dataset.from_dict({
        "audio": [write_wav(tmp_path / f"{i}.wav", s) if s else None for i, s in enumerate(seconds)],
        "text": ["a b c"] * 4}).cast_column("audio", datasets.Audio())
    fe = functools.partial(WhisperFeatureExtractor(), padding="longest")
    ds = MegatronMIMODataset(examples=hf, processors={"audio": fe}, tokenizer=offline_tokenizer(), seq_length=32,
                             special_token_ids={"audio": AUDIO_TOKEN}, encoder_seq_lengths={"audio": 7},
                             modality_columns={"audio": "audio"})
    read = []
    real_info = soundfile.info
    monkeypatch.setattr(soundfile, "info", lambda f: read.append(f) or real_info(f))
    index = shared_index.derive_cost_index(ds, cache_dir=False)
    assert len(read) == 3  # one header per clip; nothing decoded
    assert index.rows("audio", np.arange(4)).tolist() == [50, 0, 165, 25]
    assert index.tokens(np.arange(4)).tolist()[1] < index.tokens(np.arange(4)).tolist()[0]  # no placeholders


def test_audio_clip_forms_and_errors(tmp_path):
    path = write_wav(tmp_path / "a.wav", 0.5)
    data = open(path, "rb").read()
    soundfile.write(tmp_path / "b.flac", np.zeros(22050, np.float32), 44100)
    for form in (path, "file://" + path, data, {"bytes": data, "path": None}, {"bytes": None, "path": path},
                 {"array": np.zeros(8000), "sampling_rate": 16000}, np.zeros(8000), [0.0] * 8000):
        assert audio_samples_of(form, 16000) == 8000, form
    assert audio_samples_of(str(tmp_path / "b.flac"), 16000) == 8000  # 0.5 s at 44.1 kHz, counted at 16 kHz
    for bad, message in ((str(tmp_path / "missing.wav"), "not found"), ("https://x/y.wav", "URL"),
                         (b"not audio", "cannot read the audio header"), ({}, "neither an array"),
                         (object(), "cannot read the length")):
        with pytest.raises(ValueError, match=message):
            audio_samples_of(bad, 16000, "sample 3")


def test_a_missing_clip_is_named_and_other_extractors_are_refused(tmp_path):
    from transformers import Wav2Vec2FeatureExtractor, WhisperFeatureExtractor

    ex = [{"text": "a", "image": str(write_image(tmp_path / "i.png", 40, 40)), "audio": str(tmp_path / "gone.wav")}]
    with pytest.raises(DeriveError, match="sample 0, column 'audio'.*not found"):
        shared_index.derive_cost_index(av_dataset(ex, PathAudio(WhisperFeatureExtractor())), cache_dir=False)
    with pytest.raises(DeriveError, match="modality 'audio'.*Wav2Vec2FeatureExtractor.*Three ways out"):
        shared_index.derive_cost_index(av_dataset(ex, Wav2Vec2FeatureExtractor()), cache_dir=False)
    assert audio_rule(WhisperFeatureExtractor(chunk_length=10)) == AudioRule(16000, 160, 160000, pad=True)


def _video_processor(**overrides):
    """A stand-in for transformers' Qwen3VLVideoProcessor, which needs torchvision (not installed
    here): the real class's settings and module (whose smart_resize counts frames), nothing run."""
    from transformers.models.qwen3_vl import video_processing_qwen3_vl as real

    attrs = {k: getattr(real.Qwen3VLVideoProcessor, k) for k in
             ("patch_size", "temporal_patch_size", "merge_size", "model_input_names", "do_sample_frames")}
    attrs["size"] = dict(real.Qwen3VLVideoProcessor.size)
    attrs.update(overrides)
    return type("Qwen3VLVideoProcessor", (), {**attrs, "__module__": real.__name__})()


def test_videos_are_grouped_in_time_before_decoding(tmp_path):
    from megatron.bridge.data.megatron_mimo.dataset import MegatronMIMODataset

    proc = _video_processor(do_sample_frames=False)
    rule = qwen_video_rule(proc)
    assert rule.frames_in_budget and rule.patch_size == 16 and rule.min_pixels == 128 * 32 * 32
    frames = [str(write_image(tmp_path / f"f{k}.png", 320, 240)) for k in range(5)]
    examples = [{"video": np.zeros((7, 240, 320, 3), np.uint8), "text": "a"},  # (T, H, W, C)
                {"video": np.zeros((4, 3, 64, 96), np.uint8), "text": "b"},  # (T, C, H, W)
                {"video": frames, "text": "c"},  # a list of frames
                {"video": [np.zeros((2, 64, 64, 3)), np.zeros((9, 64, 64, 3))], "text": "d"},  # two videos
                {"text": "e"}]
    ds = MegatronMIMODataset(examples=examples, processors={"video": proc}, tokenizer=offline_tokenizer(),
                             seq_length=32, special_token_ids={"video": 9}, encoder_seq_lengths={"video": 4},
                             modality_columns={"video": "video"})
    index = shared_index.derive_cost_index(ds, cache_dir=False)
    every = np.arange(5)
    expected = [rule.video_rows(7, 240, 320), rule.video_rows(4, 64, 96), rule.video_rows(5, 240, 320),
                tuple(map(sum, zip(rule.video_rows(2, 64, 64), rule.video_rows(9, 64, 64)))), (0, 0)]
    assert index.rows("video", every).tolist() == [e[0] for e in expected]
    assert index.sq_rows("video", every).tolist() == [e[1] for e in expected]
    assert index.items("video", every).tolist() == [1, 1, 1, 2, 0]
    t, h, w = rule.grid_thw(240, 320, 7)
    assert t == 4 and index.rows("video", [0]).tolist() == [t * h * w]  # not 7 separate t = 1 frames


def test_videos_that_cannot_be_costed_are_refused_with_the_fix(tmp_path):
    from megatron.bridge.data.megatron_mimo.dataset import MegatronMIMODataset

    def ds(proc, cell):
        return MegatronMIMODataset(examples=[{"video": cell, "text": "a"}], processors={"video": proc},
                                   tokenizer=offline_tokenizer(), seq_length=32, special_token_ids={},
                                   encoder_seq_lengths={}, modality_columns={"video": "video"})

    with pytest.raises(DeriveError, match="samples frames itself.*do_sample_frames=False.*Three ways out"):
        shared_index.derive_cost_index(ds(_video_processor(), np.zeros((4, 64, 64, 3))), cache_dir=False)
    with pytest.raises(DeriveError, match="a video file.*cannot be counted without decoding.*Three ways out"):
        shared_index.derive_cost_index(ds(_video_processor(do_sample_frames=False), str(tmp_path / "v.mp4")),
                                       cache_dir=False)
