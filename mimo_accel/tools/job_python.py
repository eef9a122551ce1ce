"""The Python a ``mimo-accel run`` command starts, asked before the job starts whether it will enable
mimo_accel (through its install's startup hook, or the bootstrap ``run`` puts on PYTHONPATH).

The command's interpreter is resolved the way the kernel and the shell would: the program itself
when it is a Python interpreter (``python3 -u train.py``), else the interpreter its ``#!`` line
names (``torchrun``, ``deepspeed`` and every console script; ``#!/usr/bin/env python3``; pip's
``/bin/sh`` trampoline for long paths). That interpreter is started once, with the command's own
startup options (``-I``, ``-E``, ``-S``, ``-s``, ``-P``: the ones that decide whether the bootstrap
runs and what it can import) and the job's environment plus ``MIMO_ACCEL_BOOTSTRAP_PROBE``: its
startup (:mod:`mimo_accel._bootstrap.startup`) decides as in the job and reports the decision
instead of enabling. A program that is
neither (``srun``, ``bash -c ...``) cannot be asked: :func:`check_job_python` returns a note saying
so.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from typing import Mapping, Optional, Sequence

from mimo_accel.tools.arguments import UsageError

__all__ = ["check_job_python", "interpreter_of"]

PROBE_ENV = "MIMO_ACCEL_BOOTSTRAP_PROBE"  # the bootstrap's own name for it (_bootstrap/sitecustomize.py)
PROBE_TIMEOUT_S = 60
_PYTHON_NAME = re.compile(r"(python|pypy)[0-9.]*[a-z]*")
# pip/distlib's launcher where the interpreter's path is too long for a #! line
_TRAMPOLINE = re.compile(r"""^'''exec' "?(?P<python>[^"]+?)"? "\$0" "\$@"\s*$""")
# startup options that decide whether site (so the bootstrap) runs and what it can import
_STARTUP_FLAGS = "IESsP"
_WHY = {"I": "isolated mode ignores PYTHONPATH", "E": "it ignores the PYTHON* variables, PYTHONPATH too",
        "S": "it skips the site import that runs startup hooks and sitecustomize"}
_PROBE_CODE = ("import sys; s = sys.modules.get('sitecustomize'); b = sys.modules.get('mimo_accel._bootstrap.startup'); "
               "print(repr((getattr(s, '__file__', None), getattr(s, 'outcome', None), getattr(b, 'outcome', None), "
               "sys.version.split()[0])))")


def is_python(path: str) -> bool:
    return _PYTHON_NAME.fullmatch(os.path.basename(path)) is not None


def startup_flags(args: Sequence[str]) -> list[str]:
    """The startup options among an interpreter's leading arguments that change what its startup
    imports (``["-u", "-IS", "train.py"]`` -> ``["-I", "-S"]``), up to the script, ``-m`` or ``-c``."""
    flags, i = [], 0
    while i < len(args):
        word = args[i]
        if not word.startswith("-") or word == "-":
            break
        if word.startswith("--"):
            i += 2 if word == "--check-hash-based-pycs" else 1
            continue
        for j, letter in enumerate(word[1:]):
            if letter in "cm":
                return flags
            if letter in "WX":  # its value is the rest of the word, or the next word
                i += 0 if word[j + 2:] else 1
                break
            if letter in _STARTUP_FLAGS:
                flags.append(f"-{letter}")
        i += 1
    return flags


def _shebang(program: str, search_path: str) -> Optional[list[str]]:
    """``[interpreter, *its options]`` of a ``#!`` script whose interpreter is Python (else None)."""
    try:
        with open(program, "rb") as f:
            head = f.read(2048)
    except OSError:
        return None
    if not head.startswith(b"#!"):
        return None
    lines = head.decode("utf-8", errors="replace").splitlines()
    words = lines[0][2:].split()
    if not words:
        return None
    interpreter, options = words[0], words[1:]
    if os.path.basename(interpreter) == "env":
        options = [w for w in options if w != "-S" and "=" not in w]  # env -S splits; NAME=value sets
        if not options:
            return None
        interpreter = shutil.which(options[0], path=search_path) or options[0]
        options = options[1:]
    elif os.path.basename(interpreter) in ("sh", "bash") and len(lines) > 1:
        m = _TRAMPOLINE.match(lines[1])
        if m is None:
            return None
        interpreter, options = m["python"], []
    return [interpreter, *options] if is_python(interpreter) else None


def interpreter_of(program: str, args: Sequence[str], search_path: str) -> Optional[list[str]]:
    """``[interpreter, *startup flags]`` of the Python ``program args...`` starts; None where the
    program is not a Python interpreter nor a Python script (``search_path``: the job's PATH)."""
    if is_python(program):
        return [program, *startup_flags(args)]
    found = _shebang(program, search_path)
    if found is None:
        return None
    return [found[0], *startup_flags(found[1:])]


def check_job_python(command: Sequence[str], program: str, env: Mapping[str, str]) -> Optional[str]:
    """UsageError where the command's Python would not enable mimo_accel; a note where the command
    is not one whose Python can be asked; None where it will enable."""
    interpreter = interpreter_of(program, command[1:], env.get("PATH", os.defpath))
    if interpreter is None:
        return (f"{command[0]!r} is neither a Python interpreter nor a Python script, so run cannot ask the "
                "job's Python whether it imports mimo_accel; each process that does logs 'mimo_accel: enabled "
                "...' at its start")
    python = " ".join(interpreter)
    who = f"the command's Python, {python}" if interpreter[0] == program else \
        f"the Python {command[0]!r} runs, {python}"
    try:
        proc = subprocess.run([*interpreter, "-c", _PROBE_CODE], env={**env, PROBE_ENV: "1"},
                              stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S)
    except FileNotFoundError:
        raise UsageError(f"{who}: no such interpreter; install it, or give the program's full path after --") from None
    except OSError as exc:
        raise UsageError(f"{who}: cannot start it ({exc.strerror})") from None
    except subprocess.TimeoutExpired:
        raise UsageError(f"{who} did not start within {PROBE_TIMEOUT_S} s when asked whether it imports "
                         "mimo_accel; check that interpreter") from None
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise UsageError(f"{who} fails at startup: {last}")
    import ast

    bootstrap, site_outcome, outcome, version = ast.literal_eval(lines[-1])
    if outcome == "ready":  # the install's startup hook or run's bootstrap: it will enable
        return None
    if "missing: torch" in (outcome, site_outcome):
        raise UsageError(f"{who} (Python {version}) has no torch: mimo_accel's bootstrap leaves it alone, so "
                         f"nothing would be enabled; run the job with the training environment's Python")
    if outcome is not None:
        raise UsageError(f"{who} (Python {version}): its bootstrap would not enable mimo_accel (it says {outcome!r})")
    if str(site_outcome).startswith("missing: mimo_accel"):
        raise UsageError(f"{who} (Python {version}) cannot import mimo_accel, so nothing would be enabled; "
                         f"install mimo-accel into that environment, or run the job with a Python that has it "
                         f"(e.g. {sys.executable})")
    # -S skips even an install's startup hook; -I / -E only the PYTHONPATH a checkout needs
    blocking = [f"-{letter}" for letter in "SIE" if f"-{letter}" in interpreter[1:]]
    if blocking:
        flag = blocking[0]
        raise UsageError(f"{who} (Python {version}) runs neither mimo_accel's startup hook nor the bootstrap "
                         f"mimo-accel run puts on PYTHONPATH ({flag}: {_WHY[flag[1:]]}), so nothing would be "
                         f"enabled; drop {flag}, or call mimo_accel.enable() in the script")
    raise UsageError(f"{who} (Python {version}) runs neither mimo_accel's startup hook nor the bootstrap mimo-accel "
                     f"run puts on PYTHONPATH (its sitecustomize is {bootstrap or 'none'}), so nothing would be "
                     "enabled; install mimo-accel into that environment, or call mimo_accel.enable() in the script")
