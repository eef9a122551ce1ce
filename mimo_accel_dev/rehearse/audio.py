"""A second, audio, encoder for the tiny MIMO stack: real WAV files, real log-mel features, a
Whisper-shaped megatron-core encoder.

- :func:`audio_clips` writes deterministic WAV files with ``soundfile`` (16 kHz PCM, written beside
  and renamed over, reused when present — as the stack's image files are), variable lengths.
- :class:`AudioFileFeatures` is the modality's processor in Bridge's ``MegatronMIMODataset``: it
  reads a clip's file with ``soundfile`` and runs transformers' ``WhisperFeatureExtractor`` (built
  offline: no download) on it, **without** Whisper's padding to 30 s (see its docstring).
- :class:`AudioEncoder`: Whisper's front (two 1-D convolutions over the mel frames, the second
  with stride 2, sinusoidal positions), then a megatron-core ``TransformerBlock`` with the local
  ViT layer spec (bidirectional) attending within each clip only (THD packed params through
  :func:`mimo_accel_dev.rehearse.qwen3vl.segmented_core_attention`), then a projection to the
  language model's hidden size. A clip of ``f`` mel frames becomes :func:`clip_rows` ``(f) =
  (f - 1) // 2 + 1`` rows, so its cost grows with its length (attention: with its square).

The encoder takes clip-packed input, as the vision encoder takes patch-packed images:
``input_features`` ``[Σ frames, mel bins]`` and ``frames`` ``[clips]``.
"""

from __future__ import annotations

import functools
import itertools
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import torch
from megatron.core.transformer.module import MegatronModule
from torch import nn
from torch.nn import functional as F

AUDIO_TOKEN_ID = 2046  # the audio placeholder token in input_ids (just below the image placeholder)
AUDIO_ENCODER_NAME = "whisper"  # modality_inputs[audio][AUDIO_ENCODER_NAME] = {input_features, frames}
SAMPLING_RATE = 16_000  # Whisper's
HOP_LENGTH = 160  # Whisper's: 100 mel frames per second
MEL_BINS = 80  # Whisper's (base)
MAX_POSITIONS = 1500  # Whisper's encoder positions (30 s)


def clip_rows(frames: int) -> int:
    """Encoder rows of a clip of ``frames`` mel frames: the stride-2 convolution (kernel 3, padding
    1) gives ``(frames - 1) // 2 + 1``, as Whisper's ``conv2``."""
    return (int(frames) - 1) // 2 + 1 if frames > 0 else 0


def frames_of(samples: int, hop_length: int = HOP_LENGTH) -> int:
    """Mel frames the Whisper feature extractor gives ``samples`` audio samples, unpadded."""
    return int(samples) // hop_length


# ----------------------------------------------------------------------------------------------
# Files and features
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AudioMix:
    """What :func:`audio_clips` draws: some samples have no clip; clip durations lognormal (median
    seconds, sigma), clipped to ``[min_seconds, max_seconds]``: mostly short, a tail of long ones."""

    no_audio: float = 0.3
    median_seconds: float = 0.12
    sigma: float = 0.7
    min_seconds: float = 0.03
    max_seconds: float = 0.3
    sampling_rate: int = SAMPLING_RATE

    @property
    def max_rows(self) -> int:
        """The most encoder rows (= placeholders) one clip of this mix can become."""
        return clip_rows(frames_of(round(self.max_seconds * self.sampling_rate)))


def _write_wav_once(path: Path, samples: int, rate: int, rng) -> None:
    """A deterministic clip (a few tones and some noise) at ``path`` unless it exists; atomic
    (written beside, renamed over), so ranks writing the same file at once are safe."""
    import numpy as np
    import soundfile

    if path.exists():
        return
    t = np.arange(samples) / rate
    freqs = rng.uniform(120.0, 3000.0, size=3)
    amps = rng.uniform(0.05, 0.3, size=3)
    wave = sum(a * np.sin(2 * np.pi * f * t) for a, f in zip(amps, freqs)) + 0.02 * rng.standard_normal(samples)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    soundfile.write(tmp, np.clip(wave, -1.0, 1.0).astype(np.float32), rate, subtype="PCM_16", format="WAV")
    os.replace(tmp, path)


def audio_clips(root, num_samples: int, *, seed: int = 0, mix: AudioMix = AudioMix()) -> list[Optional[str]]:
    """Per sample, the path of a real WAV file under ``root`` or None (no clip), written once.

    Deterministic in (seed, sample, mix): every rank computes the same list and may write the
    same files concurrently. A file's name carries its split seed, sample and length in samples.
    """
    import numpy as np

    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    out: list[Optional[str]] = []
    for i in range(num_samples):
        rng = np.random.default_rng([seed, i, 0xA0D10])  # a stream of its own, apart from the images'
        if float(rng.random()) < mix.no_audio:
            out.append(None)
            continue
        seconds = float(np.clip(rng.lognormal(math.log(mix.median_seconds), mix.sigma),
                                mix.min_seconds, mix.max_seconds))
        samples = max(HOP_LENGTH, int(round(seconds * mix.sampling_rate)))
        path = root / f"a{seed}-{i:06d}-{samples}.wav"
        _write_wav_once(path, samples, mix.sampling_rate, rng)
        out.append(str(path))
    return out


