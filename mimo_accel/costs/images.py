"""An image's ``(height, width)`` without decoding it: from a file's or bytes' header (PNG, JPEG,
GIF, BMP, WebP; Pillow for other formats), a PIL image's ``.size`` or an array's shape."""

from __future__ import annotations

import base64
import io
import os
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mimo_accel.costs.files import EMPTY_FILE

__all__ = ["ImageSizeError", "RemoteImageError", "image_size_from_bytes", "image_size_from_header", "image_size_of"]


class ImageSizeError(ValueError):
    """An image as a dataset holds it whose size cannot be read; the message names the image."""


class RemoteImageError(ImageSizeError):
    """An image named by a URL: reading its size would download it."""


# --------------------------------------------------------------------------------------------
# Image headers
# --------------------------------------------------------------------------------------------


def image_size_from_header(path: str | os.PathLike[str]) -> tuple[int, int]:
    """``(height, width)`` of a PNG, JPEG, GIF, BMP or WebP file, read from its header only.

    The built-in parser is used first so results do not depend on whether Pillow is installed;
    Pillow (lazy ``Image.open``, no decode) is only a fallback for other formats. EXIF rotation is
    not applied: it swaps height and width but leaves the patch count unchanged.
    """
    with open(path, "rb") as f:
        return _size_from_stream(f, str(Path(path)), "file")


def image_size_from_bytes(data: bytes | bytearray | memoryview, where: str = "image bytes") -> tuple[int, int]:
    """``(height, width)`` of an encoded image held in memory (e.g. an undecoded HF ``Image``
    cell), from its header only; the same formats and fallback as :func:`image_size_from_header`.
    ``where`` names the image in error messages."""
    return _size_from_stream(io.BytesIO(data), where, "image")


def _size_from_stream(f: Any, where: str, what: str) -> tuple[int, int]:
    """The built-in header parser, else Pillow's lazy open, on the seekable ``f`` (a ``what``)."""
    head = f.read(64)
    if not head:
        raise ValueError(f"{where}: {EMPTY_FILE if what == 'file' else 'the image bytes are empty'}")
    try:
        size = _parse_header(f, head)
    except (struct.error, IndexError):
        raise ValueError(f"{where}: image header is truncated") from None
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None
    if size is not None:
        return size
    try:
        from PIL import Image
    except ImportError:
        raise ValueError(
            f"{where}: not a PNG, JPEG, GIF, BMP or WebP {what}; install Pillow to read other formats"
        ) from None
    try:
        f.seek(0)
        with Image.open(f) as im:
            width, height = im.size
    except Exception as exc:  # Pillow raises many types for unreadable data
        raise ValueError(f"{where}: cannot read image size ({exc})") from None
    return int(height), int(width)


def _parse_header(f: Any, head: bytes) -> tuple[int, int] | None:
    """Dimensions from the first bytes (and, for JPEG, the marker chain); None if unknown format."""
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        if head[12:16] != b"IHDR":
            raise ValueError("PNG without IHDR chunk (corrupt file)")
        width, height = struct.unpack(">II", head[16:24])
        return _checked(height, width)
    if head[:6] in (b"GIF87a", b"GIF89a"):
        width, height = struct.unpack("<HH", head[6:10])
        return _checked(height, width)
    if head.startswith(b"BM") and len(head) >= 26:
        (dib_size,) = struct.unpack("<I", head[14:18])
        if dib_size == 12:  # BITMAPCOREHEADER: 16-bit sides
            width, height = struct.unpack("<hh", head[18:22])
        else:
            width, height = struct.unpack("<ii", head[18:26])
        return _checked(abs(height), abs(width))  # negative height = top-down rows
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return _webp_size(head)
    if head[:2] == b"\xff\xd8":
        return _jpeg_size(f)
    return None


def _webp_size(head: bytes) -> tuple[int, int]:
    chunk = head[12:16]
    if chunk == b"VP8 ":  # lossy: 14-bit sides after the 3-byte frame tag and start code
        if head[23:26] != b"\x9d\x01\x2a":
            raise ValueError("WebP VP8 frame without start code (corrupt file)")
        width, height = struct.unpack("<HH", head[26:30])
        return _checked(height & 0x3FFF, width & 0x3FFF)
    if chunk == b"VP8L":  # lossless: signature byte, then 14-bit (side - 1) fields
        if head[20] != 0x2F:
            raise ValueError("WebP VP8L chunk without signature (corrupt file)")
        (bits,) = struct.unpack("<I", head[21:25])
        return _checked(((bits >> 14) & 0x3FFF) + 1, (bits & 0x3FFF) + 1)
    if chunk == b"VP8X":  # extended: 24-bit (side - 1) canvas fields
        width = int.from_bytes(head[24:27], "little") + 1
        height = int.from_bytes(head[27:30], "little") + 1
        return _checked(height, width)
    raise ValueError(f"WebP with unknown first chunk {chunk!r}")


# SOFn markers carry the frame size; C4 (DHT), C8 (JPG) and CC (DAC) share the range but do not.
_JPEG_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
# Markers without a length field.
_JPEG_STANDALONE = frozenset({0x01, *range(0xD0, 0xD9)})


