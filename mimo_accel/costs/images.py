"""An image's ``(height, width)`` without decoding it: from a file's or bytes' header (PNG, JPEG,
GIF, BMP, WebP; Pillow for other formats)."""

from __future__ import annotations

import io
import os
import struct
from pathlib import Path
from typing import Any

__all__ = ["image_size_from_bytes", "image_size_from_header"]


# --------------------------------------------------------------------------------------------
# Image headers
# --------------------------------------------------------------------------------------------


def image_size_from_header(path: str | os.PathLike[str]) -> tuple[int, int]:
    """``(height, width)`` of a PNG, JPEG, GIF, BMP or WebP file, read from its header only.

    The built-in parser is used first so results do not depend on whether Pillow is installed;
    Pillow (lazy ``Image.open``, no decode) is only a fallback for other formats. EXIF rotation is
    not applied: it swaps height and width but leaves the patch count unchanged.
    """
    path = Path(path)
    with open(path, "rb") as f:
        head = f.read(64)
        try:
            size = _parse_header(f, head)
        except (struct.error, IndexError):
            raise ValueError(f"{path}: image header is truncated") from None
        except ValueError as exc:
            raise ValueError(f"{path}: {exc}") from None
    if size is not None:
        return size
    try:
        from PIL import Image
    except ImportError:
        raise ValueError(
            f"{path}: not a PNG, JPEG, GIF, BMP or WebP file; install Pillow to read other formats"
        ) from None
    try:
        with Image.open(path) as im:
            width, height = im.size
    except Exception as exc:  # Pillow raises many types for unreadable files
        raise ValueError(f"{path}: cannot read image size ({exc})") from None
    return int(height), int(width)


def image_size_from_bytes(data: bytes | bytearray | memoryview, where: str = "image bytes") -> tuple[int, int]:
    """``(height, width)`` of an encoded image held in memory (e.g. an undecoded HF ``Image``
    cell), from its header only; the same formats and fallback as :func:`image_size_from_header`.
    ``where`` names the image in error messages."""
    f = io.BytesIO(data)
    head = f.read(64)
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
            f"{where}: not a PNG, JPEG, GIF, BMP or WebP image; install Pillow to read other formats"
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