def whisper_feature_extractor(**kwargs: Any):
    """transformers' ``WhisperFeatureExtractor`` with Whisper's defaults (80 mel bins, 16 kHz, hop
    160, 25 ms windows); built from its arguments, nothing downloaded."""
    from transformers import WhisperFeatureExtractor

    return WhisperFeatureExtractor(**kwargs)


class AudioFileFeatures(functools.partial):
    """The audio modality's processor for Bridge's ``MegatronMIMODataset``: transformers'
    ``WhisperFeatureExtractor`` with ``padding`` bound (a ``functools.partial`` of it, so whoever
    reads the processor sees the padding it runs with), that first reads a clip's file — a path in
    the example's audio column; an array passes straight on — with ``soundfile``. It returns
    log-mel features ``[1, mel bins, frames]``.

    ``padding="longest"`` (the default here): every clip keeps its own length — ``samples // hop``
    frames, :func:`clip_rows` encoder rows and as many placeholders — instead of Whisper's
    ``"max_length"`` padding to 30 s (3000 frames, 1500 rows for every clip). With variable clips
    the audio load per sample, and so per replica, is uneven, which is what balancing every module
    has to face; a fixed 30 s pad would make every clip cost the same (and would not fit the tiny
    stack's sequence). ``padding="max_length"`` gives Whisper's own behaviour.
    Bridge's dataset finds the sampling rate here (``sampling_rate``).
    """

    def __new__(cls, feature_extractor: Any = None, padding: str = "longest"):
        if padding not in ("longest", "max_length"):
            raise ValueError(f"AudioFileFeatures: padding must be 'longest' or 'max_length', got {padding!r}")
        fe = feature_extractor if feature_extractor is not None else whisper_feature_extractor()
        return super().__new__(cls, fe, padding=padding)

    @property
    def feature_extractor(self) -> Any:
        return self.func

    @property
    def padding(self) -> str:
        return self.keywords["padding"]

    @property
    def sampling_rate(self) -> int:
        return int(self.func.sampling_rate)

    def __call__(self, audio, sampling_rate: Optional[int] = None, return_tensors: str = "pt", **kwargs: Any):
        rate = sampling_rate or self.sampling_rate
        if isinstance(audio, (str, os.PathLike)):
            import soundfile

            audio, rate = soundfile.read(audio, dtype="float32", always_2d=False)
            if audio.ndim > 1:
                audio = audio.mean(axis=1)  # down-mix to mono
        if rate != self.sampling_rate:
            raise ValueError(f"AudioFileFeatures: the clip is sampled at {rate} Hz but the feature extractor "
                             f"takes {self.sampling_rate} Hz; resample the files first")
        return super().__call__(audio, sampling_rate=rate, return_tensors=return_tensors, **kwargs)


@dataclass(frozen=True)
class ClipRows:
    """Placeholders of one audio clip: :func:`clip_rows` of its feature frames (``input_features``
    ``[mel bins, frames]`` as the dataset's processor leaves it)."""

    rows_per_placeholder = 1  # one placeholder per encoder row, as mimo_accel's cost probe counts them

    def __call__(self, modality: str, inputs: dict, cap: Optional[int]) -> Optional[int]:
        features = inputs.get("input_features") if isinstance(inputs, dict) else None
        if features is None:
            return None
        rows = clip_rows(int(torch.as_tensor(features).shape[-1]))
        if cap is not None and rows > cap:
            raise ValueError(f"modality {modality!r}: a clip of {int(torch.as_tensor(features).shape[-1])} mel "
                             f"frames gives {rows} encoder rows, more than encoder_seq_lengths[{modality!r}] = "
                             f"{cap} (shorten the clips, or raise the cap)")
        return rows


def collate_clips(samples, modality: str, mel_bins: int = MEL_BINS) -> dict:
    """``{AUDIO_ENCODER_NAME: {input_features [Σ frames, mel bins], frames [clips]}}`` of the samples'
    clips in sample order (a sample without a clip adds nothing; none at all: empty tensors)."""
    features, frames = [], []
    for n, s in enumerate(samples):
        audio = (s.get("modality_inputs") or {}).get(modality)
        if not audio:
            continue
        f = torch.as_tensor(audio["input_features"])
        if f.dim() != 2 or f.size(0) != mel_bins:
            raise ValueError(f"collate_clips: sample {n} has {modality} input_features {tuple(f.shape)}; "
                             f"expected [{mel_bins}, frames]")
        features.append(f.t().float())
        frames.append(f.size(1))
    return {AUDIO_ENCODER_NAME: {
        "input_features": torch.cat(features) if features else torch.zeros(0, mel_bins),
        "frames": torch.tensor(frames, dtype=torch.long),
    }}


