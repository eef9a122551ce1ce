"""Qwen-VL image processing without downloads: the stack's default processor (Qwen2-VL settings)
and the base of :func:`mimo_accel_dev.rehearse.qwen3vl.image_processor` (Qwen3-VL settings)."""

from __future__ import annotations

from typing import Any


def qwen_image_processor(min_pixels: int = 28 * 28, max_pixels: int = 28 * 28 * 64, **kwargs: Any):
    """Qwen2-VL's image processor (transformers' PIL variant; 14 px patches, 2x2 merge), small
    pixel bounds so CPU runs are fast: 4 to 256 patches per image by default. The bounds go in as
    a fresh ``size`` (transformers 5.x writes ``min_pixels``/``max_pixels`` arguments into the
    class-level default dict, which would leak into every later processor)."""
    from transformers import Qwen2VLImageProcessorPil

    return Qwen2VLImageProcessorPil(size={"shortest_edge": min_pixels, "longest_edge": max_pixels}, **kwargs)
