"""The rules of HF processors: Qwen-VL's image resize (:func:`qwen_resize_rule`) and video grouping
(:func:`qwen_video_rule`), qwen_vl_utils' fetch resize that a Qwen collate applies first
(:class:`QwenFetchResize`), Whisper-style audio feature extractors (:func:`audio_rule`), and
fixed-resolution processors told apart."""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
import sys
from dataclasses import dataclass
from typing import Any, Mapping, Optional

from mimo_accel.costs import AudioRule, ResizeRule
from mimo_accel.datasets.sources import WAYS_OUT, DeriveError

__all__ = ["QwenFetchResize", "audio_rule", "qwen_resize_rule", "qwen_video_rule"]


def _field(obj: Any, name: str) -> Any:
    """``obj.name`` or ``obj[name]`` (transformers' SizeDict is both; older releases use dicts)."""
    if obj is None:
        return None
    value = getattr(obj, name, None)
    if value is None and isinstance(obj, Mapping):
        value = obj.get(name)
    return value


def _image_processor(processor: Any) -> Any:
    return getattr(processor, "image_processor", None) or processor


def _side(value: Any, what: str, owner: str) -> int:
    if isinstance(value, Mapping) or hasattr(value, "height"):
        h, w = _field(value, "height"), _field(value, "width")
        if h != w:
            raise DeriveError(f"{owner}: non-square {what} {h}x{w} is not supported")
        value = h
    return int(value)


def qwen_resize_rule(processor: Any, *, min_pixels: Optional[int] = None,
                     max_pixels: Optional[int] = None) -> Optional[ResizeRule]:
    """The :class:`ResizeRule` of a Qwen2-VL-style image processor (Qwen2/2.5/3/3.5-VL: it has
    ``patch_size`` and ``merge_size``), or None for any other processor.

    ``processor`` may be the image processor or a processor holding one (``.image_processor``).
    min/max pixels: the arguments when given (a collate's overrides), else the processor's
    ``size`` (``shortest_edge``/``longest_edge``), else its ``min_pixels``/``max_pixels``.
    """
    ip = _image_processor(processor)
    patch, merge = getattr(ip, "patch_size", None), getattr(ip, "merge_size", None)
    if patch is None or merge is None:
        return None
    owner = type(ip).__name__
    size = getattr(ip, "size", None)
    lo = min_pixels if min_pixels is not None else (_field(size, "shortest_edge") or getattr(ip, "min_pixels", None))
    hi = max_pixels if max_pixels is not None else (_field(size, "longest_edge") or getattr(ip, "max_pixels", None))
    if lo is None or hi is None:
        raise DeriveError(f"{owner}: no min/max pixels (size.shortest_edge/longest_edge) to resize by")
    try:
        return ResizeRule(patch_size=_side(patch, "patch_size", owner), merge_size=int(merge),
                          temporal_patch_size=int(getattr(ip, "temporal_patch_size", None) or 2),
                          min_pixels=int(lo), max_pixels=int(hi))
    except ValueError as exc:
        raise DeriveError(f"{owner}: {exc}") from None


def unwrap(obj: Any) -> tuple[Any, dict[str, Any]]:
    """A callable behind any ``functools.partial`` layers, and the keywords they set."""
    keywords: dict[str, Any] = {}
    while isinstance(obj, functools.partial):
        keywords = {**obj.keywords, **keywords}
        obj = obj.func
    return obj, keywords


def _extractor_and_keywords(processor: Any) -> tuple[Any, dict[str, Any]]:
    """The audio feature extractor a processor is or holds (``.feature_extractor``), partials looked
    through, and the keywords they set."""
    outer, outer_kw = unwrap(processor)
    inner = getattr(outer, "feature_extractor", None)
    if inner is None:
        return outer, outer_kw
    fe, inner_kw = unwrap(inner)
    return fe, {**inner_kw, **outer_kw}


def audio_rule(processor: Any, owner: str = "audio") -> AudioRule:
    """The :class:`AudioRule` of a Whisper-style audio feature extractor (or a processor holding one,
    as ``WhisperProcessor`` does): ``sampling_rate``, ``hop_length`` and ``n_samples`` (=
    ``chunk_length · sampling_rate``). Bridge's dataset calls it with its defaults, which for
    Whisper pad and truncate every clip to ``n_samples`` (``padding="max_length"``,
    ``truncation=True``): every clip then has ``n_samples // hop_length`` frames and half as many
    encoder rows (1500 for 30 s). A ``functools.partial`` (of the processor, or as its
    ``feature_extractor``) that sets ``padding`` to ``"longest"``/``False`` keeps each clip's own
    length (still truncated at ``n_samples``); padding chosen inside a wrapper's own ``__call__``
    cannot be seen. Anything else is a :class:`DeriveError` naming the fix."""
    fe, keywords = _extractor_and_keywords(processor)
    rate, hop = getattr(fe, "sampling_rate", None), getattr(fe, "hop_length", None)
    n = getattr(fe, "n_samples", None)
    if n is None and getattr(fe, "chunk_length", None) is not None and rate is not None:
        n = int(fe.chunk_length) * int(rate)
    if rate is None or hop is None or n is None:
        raise DeriveError(
            f"{owner}: cannot tell how many encoder rows a clip becomes with a {type(fe).__name__} (a "
            "Whisper-style feature extractor has sampling_rate, hop_length and n_samples / chunk_length). "
            + WAYS_OUT)
    padding, truncation = "max_length", True
    try:
        params = inspect.signature(type(fe).__call__).parameters
        padding = params["padding"].default if "padding" in params else padding
        truncation = params["truncation"].default if "truncation" in params else truncation
    except (TypeError, ValueError):
        pass
    padding = keywords.get("padding", padding)
    truncation = keywords.get("truncation", truncation)
    try:
        return AudioRule(sampling_rate=int(rate), hop_length=int(hop),
                         max_samples=int(n) if (truncation or padding == "max_length") else None,
                         pad=padding == "max_length", frames_per_row=2)
    except ValueError as exc:
        raise DeriveError(f"{owner}: {type(fe).__name__}: {exc}") from None