# ----------------------------------------------------------------------------------------------
# Encoder
# ----------------------------------------------------------------------------------------------


def sinusoids(length: int, channels: int, max_timescale: float = 10_000.0) -> torch.Tensor:
    """Whisper's fixed sinusoidal position embeddings ``[length, channels]``."""
    if channels % 2:
        raise ValueError(f"sinusoids: channels must be even, got {channels}")
    increment = math.log(max_timescale) / (channels // 2 - 1)
    inv = torch.exp(-increment * torch.arange(channels // 2, dtype=torch.float32))
    scaled = torch.arange(length, dtype=torch.float32)[:, None] * inv[None, :]
    return torch.cat([torch.sin(scaled), torch.cos(scaled)], dim=1)


def audio_layer_spec():
    """megatron-core's local ViT layer (bidirectional, no Transformer Engine) whose core attention
    stays within each clip (THD segments)."""
    from megatron.core.models.vision.vit_layer_specs import get_vit_layer_with_local_spec

    from mimo_accel_dev.rehearse.qwen3vl import segmented_core_attention

    layer = get_vit_layer_with_local_spec()
    layer.submodules.self_attention.submodules.core_attention = segmented_core_attention()
    return layer


class AudioEncoder(MegatronModule):
    """A Whisper-shaped audio encoder: conv(k3) → GELU → conv(k3, stride 2) → GELU, sinusoidal
    positions per clip, a megatron-core ``TransformerBlock`` attending within each clip, then a
    linear projection to ``out_hidden``. Output: ``[Σ clip_rows(frames), out_hidden]``."""

    def __init__(self, transformer_config, num_mel_bins: int = MEL_BINS, out_hidden: Optional[int] = None,
                 max_positions: int = MAX_POSITIONS, pg_collection=None, **_: Any):
        from megatron.core.transformer.transformer_block import TransformerBlock

        super().__init__(config=transformer_config)
        hidden = transformer_config.hidden_size
        self.num_mel_bins = num_mel_bins
        self.conv1 = nn.Conv1d(num_mel_bins, hidden, kernel_size=3, padding=1)
        self.conv2 = nn.Conv1d(hidden, hidden, kernel_size=3, stride=2, padding=1)
        self.register_buffer("positions", sinusoids(max_positions, hidden), persistent=False)
        self.blocks = TransformerBlock(config=transformer_config, spec=audio_layer_spec(), pre_process=True,
                                       post_process=True, pg_collection=pg_collection)
        self.proj = nn.Linear(hidden, out_hidden or hidden)

    def forward(self, input_features: torch.Tensor, frames: torch.Tensor) -> torch.Tensor:
        from megatron.core.packed_seq_params import PackedSeqParams

        lengths = [int(n) for n in frames.reshape(-1).tolist()]
        if sum(lengths) != input_features.size(0) or (input_features.dim() == 2
                                                       and input_features.size(-1) != self.num_mel_bins):
            raise ValueError(f"AudioEncoder: input_features {tuple(input_features.shape)} for clips of "
                             f"{lengths} frames of {self.num_mel_bins} mel bins")
        rows, start = [], 0
        for n in lengths:  # the convolutions run clip by clip (a stride must not cross clips)
            x = input_features[start:start + n].t().unsqueeze(0)  # [1, mel bins, frames]
            x = F.gelu(self.conv2(F.gelu(self.conv1(x))))[0].t()  # [rows, hidden]
            if x.size(0) > self.positions.size(0):
                raise ValueError(f"AudioEncoder: a clip of {n} frames gives {x.size(0)} rows, more than the "
                                 f"{self.positions.size(0)} positions")
            rows.append(x + self.positions[:x.size(0)].to(x.dtype))
            start += n
        if not rows:  # no clip in this share: no rows, but a graph for the pipeline's backward
            return self.proj(self.conv1.weight.new_zeros(0, self.proj.in_features))
        counts = [r.size(0) for r in rows]
        cu = torch.tensor([0, *itertools.accumulate(counts)], dtype=torch.int32, device=rows[0].device)
        packed = PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu,
                                 max_seqlen_q=max(counts), max_seqlen_kv=max(counts))
        hidden = self.blocks(torch.cat(rows).unsqueeze(1), attention_mask=None, packed_seq_params=packed)
        return self.proj(hidden.squeeze(1))
