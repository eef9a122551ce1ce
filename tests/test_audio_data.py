"""The audio modality's data and layout, in one process: layouts with any number of encoders, real
WAV files written once, the real Whisper feature extractor without its 30 s padding, placeholders
per clip = the audio encoder's rows, the two-modality collate, and the example's --modalities."""

from __future__ import annotations

import os

import pytest
import torch

from mimo_accel.modules import LANGUAGE, Modules, module
from mimo_accel.workloads import VISION


# Files and features --------------------------------------------------------------------------------

def test_clips_are_real_wav_files_written_once_and_deterministic(tmp_path):
    import soundfile

    from mimo_accel_dev.rehearse import audio

    mix = audio.AudioMix()
    clips = audio.audio_clips(tmp_path, 40, seed=3, mix=mix)
    elsewhere = audio.audio_clips(tmp_path / "elsewhere", 40, seed=3, mix=mix)  # another rank, say
    assert [c and os.path.basename(c) for c in elsewhere] == [c and os.path.basename(c) for c in clips]
    assert [open(c, "rb").read() for c in elsewhere if c] == [open(c, "rb").read() for c in clips if c]
    paths = [c for c in clips if c is not None]
    assert 0 < len(paths) < len(clips)  # some samples have no clip
    stamps = {p: os.stat(p).st_mtime_ns for p in paths}
    assert audio.audio_clips(tmp_path, 40, seed=3, mix=mix) == clips  # reused, not rewritten
    assert {p: os.stat(p).st_mtime_ns for p in paths} == stamps
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    lengths = set()
    for p in paths:
        info = soundfile.info(p)
        assert (info.samplerate, info.channels, info.subtype) == (16_000, 1, "PCM_16")
        assert mix.min_seconds * 16_000 - 1 <= info.frames <= mix.max_seconds * 16_000 + 1
        assert p.endswith(f"-{info.frames}.wav")  # the name carries the length
        lengths.add(info.frames)
    assert len(lengths) > len(paths) // 2  # variable lengths
    assert audio.audio_clips(tmp_path, 40, seed=4, mix=mix) != clips


