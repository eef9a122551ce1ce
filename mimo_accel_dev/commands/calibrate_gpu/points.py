"""The designed inputs: each module's shape (:data:`SIZES`) and the points its curve is measured at,
and what every part of the command shares (its name, the points format, the vision module's name, its error)."""

from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass
from typing import Any


PROG = "mimo-accel calibrate-gpu"
POINTS_FORMAT = "mimo-accel-cost-points/1"
VISION = "vision"


class MeasureError(ValueError):
    """A measurement or fit that cannot be made; the message says why and what to do."""


# ------------------------------------------------------------------------------------ shapes


@dataclass(frozen=True)
class VisionShape:
    """The vision encoder's size (the fields of transformers' ``Qwen3VLVisionConfig``)."""

    depth: int
    hidden_size: int
    num_heads: int
    intermediate_size: int
    out_hidden_size: int
    num_position_embeddings: int
    patch_size: int = 16
    temporal_patch_size: int = 2
    spatial_merge_size: int = 2
    in_channels: int = 3

    @property
    def patch_dim(self) -> int:
        """Width of one ``pixel_values`` row: channels · temporal patch · patch²."""
        return self.in_channels * self.temporal_patch_size * self.patch_size ** 2


@dataclass(frozen=True)
class LanguageShape:
    """The language decoder block measured, and the depth its coefficients are scaled to."""

    layers: int
    hidden_size: int
    num_heads: int
    num_query_groups: int
    ffn_hidden_size: int
    depth: int  # the whole decoder's layers: coefficients are scaled by depth / layers
    rotary_base: float = 1_000_000.0

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads


#: ``--size``: (vision, language). ``real``: Qwen3-VL-8B's vision encoder and Qwen3-8B's layers.
SIZES: dict[str, tuple[VisionShape, LanguageShape]] = {
    "real": (VisionShape(depth=27, hidden_size=1152, num_heads=16, intermediate_size=4304, out_hidden_size=4096,
                         num_position_embeddings=2304),
             LanguageShape(layers=4, hidden_size=4096, num_heads=32, num_query_groups=8, ffn_hidden_size=12288,
                           depth=36)),
    "tiny": (VisionShape(depth=2, hidden_size=64, num_heads=4, intermediate_size=128, out_hidden_size=64,
                         num_position_embeddings=256),
             LanguageShape(layers=2, hidden_size=64, num_heads=4, num_query_groups=2, ffn_hidden_size=128, depth=2)),
}


# ------------------------------------------------------------------------------------ points


@dataclass(frozen=True)
class VisionPoint:
    """One vision input: images of ``(h, w)`` patches (one frame each), packed as one call."""

    images: tuple[tuple[int, int], ...]

    @property
    def rows(self) -> int:
        return sum(h * w for h, w in self.images)

    @property
    def sq_rows(self) -> int:
        return sum((h * w) ** 2 for h, w in self.images)

    @property
    def items(self) -> int:
        return len(self.images)

    def features(self) -> tuple[float, ...]:
        return (float(self.rows), float(self.sq_rows), float(self.items))

    @property
    def label(self) -> str:
        return " + ".join(f"{n}×{h}×{w}" for (h, w), n in Counter(self.images).items())

    def to_doc(self) -> dict[str, Any]:
        return {"images": [list(hw) for hw in self.images], "rows": self.rows, "sq_rows": self.sq_rows,
                "items": self.items}


@dataclass(frozen=True)
class LanguagePoint:
    """One language input: sequences of these lengths packed THD into one ``[T]`` call."""

    segments: tuple[int, ...]

    @property
    def tokens(self) -> int:
        return sum(self.segments)

    @property
    def sq_tokens(self) -> int:
        return sum(n * n for n in self.segments)

    @property
    def items(self) -> int:
        return len(self.segments)

    def features(self) -> tuple[float, ...]:
        return (float(self.tokens), float(self.sq_tokens), float(self.items))

    @property
    def label(self) -> str:
        return " + ".join(f"{c}×{n}" for n, c in Counter(self.segments).items())

    def to_doc(self) -> dict[str, Any]:
        return {"segments": list(self.segments), "tokens": self.tokens, "sq_tokens": self.sq_tokens}