def _jpeg_size(f: Any) -> tuple[int, int]:
    f.seek(2)
    while True:
        byte = f.read(1)
        if not byte:
            raise ValueError("JPEG ended before its frame header (truncated file)")
        if byte != b"\xff":
            raise ValueError("JPEG marker chain is broken (corrupt file)")
        marker = f.read(1)
        while marker == b"\xff":  # fill bytes
            marker = f.read(1)
        if not marker:
            raise ValueError("JPEG ended before its frame header (truncated file)")
        code = marker[0]
        if code in _JPEG_STANDALONE:
            continue
        raw = f.read(2)
        if len(raw) < 2:
            raise ValueError("JPEG ended inside a segment (truncated file)")
        (length,) = struct.unpack(">H", raw)
        if code in _JPEG_SOF:
            body = f.read(5)
            if len(body) < 5:
                raise ValueError("JPEG frame header is truncated")
            _, height, width = struct.unpack(">BHH", body)
            return _checked(height, width)
        if code == 0xDA:  # start of scan before any frame header
            raise ValueError("JPEG has no frame header before its scan data (corrupt file)")
        f.seek(length - 2, os.SEEK_CUR)


def _checked(height: int, width: int) -> tuple[int, int]:
    if height < 1 or width < 1:
        raise ValueError(f"image header gives a zero size ({height}x{width}); the file is corrupt")
    return int(height), int(width)


# --------------------------------------------------------------------------------------------
# Images as datasets hold them
# --------------------------------------------------------------------------------------------


def is_pil(obj: Any) -> bool:
    return type(obj).__module__.startswith("PIL.") and isinstance(getattr(obj, "size", None), tuple)


def image_size_of(image: Any, where: str = "image") -> tuple[int, int]:
    """``(height, width)`` of one image as a dataset holds it, reading at most its header.

    Accepts a path (``str``/``PathLike``, ``file://`` prefix allowed), a ``data:image/...;base64,``
    URI, encoded bytes, an undecoded HF image cell ``{"bytes": ..., "path": ...}``, a PIL image
    (its ``.size``; nothing is decoded that was not already), or an array of shape ``(H, W)``,
    ``(H, W, C)`` or ``(C, H, W)`` with C in 1, 3, 4. URLs are refused: probing them would
    download them. Raises :class:`ImageSizeError` naming ``where``.
    """
    try:
        if is_pil(image):
            width, height = image.size
            return int(height), int(width)
        if isinstance(image, (bytes, bytearray, memoryview)):
            return image_size_from_bytes(image, where)
        if isinstance(image, Mapping):
            data, path = image.get("bytes"), image.get("path")
            if data is not None:
                return image_size_from_bytes(data, where)
            if path:
                return image_size_of(path, where)
            raise ImageSizeError(f"{where}: an image cell with neither bytes nor a path")
        if isinstance(image, os.PathLike):
            image = os.fspath(image)
        if isinstance(image, str):
            if image.startswith(("http://", "https://")):
                raise RemoteImageError(f"{where}: image {image!r} is a URL; its size cannot be read without "
                                       "downloading it. Store the images locally, or use another way.")
            if image.startswith("data:image"):
                if "base64," not in image:
                    raise ImageSizeError(f"{where}: a data:image URI without base64 data")
                return image_size_from_bytes(base64.b64decode(image.split("base64,", 1)[1]), where)
            if image.startswith("file://"):
                image = image[len("file://"):]
            return image_size_from_header(image)
        shape = getattr(image, "shape", None)
        if shape is not None:
            return _array_size(tuple(int(s) for s in shape), where)
    except FileNotFoundError:
        raise ImageSizeError(f"{where}: image file not found: {image}") from None
    except ImageSizeError:
        raise
    except (OSError, ValueError) as exc:
        raise ImageSizeError(f"{where}: cannot read the image size: {exc}") from None
    raise ImageSizeError(f"{where}: cannot read the size of an image given as {type(image).__name__}; "
                         "give a path, bytes, a PIL image or an HF Image cell")


def _array_size(shape: tuple[int, ...], where: str) -> tuple[int, int]:
    if len(shape) == 2:
        h, w = shape
    elif len(shape) == 3 and shape[-1] in (1, 3, 4):
        h, w = shape[0], shape[1]
    elif len(shape) == 3 and shape[0] in (1, 3, 4):
        h, w = shape[1], shape[2]
    else:
        raise ImageSizeError(f"{where}: an image array of shape {shape} is neither (H, W), (H, W, C) nor (C, H, W)")
    if h < 1 or w < 1:
        raise ImageSizeError(f"{where}: an image array of shape {shape} is empty")
    return h, w


def is_local_file(image: Any) -> bool:
    """Whether reading the size means opening a file (worth a thread pool)."""
    if isinstance(image, Mapping):
        return image.get("bytes") is None and bool(image.get("path"))
    return isinstance(image, (str, os.PathLike)) and not str(image).startswith("data:")


def images_in(value: Any) -> list[Any]:
    """The images a modality cell holds: None -> none, a list -> each, anything else -> one."""
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return [v for v in value if v is not None]
    return [value]
