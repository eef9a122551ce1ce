"""Said once: the one way mimo_accel says a notice once (no silent no-op, and no notice repeated
every step). A :class:`Notices` keeps what it said, key -> message in the order said; the
enabled :class:`~mimo_accel.runtime.state.Runtime` holds the run's (``status()["notes"]`` lists
them), and code that runs without one (the version guard, the offline tools) keeps its own."""

from __future__ import annotations

import logging
import threading
from typing import Hashable


class Notices:
    """Notices said once each, as warnings on ``logger``; thread-safe."""

    def __init__(self, logger: logging.Logger) -> None:
        self._logger = logger
        self._said: dict[Hashable, str] = {}
        self._lock = threading.Lock()

    def say_once(self, key: Hashable, message: str) -> bool:
        """Log ``message`` the first time ``key`` is seen; True when logged."""
        with self._lock:
            if key in self._said:
                return False
            self._said[key] = message
        self._logger.warning(message)
        return True

    def said(self) -> dict[Hashable, str]:
        """What was said, key -> message, in the order said."""
        with self._lock:
            return dict(self._said)

    def clear(self) -> None:
        with self._lock:
            self._said.clear()