def _images(*groups: tuple[int, int, int]) -> VisionPoint:
    return VisionPoint(tuple((h, w) for n, h, w in groups for _ in range(n)))


# (the first CORE points determine the fit on their own: they are always measured)
VISION_CORE = 5
LANGUAGE_CORE = 5

_VISION_POINTS = {
    "real": [
        _images((1, 64, 64)),                      # 4096 patches, one image
        _images((16, 16, 16)),                     # 4096 patches, 16 images
        _images((1, 32, 32)),                      # 1024
        _images((1, 128, 128)),                    # 16384, one image (2048×2048 px)
        _images((64, 8, 8)),                       # 4096 patches, 64 small images
        _images((4, 32, 32)),                      # 4096, 4 images
        _images((1, 32, 128)),                     # 4096, one wide image
        _images((1, 48, 48)),                      # 2304
        _images((1, 96, 96)),                      # 9216
        _images((1, 64, 64), (4, 32, 32), (16, 8, 8)),  # 9216, unequal images
        _images((1, 96, 64), (8, 16, 16)),         # 8192, unequal
        _images((16, 32, 32)),                     # 16384, 16 images
        _images((64, 16, 16)),                     # 16384, 64 images
        _images((256, 8, 8)),                      # 16384, 256 small images
        _images((1, 128, 256)),                    # 32768, one very large image
    ],
    "tiny": [
        _images((1, 16, 16)),                      # 256 patches, one image
        _images((16, 4, 4)),                       # 256, 16 images
        _images((1, 8, 8)),                        # 64
        _images((1, 24, 24)),                      # 576
        _images((4, 8, 8)),                        # 256, 4 images
        _images((1, 8, 32)),                       # 256, wide
        _images((1, 16, 16), (4, 4, 4)),           # 320, unequal
        _images((9, 8, 8)),                        # 576, 9 images
        _images((1, 32, 32)),                      # 1024
    ],
}

_LANGUAGE_POINTS = {
    "real": [
        LanguagePoint((256,)),
        LanguagePoint((2048,)),
        LanguagePoint((8192,)),
        LanguagePoint((2048,) * 4),                # 8192 tokens as 4 sequences
        LanguagePoint((512,) * 16),                # 8192 tokens as 16 sequences
        LanguagePoint((1024,)),
        LanguagePoint((4096,)),
        LanguagePoint((512,)),
        LanguagePoint((6144,)),
        LanguagePoint((4096, 2048, 1024, 1024)),   # 8192, unequal
        LanguagePoint((4096,) * 2),
        LanguagePoint((16384,)),
    ],
    "tiny": [
        LanguagePoint((32,)),
        LanguagePoint((256,)),
        LanguagePoint((1024,)),
        LanguagePoint((256,) * 4),
        LanguagePoint((64,) * 8),
        LanguagePoint((128,)),
        LanguagePoint((512,)),
        LanguagePoint((512, 256, 128, 128)),
    ],
}


def vision_points(size: str) -> list[VisionPoint]:
    """The vision points of ``size``, the ones that determine the fit first."""
    return list(_VISION_POINTS[size])


def language_points(size: str) -> list[LanguagePoint]:
    """The language points of ``size``, the ones that determine the fit first."""
    return list(_LANGUAGE_POINTS[size])


def shapes(args) -> tuple[VisionShape, LanguageShape]:
    """The modules' shapes a command line asks for (``--size``, ``--language-depth``)."""
    vision, language = SIZES[args.size]
    if args.language_depth is not None:
        language = dataclasses.replace(language, depth=args.language_depth)
    return vision, language
