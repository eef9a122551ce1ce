"""How many encoder rows an audio clip becomes (:class:`AudioRule`), and a clip's length in samples
without decoding it: from the file's header (``soundfile.info``), an undecoded HF ``Audio`` cell, a
decoded ``{"array", "sampling_rate"}`` cell or a waveform array. A Whisper-style extractor makes
``n // hop_length`` log-mel frames and its encoder halves them (30 s at 16 kHz: 3000 frames, 1500
rows); Whisper pads every clip to ``chunk_length`` seconds, so every clip costs the same there.
"""

from __future__ import annotations

import io
import numbers
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from mimo_accel.costs.files import EMPTY_FILE
from mimo_accel.costs.resize import positive_int

__all__ = ["AudioRule", "AudioSizeError", "audio_clips_in", "audio_samples_of"]


class AudioSizeError(ValueError):
    """An audio clip as a dataset holds it whose length cannot be read; the message names it."""


@dataclass(frozen=True)
class AudioRule:
    """Encoder rows of one clip of ``samples`` samples (at ``sampling_rate``).

    ``frames = min(samples, max_samples) // hop_length`` (``max_samples`` when ``pad``: every clip
    padded to it); ``rows = ceil(frames / frames_per_row)``. ``frames_per_row`` is the encoder's
    downsampling of the feature frames (Whisper: 2).
    """

    sampling_rate: int
    hop_length: int
    max_samples: Optional[int] = None  # longer clips are truncated to this many samples (None: never)
    pad: bool = False  # every clip is padded to max_samples: the same rows whatever its length
    frames_per_row: int = 2

    def __post_init__(self) -> None:
        for name in ("sampling_rate", "hop_length", "frames_per_row"):
            positive_int(f"AudioRule.{name}", getattr(self, name))
        if self.max_samples is not None:
            positive_int("AudioRule.max_samples", self.max_samples)
        if not isinstance(self.pad, bool):
            raise ValueError(f"AudioRule.pad must be a bool, got {self.pad!r}")
        if self.pad and self.max_samples is None:
            raise ValueError("AudioRule.pad needs max_samples (the length every clip is padded to)")

    def frames(self, samples: int) -> int:
        """Feature frames of one clip of ``samples`` samples."""
        if isinstance(samples, bool) or not isinstance(samples, (int, np.integer)) or samples < 0:
            raise ValueError(f"samples must be a non-negative integer, got {samples!r}")
        n = int(samples)
        if self.max_samples is not None:
            n = self.max_samples if self.pad else min(n, self.max_samples)
        return n // self.hop_length

    def rows(self, samples: int) -> int:
        """Encoder rows of one clip of ``samples`` samples."""
        return -(-self.frames(samples) // self.frames_per_row)

    def rows_many(self, samples: Sequence[int] | np.ndarray) -> np.ndarray:
        """:meth:`rows` for many clips (int64)."""
        n = np.asarray(samples, dtype=np.int64).reshape(-1)
        if (n < 0).any():
            raise ValueError("clip lengths must be >= 0 samples")
        if self.max_samples is not None:
            n = np.full_like(n, self.max_samples) if self.pad else np.minimum(n, self.max_samples)
        frames = n // self.hop_length
        return -(-frames // self.frames_per_row)

    def to_dict(self) -> dict[str, Any]:
        return {"audio": {"sampling_rate": self.sampling_rate, "hop_length": self.hop_length,
                          "max_samples": self.max_samples, "pad": self.pad, "frames_per_row": self.frames_per_row}}


# --------------------------------------------------------------------------------------------
# A clip's length without decoding it
# --------------------------------------------------------------------------------------------


def _from_header(source: Any, rate: int, where: str) -> int:
    """Samples at ``rate`` of the clip a file (or file-like) holds, from its header."""
    try:
        import soundfile
    except ImportError:  # pragma: no cover - installed by the extra audio
        raise AudioSizeError(f"{where}: reading an audio file's length needs soundfile: pip install "
                             "'mimo-accel[audio]' (the extra audio), or pip install soundfile") from None
    if isinstance(source, str) and not os.path.isfile(source):  # libsndfile says only "System error"
        raise AudioSizeError(f"{where}: audio file not found: {source}")
    if isinstance(source, str) and os.path.getsize(source) == 0:  # libsndfile: "Format not recognised"
        raise AudioSizeError(f"{where}: {source}: {EMPTY_FILE}")
    try:
        info = soundfile.info(source)
    except FileNotFoundError:
        raise AudioSizeError(f"{where}: audio file not found: {source}") from None
    except Exception as exc:  # soundfile raises LibsndfileError / RuntimeError for unreadable files
        raise AudioSizeError(f"{where}: cannot read the audio header ({exc})") from None
    frames, file_rate = int(info.frames), int(info.samplerate)
    if frames < 0 or file_rate < 1:
        raise AudioSizeError(f"{where}: the audio header gives no length ({frames} frames at {file_rate} Hz)")
    return frames if file_rate == rate else (frames * rate) // file_rate


def _waveform_length(array: Any, where: str) -> int:
    shape = getattr(array, "shape", None)
    if shape is None:
        return len(array)
    shape = tuple(int(s) for s in shape)
    if len(shape) == 1:
        return shape[0]
    if len(shape) == 2 and min(shape) == 1:
        return max(shape)
    raise AudioSizeError(f"{where}: an audio array of shape {shape} is not one mono clip")


def audio_samples_of(clip: Any, rate: int, where: str = "audio") -> int:
    """Length in samples (at ``rate``, the feature extractor's) of one clip as a dataset holds it.

    Accepts a path (``file://`` allowed; its header is read with ``soundfile.info``), encoded
    bytes, an undecoded HF ``Audio`` cell ``{"bytes", "path"}``, a decoded ``{"array",
    "sampling_rate"}`` cell, or a waveform (a 1-D array or list of numbers, taken to be at
    ``rate`` as the feature extractor is called with it). URLs are refused (reading them would
    download them). Raises :class:`AudioSizeError` naming ``where``.
    """
    if isinstance(clip, (bytes, bytearray, memoryview)):
        return _from_header(io.BytesIO(bytes(clip)), rate, where)
    if isinstance(clip, Mapping):
        if clip.get("array") is not None:
            sr = clip.get("sampling_rate") or rate
            n = _waveform_length(clip["array"], where)
            return n if int(sr) == rate else (n * rate) // int(sr)
        data, path = clip.get("bytes"), clip.get("path")
        if data is not None:
            return _from_header(io.BytesIO(bytes(data)), rate, where)
        if path:
            return audio_samples_of(path, rate, where)
        raise AudioSizeError(f"{where}: an audio cell with neither an array, bytes nor a path")
    if isinstance(clip, os.PathLike):
        clip = os.fspath(clip)
    if isinstance(clip, str):
        if clip.startswith(("http://", "https://")):
            raise AudioSizeError(f"{where}: audio {clip!r} is a URL; its length cannot be read without "
                                 "downloading it. Store the audio locally, or use another way.")
        if clip.startswith("file://"):
            clip = clip[len("file://"):]
        return _from_header(clip, rate, where)
    if getattr(clip, "shape", None) is not None or (isinstance(clip, (list, tuple)) and _is_waveform(clip)):
        return _waveform_length(clip, where)
    raise AudioSizeError(f"{where}: cannot read the length of an audio clip given as {type(clip).__name__}; "
                         "give a path, bytes, an HF Audio cell or a waveform array")


def _is_waveform(value: Sequence[Any]) -> bool:
    return len(value) > 0 and all(isinstance(v, numbers.Real) and not isinstance(v, bool) for v in value[:16])


def audio_clips_in(value: Any) -> list[Any]:
    """The clips a modality cell holds: None -> none; a waveform (numbers) -> one; a list of clips
    -> each; anything else -> one."""
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        if _is_waveform(value):
            return [value]
        return [v for v in value if v is not None]
    return [value]