def is_video(processor: Any) -> bool:
    """A transformers video processor (its inputs are ``pixel_values_videos``)."""
    names = getattr(processor, "model_input_names", None) or ()
    return "pixel_values_videos" in names or any(c.__name__ == "BaseVideoProcessor" for c in type(processor).__mro__)


def qwen_video_rule(processor: Any, owner: str = "video") -> ResizeRule:
    """The :class:`ResizeRule` a Qwen-VL video processor groups frames by (its patch, merge and
    temporal patch sizes and its own pixel bounds), with ``frames_in_budget`` when its
    ``smart_resize`` counts the frames (Qwen3-VL's). A processor that samples frames itself
    (``do_sample_frames``) or another video processor is a :class:`DeriveError` naming the fix."""
    rule = qwen_resize_rule(processor)
    if rule is None:
        raise DeriveError(f"{owner}: a {type(processor).__name__} is not a Qwen-VL video processor (patch_size, "
                          "merge_size); its videos cannot be costed before decoding. " + WAYS_OUT)
    if getattr(processor, "do_sample_frames", False):
        raise DeriveError(
            f"{owner}: the {type(processor).__name__} samples frames itself (do_sample_frames=True), from the "
            "decoded video's metadata, so how many frames it encodes is not known before decoding. Give the "
            "dataset the frames to encode (an array (T, H, W, C) or a list of frames) and build the processor "
            "with do_sample_frames=False. " + WAYS_OUT)
    module = sys.modules.get(type(processor).__module__)
    resize = getattr(module, "smart_resize", None)
    try:
        in_budget = resize is not None and "num_frames" in inspect.signature(resize).parameters
    except (TypeError, ValueError):
        in_budget = False
    return dataclasses.replace(rule, frames_in_budget=in_budget)


def is_audio(processor: Any) -> bool:
    fe = _extractor_and_keywords(processor)[0]
    ip = _image_processor(fe)
    return (getattr(ip, "sampling_rate", None) is not None or getattr(fe, "sampling_rate", None) is not None
            or getattr(ip, "feature_size", None) is not None)


def is_fixed_resolution(processor: Any) -> bool:
    """A processor that resizes/crops every image to one size (CLIP, SigLIP, ViT)."""
    ip = _image_processor(processor)
    crop, size = getattr(ip, "crop_size", None), getattr(ip, "size", None)
    if getattr(ip, "do_center_crop", False) and _field(crop, "height") and _field(crop, "width"):
        return True
    return bool(getattr(ip, "do_resize", True) and _field(size, "height") and _field(size, "width"))


@dataclass(frozen=True)
class QwenFetchResize:
    """qwen_vl_utils' ``fetch_image`` resize, which Bridge's Qwen collate applies (through
    ``process_vision_info``) before the processor resizes again: factor ``patch_size * merge``
    (28 at the default ``image_patch_size=14``), pixels in ``[min_tokens, max_tokens] * factor²``
    unless an image part sets ``min_pixels``/``max_pixels``, or ``resized_height``/``resized_width``.

    Its rounding differs from transformers' in two corners (sides never round below one factor;
    the downscale branch has no floor at one factor), so it has its own function.
    """

    patch_size: int = 14
    merge_size: int = 2
    min_tokens: int = 4
    max_tokens: int = 16384
    max_ratio: int = 200

    @property
    def factor(self) -> int:
        return self.patch_size * self.merge_size

    def needs_header(self, part: Mapping[str, Any]) -> bool:
        return not ("resized_height" in part and "resized_width" in part)

    def size(self, height: int, width: int, part: Mapping[str, Any]) -> tuple[int, int]:
        f = self.factor
        if not self.needs_header(part):
            return self._resize(int(part["resized_height"]), int(part["resized_width"]),
                                self.min_tokens * f * f, self.max_tokens * f * f)
        return self._resize(height, width, int(part.get("min_pixels", self.min_tokens * f * f)),
                            int(part.get("max_pixels", self.max_tokens * f * f)))

    def _resize(self, height: int, width: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
        f = self.factor
        if max_pixels < min_pixels:
            raise ValueError(f"max_pixels ({max_pixels}) is below min_pixels ({min_pixels})")
        if height < 1 or width < 1 or max(height, width) / min(height, width) > self.max_ratio:
            raise ValueError(f"image of {height}x{width} px has an aspect ratio above {self.max_ratio}; "
                             "qwen_vl_utils rejects it, so drop or crop the image")
        h_bar = max(f, round(height / f) * f)
        w_bar = max(f, round(width / f) * f)
        if h_bar * w_bar > max_pixels:
            beta = math.sqrt(height * width / max_pixels)
            h_bar = math.floor(height / beta / f) * f
            w_bar = math.floor(width / beta / f) * f
        elif h_bar * w_bar < min_pixels:
            beta = math.sqrt(min_pixels / (height * width))
            h_bar = math.ceil(height * beta / f) * f
            w_bar = math.ceil(width * beta / f) * f
        if h_bar < 1 or w_bar < 1:
            raise ValueError(f"image of {height}x{width} px resizes to {h_bar}x{w_bar}")
        return h_bar, w_bar

    def to_dict(self) -> dict[str, int]:
        return {"patch_size": self.patch_size, "merge_size": self.merge_size,
                "min_tokens": self.min_tokens, "max_tokens": self.max_tokens}
