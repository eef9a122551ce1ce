"""What every ``mimo-accel`` subcommand checks on its command line before it starts any work.

A bad value ends in one ``mimo-accel <cmd>: error: ...`` line that names the fix, exit 2:

- argparse's own errors and the numbers of the ``type=`` functions :func:`positive_int` /
  :func:`nonnegative_int` / :func:`peak_tflops`: :func:`one_line_errors` makes a parser print
  ``mimo-accel <cmd>: error: argument --steps: must be a positive integer (1, 2, ...), got 0 (see
  mimo-accel <cmd> --help)`` without its usage block (``--help`` stays whole);
- paths: :func:`output_file` / :func:`output_dir` raise :class:`UsageError` for a file whose
  directory is missing or not writable, or a directory that cannot be made, so nothing is
  computed (and no temp directory made) before a bad ``--out`` / ``--json`` is found. One rule for
  every command: a missing directory above an output is refused, never made; a directory option
  names a directory that is made if missing;
- optional packages: :func:`require_extra` names the package and the extra that installs it;
- :func:`fail` prints the one line (:func:`one_line`: any message or exception on one line); with
  ``MIMO_ACCEL_TRACEBACK=1`` the traceback before it.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Optional, Union

from mimo_accel.config import ENV_TRACEBACK

__all__ = ["TRACEBACK_ENV", "UsageError", "fail", "nonnegative_int", "one_line", "one_line_errors", "output_dir",
           "output_file", "parse", "peak_tflops", "positive_int", "require_extra", "add_peak_option"]

TRACEBACK_ENV = ENV_TRACEBACK  # 1: an error's traceback too, not only its one line (debugging)


class UsageError(ValueError):
    """A bad command line: printed as one ``mimo-accel <cmd>: error: ...`` line, exit 2."""


# -- numbers ---------------------------------------------------------------------------------------


def _integer(text: str, minimum: int, what: str) -> int:
    try:
        value = int(text)
    except (TypeError, ValueError):
        raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"must be {what}, got {value}")
    return value


def positive_int(text: str) -> int:
    """argparse ``type=``: an integer >= 1 (steps, DP sizes, micro-batches, workers, ...)."""
    return _integer(text, 1, "a positive integer (1, 2, ...)")


def nonnegative_int(text: str) -> int:
    """argparse ``type=``: an integer >= 0 (seeds, warm-up steps)."""
    return _integer(text, 0, "an integer >= 0")


def peak_tflops(text: str) -> float:
    """argparse ``type=``: ``--peak-tflops``, a device's dense BF16 peak in TFLOP/s per GPU (> 0)."""
    what = ("the device's dense BF16 peak in TFLOP/s per GPU, a number > 0 (989 for an H100 SXM); omit "
            "--peak-tflops to take it from the device table")
    try:
        value = float(text)
    except (TypeError, ValueError):
        raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be {what}, got {text}")
    return value


def add_peak_option(p: argparse.ArgumentParser) -> None:
    """``--peak-tflops T``: the peak each module's MFU is over (``mimo-accel report`` and ``rehearse``)."""
    p.add_argument("--peak-tflops", metavar="T", type=peak_tflops, default=None,
                   help="the GPU's dense BF16 peak, TFLOP/s per GPU, for each module's MFU (default: from the "
                        "device table, by the GPU the profile names; a CPU run has no MFU)")


