"""Commands that tests only wait on, started as soon as the run is collected.

Each of them spends seconds importing Megatron in an interpreter of its own, while the in-process
tests keep one core busy. A test module declares its commands when it is imported (collection);
``conftest.py`` starts those of the modules that have selected tests in one runner process (this
file run as a script), at most one fewer at a time than the machine has cores, so they run on the
cores the in-process tests leave idle. The runner is a process apart so that no thread of the test
process forks while a test forks (DataLoader workers, planner children): a child forked in the
middle of another's start holds that one's pipes open. Each command's result is a file; a test
that needs one whose turn has not come runs it itself, at once (whoever creates its claim file
first runs it).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Optional

_commands: dict[str, dict] = {}
_scratch: list = []
_runs: dict = {}  # "dir": the runner's directory, "proc": the runner


def scratch(prefix: str) -> Path:
    """A directory for a command's files, made now (a test module's import comes before any
    fixture) and removed when the run ends (:func:`clean`)."""
    path = Path(tempfile.mkdtemp(prefix=f"mimo-accel-{prefix}-"))
    _scratch.append(path)
    return path


def command(key: str, argv: list, *, module: str, env: Optional[dict] = None, cwd=None,
            needs_megatron: bool = True, timeout_s: float = 300.0) -> None:
    """Declare ``key``, a command the tests of ``module`` (its ``__name__``) will wait on."""
    _commands[key] = {"key": key, "argv": [str(a) for a in argv], "env": env, "module": module,
                      "cwd": None if cwd is None else str(cwd), "needs_megatron": needs_megatron,
                      "timeout_s": timeout_s}


def declaring_modules() -> set:
    """The test modules that declared commands (so wait on them)."""
    return {c["module"] for c in _commands.values()}


def _dir() -> Path:
    if "dir" not in _runs:
        _runs["dir"] = scratch("early")
    return _runs["dir"]


def start(modules: set, megatron_installed: bool) -> None:
    """Hand the commands of ``modules`` to a runner process (started here, on the main thread,
    before any test runs)."""
    queue = [c for c in _commands.values() if c["module"] in modules and (megatron_installed or not c["needs_megatron"])]
    if not queue:
        return
    d = _dir()
    (d / "spec.json").write_text(json.dumps(queue))
    workers = max(1, min(len(queue), (os.cpu_count() or 2) - 1))
    _runs["proc"] = subprocess.Popen([sys.executable, __file__, str(d), str(workers)], stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)


def clean() -> None:
    proc = _runs.get("proc")
    if proc is not None and proc.poll() is None:  # a run that ended early: its commands go with it
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    for path in _scratch:
        shutil.rmtree(path, ignore_errors=True)


def _claim(d: Path, key: str) -> bool:
    try:
        os.close(os.open(d / f"{key}.claim", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        return True
    except FileExistsError:
        return False


def _run(d: Path, cmd: dict) -> None:
    """Run ``cmd`` and write ``<key>.json`` (its exit code, output, or why it has none), whole."""
    out = {"returncode": None, "stdout": "", "stderr": "", "error": None}
    try:
        proc = subprocess.Popen(cmd["argv"], env=cmd["env"], cwd=cmd["cwd"], text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            out["stdout"], out["stderr"] = proc.communicate(timeout=cmd["timeout_s"])
        except subprocess.TimeoutExpired:
            proc.kill()
            out["stdout"], out["stderr"] = proc.communicate()
            out["error"] = f"{cmd['argv']} ran past {cmd['timeout_s']:.0f} s; its stderr:\n{out['stderr'][-3000:]}"
        out["returncode"] = proc.returncode
    except OSError as exc:
        out["error"] = f"{cmd['argv']} did not start: {exc}"
    tmp = d / f"{cmd['key']}.json.tmp"
    tmp.write_text(json.dumps(out))
    os.replace(tmp, d / f"{cmd['key']}.json")


def result(key: str) -> subprocess.CompletedProcess:
    """``key``'s completed process: waited for, or run now if the runner has not taken it."""
    cmd, d = _commands[key], _dir()
    done = d / f"{key}.json"
    if _claim(d, key):
        _run(d, cmd)
    deadline = time.monotonic() + cmd["timeout_s"] + 60.0
    while not done.exists():  # the runner is running it: its file appears when it ends
        assert time.monotonic() < deadline, f"{cmd['argv']}: no result from the early-command runner"
        time.sleep(0.02)
    out = json.loads(done.read_text())
    assert out["error"] is None, out["error"]
    return subprocess.CompletedProcess(cmd["argv"], out["returncode"], out["stdout"], out["stderr"])


def _runner(d: Path, workers: int) -> None:
    queue = json.loads((d / "spec.json").read_text())

    def drain():
        for cmd in queue:
            if _claim(d, cmd["key"]):
                _run(d, cmd)

    threads = [threading.Thread(target=drain) for _ in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


if __name__ == "__main__":
    _runner(Path(sys.argv[1]), int(sys.argv[2]))
