"""``mimo-accel index --verify``: decode every file the costs are read from, so that an undecodable
one is found before the job rather than by it.

Indexing reads headers only: a JPEG cut short after its header, or a FLAC whose frames are damaged,
passes it and then kills a data-loading worker mid-training. Here images are decoded with Pillow
(``Image.load``, as a processor would) and audio with soundfile (every frame, in blocks, and as many
frames as the header declares), in a thread pool (both decoders release the GIL while they work).
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterable, Iterator, Optional, Sequence

from mimo_accel.costs.files import EMPTY_FILE

__all__ = ["decode_error", "undecodable"]

File = tuple[str, str, str]  # (where: a manifest line or a sample, path, kind: "image" | "audio")
_AUDIO_BLOCK = 1 << 16  # frames decoded at a time


def _decode_image(path: str) -> None:
    from PIL import Image

    with Image.open(path) as im:
        im.load()


def _decode_audio(path: str) -> None:
    import soundfile

    with soundfile.SoundFile(path) as f:
        declared, decoded = f.frames, 0
        for block in f.blocks(_AUDIO_BLOCK, dtype="float32"):
            decoded += len(block)
    if decoded != declared:
        raise ValueError(f"decoded {decoded:,} frames, its header declares {declared:,}")


def decode_error(path: str, kind: str) -> Optional[str]:
    """Why the file at ``path`` cannot be decoded (one line), or None when it can."""
    try:
        if os.path.getsize(path) == 0:  # the decoders say "cannot identify" / "Format not recognised"
            return EMPTY_FILE
        (_decode_audio if kind == "audio" else _decode_image)(path)
    except FileNotFoundError:
        return "not found"
    except Exception as exc:  # whatever the decoder raises is the finding, reported by the caller
        text = " ".join(str(exc).split())
        return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return None


def _check(file: File) -> Optional[str]:
    return decode_error(file[1], file[2])


def undecodable(batches: Iterable[tuple[Sequence[File], float]], *, workers: Optional[int] = None,
                on_progress: Optional[Callable[[float], object]] = None) -> Iterator[tuple[File, str]]:
    """The files of ``batches`` that cannot be decoded, in order, with why: each batch is (its
    files, how far the caller's progress is once it is done), and ``on_progress`` hears after each
    file how far it is (the batch's part shared out evenly among its files). ``workers``: decoding
    threads (None: one per CPU)."""
    with ThreadPoolExecutor(max_workers=workers or os.cpu_count() or 1, thread_name_prefix="mimo-accel-verify") as pool:
        before = 0.0
        for files, after in batches:
            for k, (file, error) in enumerate(zip(files, pool.map(_check, files)), start=1):
                if error is not None:
                    yield file, error
                if on_progress is not None:
                    on_progress(before + (after - before) * k / len(files))
            if on_progress is not None:
                on_progress(after)
            before = after