def one_line_errors(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """``parser`` (and its subcommands' parsers) with argparse's errors as one line, ``<prog>: error:
    <message> (see <prog> --help)``, exit 2, instead of the usage block and the message."""

    def error(message: str, parser=parser):
        parser.exit(2, f"{parser.prog}: error: {one_line(message)} (see {parser.prog} --help)\n")

    parser.error = error
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                one_line_errors(sub)
    return parser


def parse(parser: argparse.ArgumentParser, argv) -> Union[argparse.Namespace, int]:
    """``parser.parse_args(argv)``, or the exit code where argparse stopped (0 after ``--help``,
    2 after the one-line error it printed: :func:`one_line_errors`): a subcommand's ``main()``
    returns it."""
    try:
        return one_line_errors(parser).parse_args(argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)


# -- paths ------------------------------------------------------------------------------------------


def _writable(directory: Path) -> bool:
    return os.access(directory, os.W_OK | os.X_OK)


def output_file(flag: str, path: Union[str, os.PathLike, None]) -> Optional[Path]:
    """``flag PATH`` names a file to write: PATH is not a directory and its directory exists and is
    writable (a missing directory is refused, never made: docs/usage.md). None passes (the flag
    was not given)."""
    if path is None:
        return None
    p = Path(path)
    if p.is_dir():
        raise UsageError(f"{flag} {path}: is a directory; give the path of a file to write")
    parent = p.parent
    if not parent.exists():
        raise UsageError(f"{flag} {path}: the directory {parent} does not exist; create it or give another path")
    if not parent.is_dir():
        raise UsageError(f"{flag} {path}: {parent} is a file, not a directory; give another path")
    if not _writable(parent):
        raise UsageError(f"{flag} {path}: the directory {parent} is not writable; give another path")
    if p.exists() and not os.access(p, os.W_OK):
        raise UsageError(f"{flag} {path}: the file exists and is not writable; give another path")
    return p


def output_dir(flag: str, path: Union[str, os.PathLike, None]) -> Optional[Path]:
    """``flag DIR`` names a directory to write into: DIR is a directory if it exists; if not, it is
    made, in a directory that exists and is writable (the one rule of output_file: a missing
    directory above it is refused, never made). None passes."""
    if path is None:
        return None
    p = Path(path)
    what = f"{flag} {path}"
    if p.exists():
        if not p.is_dir():
            raise UsageError(f"{what}: {p} is a file, not a directory; give a directory (it is made if missing)")
        if not _writable(p):
            raise UsageError(f"{what}: the directory {p} is not writable; give another path")
        return p
    parent = p.parent
    if not parent.exists():
        raise UsageError(f"{what}: the directory {parent} does not exist; create it or give another path "
                         f"({p.name} itself is made if missing)")
    if not parent.is_dir():
        raise UsageError(f"{what}: {parent} is a file, not a directory; give another path")
    if not _writable(parent):
        raise UsageError(f"{what}: the directory {parent} is not writable; give another path")
    return p


def require_extra(flag: str, module: str, extra: str) -> None:
    """``flag`` needs the optional package ``module``, which the extra ``extra`` installs: a
    UsageError naming both where it cannot be imported, before any work."""
    import importlib

    try:
        importlib.import_module(module)
    except ImportError:
        raise UsageError(f"{flag} needs {module}, which is not installed: pip install 'mimo-accel[{extra}]' "
                         f"(the extra {extra}), or pip install {module}") from None


# -- the one line ---------------------------------------------------------------------------------


def one_line(exc: Union[BaseException, str]) -> str:
    """An error message on one line; an OSError as ``FILE: reason``, naming a missing directory."""
    if isinstance(exc, OSError) and exc.filename is not None and exc.strerror:
        text = f"{exc.filename}: {exc.strerror}"
        parent = Path(str(exc.filename)).parent
        if isinstance(exc, FileNotFoundError) and not parent.exists():
            text += f" (the directory {parent} does not exist; create it or give another path)"
        return text
    return " ".join(str(exc).split()) or type(exc).__name__


def fail(prog: str, exc: Union[BaseException, str]) -> int:
    """Print ``<prog>: error: <one line>`` on stderr; returns 2 (a subcommand's ``main()`` returns it).
    With ``MIMO_ACCEL_TRACEBACK=1`` the exception's traceback comes first (debugging)."""
    if isinstance(exc, BaseException) and os.environ.get(TRACEBACK_ENV) == "1":
        import traceback

        traceback.print_exception(type(exc), exc, exc.__traceback__, file=sys.stderr)
    print(f"{prog}: error: {one_line(exc)}", file=sys.stderr)
    return 2
