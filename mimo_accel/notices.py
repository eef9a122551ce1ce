"""How mimo_accel speaks: its log lines, and a notice said once.

Every line mimo_accel logs goes through the ``mimo_accel`` logger (modules log on it or on a child
of it), which :func:`own_lines` gives one handler of its own: stderr as it is when the line is
written, one prefix, ``mimo_accel: <message>`` (a message that starts with ``mimo_accel: `` or
``mimo_accel `` keeps one), at INFO and above, not handed on to the root logger, so a job's own
logging set-up (Bridge's examples: ``[Rank N] %(name)s: %(message)s``; Python's default
``INFO:name:``) neither repeats the prefix nor drops the lines. A logger the user set up first (a
handler or a level of their own on ``mimo_accel``) is left as they set it; to route the lines
through the job's logging instead: ``logging.getLogger("mimo_accel").propagate = True`` and remove
its handler.

:class:`Notices` says a notice once (no silent no-op, and no notice repeated every step), keeping
what it said, key -> message in the order said; the enabled
:class:`~mimo_accel.runtime.state.Runtime` holds the run's (``status()["notes"]`` lists them), and
code that runs without one (the version guard, the offline tools) keeps its own.
"""

from __future__ import annotations

import logging
import sys
import threading
from typing import Hashable

LOGGER = "mimo_accel"
PREFIX = "mimo_accel: "
_set_up = threading.Lock()
_installed = False


class _OnePrefix(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        for lead in (PREFIX, "mimo_accel "):
            if text.startswith(lead):
                return PREFIX + text[len(lead):]
        return PREFIX + text


class _Stderr(logging.StreamHandler):
    """Writes to ``sys.stderr`` as it is at each line (a rank's log, a test's capture)."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)
        self.setFormatter(_OnePrefix("%(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        self.stream = sys.stderr
        super().emit(record)


def own_lines() -> logging.Logger:
    """The ``mimo_accel`` logger, given its handler the first time (see the module docstring)."""
    global _installed
    logger = logging.getLogger(LOGGER)
    with _set_up:
        if not _installed:
            _installed = True
            if not logger.handlers and logger.level == logging.NOTSET:  # not set up by the user
                logger.addHandler(_Stderr())
                logger.setLevel(logging.INFO)
                logger.propagate = False
    return logger


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
        own_lines()
        self._logger.warning(message)
        return True

    def said(self) -> dict[Hashable, str]:
        """What was said, key -> message, in the order said."""
        with self._lock:
            return dict(self._said)

    def clear(self) -> None:
        with self._lock:
            self._said.clear()
