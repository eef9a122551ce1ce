"""A workload profile and what it draws: samples as arrays (:class:`SampleTable`), as shapes, as a
cost index of every encoder, and the CPU-sized rehearsal samples. Pure: numpy only. The file a
profile is read from: :mod:`mimo_accel.workloads.loading`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mimo_accel.costs import AudioRule, CostIndex, CostModel, EncoderColumns, ResizeRule, SampleShape
from mimo_accel.modules import Modules
from mimo_accel.workloads.dist import Dist




#: The encoder module names of a profile's layout: its ``[images]``, ``[audio]`` and ``[video]`` encoders.
VISION, AUDIO, VIDEO = "vision", "audio", "video"


@dataclass(frozen=True)
class RehearsalSample:
    """One rehearsal sample: image grids ``(h, w)`` in patches and its text tokens.

    Field names match :class:`mimo_accel_dev.rehearse.stack.SampleSpec`, so ``SampleSpec(s.images,
    s.text_tokens)`` converts one.
    """

    images: tuple[tuple[int, int], ...]
    text_tokens: int

    @property
    def patches(self) -> int:
        return sum(h * w for h, w in self.images)

    @property
    def sq_patches(self) -> int:
        return sum((h * w) ** 2 for h, w in self.images)


@dataclass(frozen=True)
class Rehearsal:
    """The ``[rehearsal]`` table: a CPU-sized version of the profile (image sides in patches)."""

    steps: int
    modules: Modules
    micro_batch_size: int
    seq_length: int
    merge_size: int
    image_count: Dist
    height: Dist
    width: Dist
    text_tokens: Dist


@dataclass(frozen=True)
class SampleTable:
    """Many sampled samples as arrays (what :meth:`Profile.sample_table` returns).

    Per sample (length n): ``text_tokens``, ``tokens`` (real language tokens: every encoder's
    placeholders + text), ``bytes`` (encoded size); ``encoders`` maps each encoder module of the
    layout to its per-sample :class:`~mimo_accel.costs.EncoderColumns` (items, rows, Σ rows²,
    rule) and ``placeholders`` to its placeholder tokens per sample. Per image (length Σ images,
    in sample order): ``heights``, ``widths`` (pixels), ``image_patches``.
    """

    text_tokens: np.ndarray
    tokens: np.ndarray
    bytes: np.ndarray
    heights: np.ndarray
    widths: np.ndarray
    image_patches: np.ndarray
    rule: ResizeRule
    encoders: Mapping[str, EncoderColumns]
    placeholders: Mapping[str, np.ndarray]

    def __len__(self) -> int:
        return int(self.tokens.size)

    @property
    def images(self) -> np.ndarray:
        """Images per sample (the vision encoder's items)."""
        return self.encoders[VISION].items

    @property
    def patches(self) -> np.ndarray:
        """Σ patches of each sample's images (the vision encoder's rows)."""
        return self.encoders[VISION].rows

    @property
    def sq_patches(self) -> np.ndarray:
        """Σ patches² of each sample's images (the vision encoder's attention term)."""
        return self.encoders[VISION].sq_rows

    def shapes(self) -> list[SampleShape]:
        out = []
        ends = np.cumsum(self.images).tolist()
        hs, ws = self.heights.tolist(), self.widths.tolist()
        start = 0
        for end, tokens in zip(ends, self.tokens.tolist()):
            out.append(SampleShape(tuple(zip(hs[start:end], ws[start:end])), tokens))
            start = end
        return out

    def cost_index(self) -> CostIndex:
        """The samples as a cost index of every encoder: what the planner prices at run time
        (:meth:`~mimo_accel.costs.CostIndex.module_costs`)."""
        return CostIndex(self.tokens, self.encoders)

    def costs(self, model: CostModel | None = None) -> np.ndarray:
        """The vision encoder's cost of each sample under ``model`` (default :class:`CostModel`), as
        the planner prices it from :meth:`cost_index`."""
        model = CostModel() if model is None else model
        return model.encoder_costs(VISION, self.patches, self.sq_patches, self.images)


@dataclass(frozen=True)
class AudioProfile:
    """The optional ``[audio]`` table: a second encoder's clips (its keys: :mod:`~mimo_accel.workloads.loading`)."""

    count: Dist
    seconds: Dist
    rows_per_second: int
    pad_to_seconds: int | None
    rows_per_token: int
    bytes_per_second: float

    def clip_rows(self, seconds: np.ndarray) -> np.ndarray:
        """Encoder rows of clips of ``seconds`` (the padded length where the extractor pads)."""
        s = np.asarray(seconds, dtype=np.int64)
        if self.pad_to_seconds is not None:
            s = np.full_like(s, self.pad_to_seconds)
        return s * self.rows_per_second

    def clip_tokens(self, rows: np.ndarray) -> np.ndarray:
        return -(-np.asarray(rows, dtype=np.int64) // self.rows_per_token)

    @property
    def max_tokens(self) -> int:
        """The most placeholder tokens a sample's clips can take."""
        return self.count.max * int(self.clip_tokens(self.clip_rows(np.array([self.seconds.max])))[0])

    @property
    def rule(self) -> AudioRule:
        """:meth:`clip_rows` as a cost index's rule: a clip's "samples" are its rows' worth of seconds."""
        pad = self.pad_to_seconds
        return AudioRule(sampling_rate=self.rows_per_second, hop_length=1, frames_per_row=1,
                         max_samples=None if pad is None else pad * self.rows_per_second, pad=pad is not None)


@dataclass(frozen=True)
class VideoProfile:
    """The optional ``[video]`` table: a video encoder's videos (its keys: :mod:`~mimo_accel.workloads.loading`)."""

    count: Dist
    frames: Dist
    height: Dist
    width: Dist
    bytes_per_pixel: float

    def rows(self, rule: ResizeRule, frames: np.ndarray, heights: np.ndarray,
             widths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(encoder rows, attention term) of each video: ``t·p`` and ``t·p²``, p a frame's patches."""
        t = -(-np.asarray(frames, dtype=np.int64) // rule.temporal_patch_size)
        p = rule.patches_many(heights, widths)
        return t * p, t * p * p

    def max_tokens(self, rule: ResizeRule) -> int:
        """The most placeholder tokens a sample's videos can take."""
        t = -(-self.frames.max // rule.temporal_patch_size)
        return self.count.max * t * max_patches(rule, None, self.height, self.width) // rule.merge_size**2


@dataclass(frozen=True)
class Profile:
    """A workload profile (its keys: :mod:`~mimo_accel.workloads.loading`)."""

    name: str
    description: str
    path: Path | None
    image_count: Dist
    height: Dist | None
    width: Dist | None
    size: Dist | None
    bytes_per_pixel: float
    text_tokens: Dist
    bytes_per_token: float
    rule: ResizeRule
    modules: Modules
    micro_batch_size: int
    seq_length: int
    rehearsal: Rehearsal
    raw: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)
    audio: AudioProfile | None = None
    video: VideoProfile | None = None

    # -- sampling ------------------------------------------------------------------------------

    @property
    def image_tokens_divisor(self) -> int:
        return self.rule.merge_size**2

    def sample_table(self, n: int, seed: int = 0) -> SampleTable:
        """``n`` samples drawn from the profile, as arrays; deterministic in ``(n, seed)``."""
        n = _count_arg(n)
        rng = np.random.default_rng([int(seed), 0x5A3D])
        counts = self.image_count.draw(rng, n)
        total = int(counts.sum())
        if self.size is not None:
            hw = self.size.draw(rng, total).reshape(total, 2)
            heights, widths = hw[:, 0].copy(), hw[:, 1].copy()
        elif total:
            heights, widths = self.height.draw(rng, total), self.width.draw(rng, total)  # type: ignore[union-attr]
        else:
            heights = widths = np.zeros(0, dtype=np.int64)
        text = self.text_tokens.draw(rng, n)
        per_image = self.rule.patches_many(heights, widths)
        owner = np.repeat(np.arange(n), counts)
        encoders = {VISION: _encoder_columns(owner, counts, per_image, self.rule)}
        placeholders = {VISION: encoders[VISION].rows // self.image_tokens_divisor}
        audio_bytes = np.zeros(n, dtype=np.float64)
        if self.audio is not None:
            # drawn after everything a profile without audio draws: its samples stay the same
            arng = np.random.default_rng([int(seed), 0xA0D1])
            clips = self.audio.count.draw(arng, n)
            seconds = self.audio.seconds.draw(arng, int(clips.sum()))
            clip_owner = np.repeat(np.arange(n), clips)
            rows = self.audio.clip_rows(seconds)
            encoders[AUDIO] = _encoder_columns(clip_owner, clips, rows, self.audio.rule)
            placeholders[AUDIO] = _per_sample(clip_owner, self.audio.clip_tokens(rows), n)
            audio_bytes = _per_sample(clip_owner, seconds, n) * self.audio.bytes_per_second
        video_bytes = np.zeros(n, dtype=np.float64)
        if self.video is not None:
            # drawn after everything else: the samples of a profile without video stay the same
            vrng = np.random.default_rng([int(seed), 0x71DE])
            videos = self.video.count.draw(vrng, n)
            total_videos = int(videos.sum())
            frames = self.video.frames.draw(vrng, total_videos)
            vh, vw = self.video.height.draw(vrng, total_videos), self.video.width.draw(vrng, total_videos)
            video_owner = np.repeat(np.arange(n), videos)
            rows, sq_rows = self.video.rows(self.rule, frames, vh, vw)
            encoders[VIDEO] = _encoder_columns(video_owner, videos, rows, self.rule, sq_rows)
            placeholders[VIDEO] = encoders[VIDEO].rows // self.image_tokens_divisor
            video_bytes = _per_sample(video_owner, frames * vh * vw, n) * self.video.bytes_per_pixel
        placed = sum(placeholders.values())
        text = np.clip(self.seq_length - placed, 0, text)
        pixels = _per_sample(owner, heights * widths, n)
        nbytes = pixels * self.bytes_per_pixel + text * self.bytes_per_token + audio_bytes + video_bytes
        return SampleTable(
            text_tokens=text, tokens=placed + text, bytes=nbytes, heights=heights, widths=widths,
            image_patches=per_image, rule=self.rule, encoders=encoders, placeholders=placeholders,
        )

    def sample_shapes(self, n: int, seed: int = 0) -> list[SampleShape]:
        """``n`` samples as :class:`~mimo_accel.costs.SampleShape` (pixels, real tokens)."""
        return self.sample_table(n, seed).shapes()

    def cost_index(self, n: int, seed: int = 0) -> CostIndex:
        """A :class:`~mimo_accel.costs.CostIndex` of ``n`` sampled samples."""
        return self.sample_table(n, seed).cost_index()

    def rehearsal_shapes(self, n: int, seed: int = 0) -> list[RehearsalSample]:
        """``n`` rehearsal samples (sides in patches, multiples of ``merge_size``); deterministic."""
        n = _count_arg(n)
        r = self.rehearsal
        rng = np.random.default_rng([int(seed), 0x2E4E])
        counts = r.image_count.draw(rng, n)
        total = int(counts.sum())
        m = r.merge_size
        hs = _round_up(r.height.draw(rng, total), m).tolist()
        ws = _round_up(r.width.draw(rng, total), m).tolist()
        text = r.text_tokens.draw(rng, n).tolist()
        out, start = [], 0
        for count, t in zip(counts.tolist(), text):
            images = tuple(zip(hs[start:start + count], ws[start:start + count]))
            start += count
            rows = sum(h * w for h, w in images) // (m * m)
            out.append(RehearsalSample(images, int(min(t, r.seq_length - rows))))
        return out

    def summary(self) -> dict[str, Any]:
        """A few headline numbers of the profile (from 4096 samples, seed 0)."""
        t = self.sample_table(4096, 0)
        return {
            "name": self.name,
            "images_per_sample_mean": float(t.images.mean()),
            "text_only_fraction": float((t.images == 0).mean()),
            "patches_per_sample_mean": float(t.patches.mean()),
            "patches_per_image_p50": float(np.median(t.image_patches)) if t.image_patches.size else 0.0,
            "patches_per_image_max": int(t.image_patches.max()) if t.image_patches.size else 0,
            "tokens_per_sample_mean": float(t.tokens.mean()),
            "bytes_per_sample_mean": float(t.bytes.mean()),
            **({"audio_clips_per_sample_mean": float(t.encoders[AUDIO].items.mean()),
                "audio_rows_per_sample_mean": float(t.encoders[AUDIO].rows.mean()),
                "audio_free_fraction": float((t.encoders[AUDIO].items == 0).mean())} if AUDIO in t.encoders else {}),
            **({"videos_per_sample_mean": float(t.encoders[VIDEO].items.mean()),
                "video_rows_per_sample_mean": float(t.encoders[VIDEO].rows.mean()),
                "video_free_fraction": float((t.encoders[VIDEO].items == 0).mean())} if VIDEO in t.encoders else {}),
        }


def _count_arg(n: int) -> int:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
        raise ValueError(f"n must be a non-negative integer, got {n!r}")
    return int(n)


def _per_sample(owner: np.ndarray, values: np.ndarray, n: int) -> np.ndarray:
    out = np.zeros(n, dtype=np.int64)
    np.add.at(out, owner, values.astype(np.int64))
    return out


def _encoder_columns(owner: np.ndarray, counts: np.ndarray, item_rows: np.ndarray, rule: Any,
                     item_sq_rows: np.ndarray | None = None) -> EncoderColumns:
    """One encoder's per-sample columns from its items' rows and attention terms (default rows²;
    ``owner``: each item's sample)."""
    n = counts.size
    rows = _per_sample(owner, item_rows, n)
    sq_rows = _per_sample(owner, item_rows * item_rows if item_sq_rows is None else item_sq_rows, n)
    for a in (counts, rows, sq_rows):
        a.setflags(write=False)
    return EncoderColumns(counts, rows, sq_rows, rule)


def _round_up(x: np.ndarray, m: int) -> np.ndarray:
    return -(-x // m) * m


def max_patches(rule: ResizeRule, size: Dist | None, height: Dist | None, width: Dist | None) -> int:
    """The most patches one image of the profile can have (0 without images)."""
    if size is not None:
        return max(rule.patches(h, w) for h, w in size.values)
    if height is None or width is None:
        return 0
    # The resize rule is not monotone in each side (the min/max-pixel rescaling trades one side for
    # the other), so probe a geometric grid over the ranges, corners included.
    hs = np.unique(np.rint(np.geomspace(height.min, height.max, 48)).astype(np.int64))
    ws = np.unique(np.rint(np.geomspace(width.min, width.max, 48)).astype(np.int64))
    hh, ww = np.meshgrid(hs, ws)
    return int(rule.patches_many(hh.ravel(), ww.ravel()).max())
