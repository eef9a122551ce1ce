"""Keep third-party import noise off the console: send it to a log file instead.

Importing megatron.core / megatron.bridge on a machine without Transformer Engine or Apex prints
~40 lines (``UserWarning``s about TE/Apex fallbacks, modelopt plugin registration failures, a
``FP8GlobalStateManager`` traceback logged at INFO through a handler megatron.bridge attaches to
stderr, ``basicConfig`` handlers on stdout). :func:`output_to` captures all of it around a block:

- file descriptors 1 and 2 (C-level writes and anything printed through ``sys.stdout``/``stderr``);
- Python warnings, through ``warnings.showwarning`` (also when ``sys.stderr`` is not fd 2);
- logging handlers the block *adds* on stdout/stderr: re-pointed at the log file, so a later
  log record from them does not reach the console either.

Errors are not hidden: an exception leaving the block propagates after the console is restored,
and the log file's path is the caller's to print.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import warnings
from pathlib import Path
from typing import Iterator, Optional, TextIO, Union

__all__ = ["IMPORT_LOG_ENV", "output_to"]

# Set by the parent for the forkserver it starts (mimo_accel_dev.rehearse.ranks): where the forkserver's
# preload import of megatron (mimo_accel_dev.rehearse._preload) writes its output.
IMPORT_LOG_ENV = "MIMO_ACCEL_IMPORT_LOG"


def _flush_python_streams() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):
            pass


def _stream_handlers() -> list[logging.StreamHandler]:
    loggers = [logging.getLogger()] + [
        lg for lg in list(logging.Logger.manager.loggerDict.values()) if isinstance(lg, logging.Logger)
    ]
    return [h for lg in loggers for h in lg.handlers
            if isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler)]


def _console_streams() -> tuple:
    return tuple(s for s in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__) if s is not None)


@contextlib.contextmanager
def output_to(path: Union[str, os.PathLike, None], *, repoint_handlers: bool = True) -> Iterator[Optional[TextIO]]:
    """Append everything the block writes to the console (fds 1/2, warnings, new logging
    handlers) to ``path``. ``path=None``: do nothing (yields None).

    ``repoint_handlers=False`` leaves the handlers the block added on stdout/stderr as they are
    (the forkserver: its ranks point fds 1/2 at their own logs, and those handlers should follow).
    """
    if path is None:
        yield None
        return
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    log = open(path, "a", buffering=1, encoding="utf-8", errors="replace")
    handlers_before = {id(h) for h in _stream_handlers()}
    _flush_python_streams()
    saved = {fd: os.dup(fd) for fd in (1, 2)}
    try:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        with warnings.catch_warnings():  # restores showwarning (and the filters) on exit

            def showwarning(message, category, filename, lineno, file=None, line=None):
                log.write(warnings.formatwarning(message, category, filename, lineno, line))

            warnings.showwarning = showwarning
            yield log
    finally:
        _flush_python_streams()
        for fd, dup in saved.items():
            os.dup2(dup, fd)
            os.close(dup)
        retargeted = False
        console = _console_streams()
        for h in _stream_handlers() if repoint_handlers else ():
            if id(h) not in handlers_before and any(h.stream is s for s in console):
                try:
                    h.setStream(log)
                except AttributeError:  # a handler whose stream is fixed (logging's lastResort)
                    continue
                retargeted = True
        if not retargeted:  # else the handlers keep writing to it for the life of the process
            log.close()
