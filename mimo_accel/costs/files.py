"""Files other ranks may read while one rank rewrites them, and reading many files' heads at once."""

from __future__ import annotations

import os
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Optional, Sequence, TypeVar

T = TypeVar("T")
R = TypeVar("R")

# What an empty file is told, after its name: an interrupted copy or export leaves one.
EMPTY_FILE = "the file is empty (0 bytes): copy or export it again, or drop the sample"

_umask_lock = threading.Lock()  # the umask is the process's: two threads setting it must not interleave


def umask() -> int:
    """The process umask, read without changing it where Linux shows it (``/proc/self/status``)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    with _umask_lock:  # elsewhere: set and restore it (the only portable way to read it)
        mask = os.umask(0o022)
        os.umask(mask)
    return mask


def file_mode() -> int:
    """The mode ``open(path, "w")`` would give a new file: 0666 less the umask. ``mkstemp``
    creates 0600 files, which another account of the same job could not read."""
    return 0o666 & ~umask()


def atomic_write(path: Path, data: bytes) -> None:
    # Other ranks may read the file while it is rewritten: never expose a half-written one.
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, file_mode())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


# Reading a file's head waits on storage (a network file system's latency), not on the CPU: from this
# many files, a pool of a few threads more than the cores, at most 8 (more only queue on the server).
READ_THREADS_FROM = 64


def read_threads(workers: Optional[int] = None) -> int:
    """The threads that read files' heads: ``workers`` where given, else the rule above."""
    return workers or min(8, (os.cpu_count() or 1) + 4)


def map_reads(read: Callable[[T], R], items: Sequence[T], workers: Optional[int] = None,
              name: str = "mimo-accel-read") -> list[R]:
    """``[read(item) for item in items]``, through a thread pool from :data:`READ_THREADS_FROM`
    items unless ``workers`` is 1. The results keep the items' order, so the error raised is the
    earliest item's."""
    if len(items) < READ_THREADS_FROM or workers == 1:
        return [read(item) for item in items]
    with ThreadPoolExecutor(max_workers=read_threads(workers), thread_name_prefix=name) as pool:
        return list(pool.map(read, items))
