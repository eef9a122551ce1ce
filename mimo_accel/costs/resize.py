"""How many vision patches (encoder rows) one image becomes: Qwen-VL's resize rule, or a
fixed-resolution processor's constant."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["FixedPatches", "ResizeRule"]

_MAX_ASPECT = 200


def positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)



@dataclass(frozen=True)
class ResizeRule:
    """Qwen2-VL's image resize rule (``smart_resize``), expressed in patches.

    An image is resized so both sides are multiples of ``patch_size * merge_size`` and its area
    lies in ``[min_pixels, max_pixels]``; the encoder then sees ``(h / patch_size) *
    (w / patch_size)`` patches. A still image is one temporal patch (t = 1).

    A video of F frames is grouped as the Qwen-VL video processors group it: its frames are
    padded (the last one repeated) to a multiple of ``temporal_patch_size`` and every
    ``temporal_patch_size`` consecutive frames become one temporal patch, t = ceil(F /
    temporal_patch_size), each of ``h·w`` rows. Qwen2-VL's video processor resizes every frame as
    an image; Qwen3-VL's counts the frames in the pixel budget (``frames_in_budget``: ``t_bar·h·w``
    in ``[min_pixels, max_pixels]``, and sides below the factor are refused). The encoder attends
    within each temporal patch (its ``cu_seqlens`` repeat ``h·w`` t times), so a video's attention
    term is ``t·(h·w)²``, not ``(t·h·w)²``.

    Follows the transformers releases this project pins (5.8 - 5.12): an aspect ratio above 200
    is refused; a side shorter than the factor is not (older releases refused that too).
    """

    patch_size: int = 14
    merge_size: int = 2
    temporal_patch_size: int = 2
    min_pixels: int = 3136
    max_pixels: int = 1003520
    frames_in_budget: bool = False  # Qwen3-VL's video processor: t_bar·h·w is what min/max pixels bound

    def __post_init__(self) -> None:
        for name in ("patch_size", "merge_size", "temporal_patch_size", "min_pixels", "max_pixels"):
            positive_int(f"ResizeRule.{name}", getattr(self, name))
        if not isinstance(self.frames_in_budget, bool):
            raise ValueError(f"ResizeRule.frames_in_budget must be a bool, got {self.frames_in_budget!r}")
        if self.min_pixels > self.max_pixels:
            raise ValueError(
                f"ResizeRule.min_pixels ({self.min_pixels}) exceeds max_pixels ({self.max_pixels});"
                " swap them or fix the processor config"
            )

    @property
    def factor(self) -> int:
        """Side lengths after resizing are multiples of this many pixels."""
        return self.patch_size * self.merge_size

    def resized(self, height: int, width: int) -> tuple[int, int]:
        """Resized (height, width) in pixels, as Qwen2-VL's ``smart_resize`` computes them."""
        height = positive_int("height", height)
        width = positive_int("width", width)
        if max(height, width) / min(height, width) > _MAX_ASPECT:
            raise ValueError(
                f"image of {height}x{width} px has an aspect ratio above {_MAX_ASPECT}; the Qwen-VL"
                " processor rejects it, so drop or crop the image"
            )
        return self._in_budget(height, width, 1, 1)

    def _in_budget(self, height: int, width: int, t_bar: int, frames: int) -> tuple[int, int]:
        """``smart_resize``'s rounding to the factor and its pixel bounds over ``t_bar·h·w`` (an
        image: t_bar = frames = 1)."""
        factor = self.factor
        h_bar = round(height / factor) * factor
        w_bar = round(width / factor) * factor
        if t_bar * h_bar * w_bar > self.max_pixels:
            beta = math.sqrt(frames * height * width / self.max_pixels)
            # max(factor, ...) as current transformers does; it only matters for tiny max_pixels.
            h_bar = max(factor, math.floor(height / beta / factor) * factor)
            w_bar = max(factor, math.floor(width / beta / factor) * factor)
        elif t_bar * h_bar * w_bar < self.min_pixels:
            beta = math.sqrt(self.min_pixels / (frames * height * width))
            h_bar = math.ceil(height * beta / factor) * factor
            w_bar = math.ceil(width * beta / factor) * factor
        return h_bar, w_bar

    def temporal_patches(self, frames: int) -> int:
        """t of a video of ``frames`` frames: the frames padded to a multiple of the temporal patch
        size, one temporal patch per ``temporal_patch_size`` frames (an image: 1)."""
        frames = positive_int("frames", frames)
        return -(-frames // self.temporal_patch_size)

    def resized_video(self, frames: int, height: int, width: int) -> tuple[int, int]:
        """Resized (height, width) of every frame of a ``frames``-frame video, as the video
        processor computes it (Qwen2-VL: :meth:`resized`; Qwen3-VL, ``frames_in_budget``: its
        video ``smart_resize`` over ``t_bar·h·w``)."""
        frames = positive_int("frames", frames)
        if not self.frames_in_budget:
            return self.resized(height, width)
        height = positive_int("height", height)
        width = positive_int("width", width)
        factor = self.factor
        if height < factor or width < factor:
            raise ValueError(f"video of {height}x{width} px has a side below {factor} px; the Qwen3-VL video "
                             "processor rejects it, so drop or upscale the video")
        if max(height, width) / min(height, width) > _MAX_ASPECT:
            raise ValueError(
                f"video of {height}x{width} px has an aspect ratio above {_MAX_ASPECT}; the Qwen-VL"
                " processor rejects it, so drop or crop the video"
            )
        return self._in_budget(height, width, self.temporal_patches(frames) * self.temporal_patch_size, frames)

    def grid_thw(self, height: int, width: int, frames: int = 1) -> tuple[int, int, int]:
        """The encoder's ``grid_thw`` for one image of ``height`` x ``width`` pixels, or (``frames``
        > 1) one video of that frame size: t = ceil(frames / temporal_patch_size)."""
        if frames == 1 and not self.frames_in_budget:
            h_bar, w_bar = self.resized(height, width)
            return 1, h_bar // self.patch_size, w_bar // self.patch_size
        h_bar, w_bar = self.resized_video(frames, height, width)
        return self.temporal_patches(frames), h_bar // self.patch_size, w_bar // self.patch_size

    def video_rows(self, frames: int, height: int, width: int) -> tuple[int, int]:
        """(encoder rows, attention term) of one video: ``(t·h·w, t·(h·w)²)``."""
        t, h, w = self.grid_thw(height, width, frames)
        return t * h * w, t * (h * w) ** 2

    def patches(self, height: int, width: int) -> int:
        """Number of vision patches (encoder rows before merging) for one image."""
        t, h, w = self.grid_thw(height, width)
        return t * h * w

    def patches_many(self, heights: Sequence[int] | np.ndarray, widths: Sequence[int] | np.ndarray) -> np.ndarray:
        """:meth:`patches` for many images at once (int64), bit-identical to the scalar rule.

        numpy's ``rint`` rounds half to even like Python's ``round``, and ``sqrt``/division are
        IEEE-exact in both, so the vectorised path cannot drift from the scalar one.
        """
        h = np.asarray(heights, dtype=np.int64)
        w = np.asarray(widths, dtype=np.int64)
        if h.shape != w.shape or h.ndim != 1:
            raise ValueError("heights and widths must be 1-D sequences of the same length")
        if h.size == 0:
            return np.zeros(0, dtype=np.int64)
        if self.frames_in_budget:  # a video rule's one-frame grid: the scalar rule
            return np.array([self.patches(int(a), int(b)) for a, b in zip(h, w)], dtype=np.int64)
        factor = self.factor
        hf, wf = h.astype(np.float64), w.astype(np.float64)
        bad = (h < 1) | (w < 1)
        if not bad.any():  # the same test as the scalar rule, once no side is zero
            bad = np.maximum(hf, wf) / np.minimum(hf, wf) > _MAX_ASPECT
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            self.resized(int(h[i]), int(w[i]))  # raises the scalar rule's message
        h_bar = np.rint(hf / factor).astype(np.int64) * factor
        w_bar = np.rint(wf / factor).astype(np.int64) * factor
        area = hf * wf
        big = h_bar * w_bar > self.max_pixels
        if big.any():
            beta = np.sqrt(area[big] / self.max_pixels)
            h_bar[big] = np.maximum(factor, np.floor(hf[big] / beta / factor).astype(np.int64) * factor)
            w_bar[big] = np.maximum(factor, np.floor(wf[big] / beta / factor).astype(np.int64) * factor)
        small = ~big & (h_bar * w_bar < self.min_pixels)
        if small.any():
            beta = np.sqrt(self.min_pixels / area[small])
            h_bar[small] = np.ceil(hf[small] * beta / factor).astype(np.int64) * factor
            w_bar[small] = np.ceil(wf[small] * beta / factor).astype(np.int64) * factor
        return (h_bar // self.patch_size) * (w_bar // self.patch_size)

    def to_dict(self) -> dict[str, int]:
        doc = {
            "patch_size": self.patch_size,
            "merge_size": self.merge_size,
            "temporal_patch_size": self.temporal_patch_size,
            "min_pixels": self.min_pixels,
            "max_pixels": self.max_pixels,
        }
        if self.frames_in_budget:  # only then: an image rule's dict (and every digest over it) has no such key
            doc["frames_in_budget"] = True
        return doc


@dataclass(frozen=True)
class FixedPatches:
    """A fixed-resolution vision processor (CLIP, SigLIP): every image becomes ``patches`` encoder
    rows whatever its size, because the processor resizes and crops it to one resolution.

    The same methods as :class:`ResizeRule` where a cost index needs them, so either can be an
    index's ``rule``.
    """

    patches_per_image: int

    def __post_init__(self) -> None:
        positive_int("FixedPatches.patches_per_image", self.patches_per_image)
        object.__setattr__(self, "patches_per_image", int(self.patches_per_image))

    def patches(self, height: int, width: int) -> int:
        """Encoder rows of one image (its size does not matter)."""
        positive_int("height", height)
        positive_int("width", width)
        return self.patches_per_image

    def patches_many(self, heights: Sequence[int] | np.ndarray, widths: Sequence[int] | np.ndarray) -> np.ndarray:
        h = np.asarray(heights, dtype=np.int64)
        w = np.asarray(widths, dtype=np.int64)
        if h.shape != w.shape or h.ndim != 1:
            raise ValueError("heights and widths must be 1-D sequences of the same length")
        return np.full(h.shape, self.patches_per_image, dtype=np.int64)

    def to_dict(self) -> dict[str, int]:
        return {"fixed_patches": self.patches_per_image}
