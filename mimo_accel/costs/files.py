"""Files other ranks may read while one rank rewrites them."""

from __future__ import annotations

import os
import tempfile
import threading
from pathlib import Path

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
