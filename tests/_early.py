"""Commands that tests only wait on, started as soon as the run is collected.

Each of them spends seconds importing Megatron in an interpreter of its own, while the in-process
tests keep one core busy. A test module declares its commands when it is imported (collection);
``conftest.py`` starts those of the modules that have selected tests, at most one fewer at a time
than the machine has cores, so they run on the cores the in-process tests leave idle. A test that
needs one whose turn has not come runs it itself, at once.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional


@dataclass
class _Command:
    argv: list
    env: Optional[dict]
    cwd: Optional[str]
    module: str
    needs_megatron: bool
    timeout_s: float
    claimed: bool = False
    result: Optional[subprocess.CompletedProcess] = None
    error: Optional[str] = None
    done: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        try:
            proc = subprocess.Popen(self.argv, env=self.env, cwd=self.cwd, text=True,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            try:
                out, err = proc.communicate(timeout=self.timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                out, err = proc.communicate()
                self.error = f"{self.argv} ran past {self.timeout_s:.0f} s; its stderr:\n{err[-3000:]}"
            self.result = subprocess.CompletedProcess(self.argv, proc.returncode, out, err)
        except OSError as exc:
            self.error = f"{self.argv} did not start: {exc}"
        finally:
            self.done.set()


_commands: dict[str, _Command] = {}
_lock = threading.Lock()
_scratch: list = []


def scratch(prefix: str) -> Path:
    """A directory for a command's files, made now (a test module's import comes before any
    fixture) and removed when the run ends (:func:`clean`)."""
    path = Path(tempfile.mkdtemp(prefix=f"mimo-accel-{prefix}-"))
    _scratch.append(path)
    return path


def clean() -> None:
    for path in _scratch:
        shutil.rmtree(path, ignore_errors=True)  # a command the run no longer waits for may still write there


def command(key: str, argv: list, *, module: str, env: Optional[dict] = None, cwd=None,
            needs_megatron: bool = True, timeout_s: float = 300.0) -> None:
    """Declare ``key``, a command the tests of ``module`` (its ``__name__``) will wait on."""
    _commands[key] = _Command(list(argv), env, None if cwd is None else str(cwd), module, needs_megatron, timeout_s)


def _claim(cmd: _Command) -> bool:
    with _lock:
        if cmd.claimed:
            return False
        cmd.claimed = True
        return True


def start(modules: set, megatron_installed: bool) -> None:
    """Run the commands of ``modules`` in the background, a few at a time (daemon threads: a run
    that ends early leaves them to die with it)."""
    queue = [c for c in _commands.values() if c.module in modules and (megatron_installed or not c.needs_megatron)]
    if not queue:
        return

    def drain():
        for cmd in queue:
            if _claim(cmd):
                cmd.run()

    for _ in range(max(1, min(len(queue), (os.cpu_count() or 2) - 1))):
        threading.Thread(target=drain, daemon=True, name="tests-early-commands").start()


def result(key: str) -> subprocess.CompletedProcess:
    """``key``'s completed process: waited for, or run now if no background thread has taken it."""
    cmd = _commands[key]
    if _claim(cmd):
        cmd.run()
    cmd.done.wait()
    assert cmd.error is None, cmd.error
    return cmd.result