def test_features_keep_each_clip_its_own_length(tmp_path):
    import soundfile

    from mimo_accel_dev.rehearse import audio

    path = next(c for c in audio.audio_clips(tmp_path, 10) if c is not None)
    samples = soundfile.info(path).frames
    features = audio.AudioFileFeatures()
    out = features(path, sampling_rate=16_000, return_tensors="pt")["input_features"]
    assert tuple(out.shape) == (1, audio.MEL_BINS, samples // audio.HOP_LENGTH)
    assert torch.isfinite(out).all() and out.std() > 0
    whisper = audio.AudioFileFeatures(padding="max_length")(path)["input_features"]
    assert tuple(whisper.shape) == (1, audio.MEL_BINS, 3000)  # Whisper's own: every clip 30 s
    with pytest.raises(ValueError, match="sampled at 8000 Hz"):
        features(soundfile.read(path)[0], sampling_rate=8000)
    assert [audio.clip_rows(f) for f in (0, 1, 2, 3, 4, 30)] == [0, 1, 1, 2, 2, 15]
    assert audio.AudioMix().max_rows == audio.clip_rows(int(0.3 * 16_000) // 160)


@pytest.fixture(scope="module")
def media(tmp_path_factory):
    from mimo_accel_dev.rehearse import stack

    return stack.media_dataset(tmp_path_factory.mktemp("media"), 24, seq_length=64, image_rows=4)


def test_every_clip_gets_as_many_placeholders_as_the_encoder_gives_rows(media):
    import soundfile

    from mimo_accel_dev.rehearse import audio, stack

    assert media.encoder_seq_lengths == {VISION: 4, "audio": audio.AudioMix().max_rows}
    kinds = set()
    for i in range(len(media)):
        example, item = media.examples[i], media[i]
        ids = item["input_ids"]
        clip_tokens = int((ids == stack.AUDIO_TOKEN_ID).sum())
        image_tokens = int((ids == stack.IMAGE_TOKEN_ID).sum())
        kinds.add((example["image"] is not None, example["audio"] is not None))
        assert image_tokens == (4 if example["image"] else 0)
        if example["audio"] is None:
            assert clip_tokens == 0 and "audio" not in item["modality_inputs"]
            continue
        frames = soundfile.info(example["audio"]).frames // audio.HOP_LENGTH  # from the file's header
        assert item["modality_inputs"]["audio"]["input_features"].shape[-1] == frames
        assert clip_tokens == audio.clip_rows(frames) > 0
        assert item["sample_id"] == i
    assert kinds == {(True, True), (True, False), (False, True), (False, False)}
    assert media.mimo_accel_cost_index is None  # none carried: mimo_accel derives one when asked


def test_the_collate_packs_images_and_clips_in_sample_order(media):
    from mimo_accel_dev.rehearse import audio, stack

    items = [media[i] for i in range(8)]
    batch = stack.collate_mimo_media(items)
    clips = batch["modality_inputs"]["audio"][audio.AUDIO_ENCODER_NAME]
    with_clip = [it for it in items if "audio" in it["modality_inputs"]]
    assert clips["frames"].tolist() == [it["modality_inputs"]["audio"]["input_features"].shape[-1] for it in with_clip]
    assert tuple(clips["input_features"].shape) == (int(clips["frames"].sum()), audio.MEL_BINS)
    first = with_clip[0]["modality_inputs"]["audio"]["input_features"]
    assert torch.equal(clips["input_features"][:first.shape[-1]], first.t())
    assert sum(audio.clip_rows(f) for f in clips["frames"].tolist()) == int((batch["input_ids"] == stack.AUDIO_TOKEN_ID).sum())
    vision = batch["modality_inputs"][VISION][stack.ENCODER_NAME]
    assert vision["grid_thw"].size(0) == sum(1 for it in items if VISION in it["modality_inputs"])
    assert batch[stack.SAMPLE_ID_KEY].tolist() == list(range(8))
    none = stack.collate_mimo_media([it for it in items if "audio" not in it["modality_inputs"]][:2])
    assert none["modality_inputs"]["audio"][audio.AUDIO_ENCODER_NAME]["input_features"].shape == (0, audio.MEL_BINS)


def test_modalities_are_named_by_the_user(tmp_path):
    from mimo_accel_dev.rehearse import stack

    ds = stack.media_dataset(tmp_path, 6, seq_length=64, image_rows=4, vision="images", audio="audios")
    assert ds.modality_columns == {"images": "image", "audios": "audio"}
    assert set(ds.special_token_ids) == {"images", "audios"}
    batch = stack.collate_mimo_media([ds[i] for i in range(6)], vision="images", audio="audios")
    assert set(batch["modality_inputs"]) == {"images", "audios"}
    with pytest.raises(ValueError, match="two names"):
        stack.media_dataset(tmp_path, 2, seq_length=64, image_rows=4, vision="x", audio="x")


# The example's flags ---------------------------------------------------------------------------------

def test_the_example_names_modalities_and_lays_them_out_in_order():
    from mimo_accel_dev.rehearse import bridge_script as script

    assert script.parse_modalities("vision") == {"vision": "image"}
    assert script.parse_modalities("vision,audio") == {"vision": "image", "audio": "audio"}
    assert script.parse_modalities("audios,images") == {"audios": "audio", "images": "image"}
    assert script.parse_modalities("pix,snd") == {"pix": "image", "snd": "audio"}
    assert script.parse_modalities("snd:audio,pix:image") == {"snd": "audio", "pix": "image"}
    for bad, what in (("vision,images", "one image modality"), ("audio", "one image modality"),
                      ("vision,language", "language module"), ("vision,vision", "named twice"),
                      ("vision,x:video", "kind must be")):
        with pytest.raises(ValueError, match=what):
            script.parse_modalities(bad)

    args = script.parse_args(["--modalities", "vision,audio", "--vision-dp", "2", "--audio-dp", "1",
                              "--audio-tp", "2", "--language-dp", "4"])
    assert args.dataset == "images"  # the audio modality needs real clips
    layout = script.build_layout(args)
    assert layout == Modules.of(module(VISION, 2), module("audio", 1, tp=2), module(LANGUAGE, 4))
    assert layout.rank_offsets() == {VISION: 0, "audio": 2, LANGUAGE: 4}
    assert [m.kind for m in layout] == ["image", "audio", "text"]
    plain = script.parse_args([])
    assert plain.dataset == "synthetic" and script.build_layout(plain) == Modules.from_dp_sizes({VISION: 1, LANGUAGE: 1})


@pytest.mark.parametrize("argv, message", [
    (["--audio-dp", "2"], "name an audio modality"),
    (["--modalities", "vision,audio", "--dataset", "synthetic"], "needs real clips"),
    (["--modalities", "vision,video:movie"], "kind must be"),
])
def test_the_example_refuses_audio_flags_that_cannot_apply(argv, message, capsys):
    from mimo_accel_dev.rehearse import bridge_script as script

    with pytest.raises(SystemExit):
        script.parse_args(argv)
    assert message in capsys.readouterr().err


def test_the_derived_index_counts_the_real_tokens_of_every_sample(media):
    """The language module is balanced on real tokens (text + every item's placeholders): the cost
    index mimo_accel derives from the dataset must count what the packer will see — here the
    placeholders of a clip follow its encoder rows, which the dataset declares per modality."""
    import numpy as np
    import torch

    from mimo_accel.datasets import derive_cost_index
    from mimo_accel_dev.rehearse import stack
    from mimo_accel.sample_lengths import lengths_from_loss_mask

    assert media.mimo_accel_rows_per_placeholder == {"audio": 1}
    items = [media[i] for i in range(len(media))]
    batch = {k: torch.stack([it[k] for it in items]) for k in ("input_ids", "loss_mask")}
    real = lengths_from_loss_mask(batch, [stack.IMAGE_TOKEN_ID, stack.AUDIO_TOKEN_ID])
    index = derive_cost_index(media, cache_dir=False)
    assert index.tokens(np.arange(len(media))).tolist() == real
    assert len(set(real)) > 3
