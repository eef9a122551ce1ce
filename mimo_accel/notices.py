"""Say it once: what a feature could not do with the data it got, or which source it used.

No silent no-op: a feature that cannot act on its data (nothing to balance, no padding to
remove) says so once per process in the log; ``mimo_accel.status()["notes"]`` lists the same
lines, and with the profiler on each is written into the next step line (``notes``), which
``mimo-accel report`` shows.
"""

from __future__ import annotations

import logging
import threading

logger = logging.getLogger("mimo_accel")

_lock = threading.Lock()
_said: dict[str, str] = {}


def say_once(key: str, message: str) -> bool:
    """Log ``message`` the first time ``key`` is seen in this process; True when it was logged."""
    with _lock:
        if key in _said:
            return False
        _said[key] = message
    logger.warning(message)
    return True


def said() -> dict[str, str]:
    with _lock:
        return dict(_said)


def clear() -> None:
    with _lock:
        _said.clear()
