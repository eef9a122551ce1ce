"""The console of the command line: `python -m mimo_accel` is `mimo-accel`; a rehearsal prints its
progress, losses and report, and sends third-party import noise and rank output to one log file
that it names (and names again, with the error, when the run fails)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mimo_accel.tools import quiet
from mimo_accel_dev.rehearse import rehearsal
from mimo_accel_dev.commands import rehearse as rehearsing
from mimo_accel.tools.report import STABLE_KEYS
from mimo_accel_dev.rehearse.ranks import RankFailure

ROOT = Path(__file__).resolve().parents[1]

# What megatron's imports print on a machine without Transformer Engine / Apex.
THIRD_PARTY = ("Transformer Engine", "Apex", "modelopt", "FP8GlobalStateManager", "UserWarning", "Traceback",
               "MimoModelConfig is experimental", "INFO:")


def _run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    env = dict(os.environ, COLUMNS="120")
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_python_m_mimo_accel_is_the_cli():
    via_m = _run("-m", "mimo_accel", "--help")
    via_entry = _run("-c", "import sys; from mimo_accel.tools.cli import main; sys.exit(main())", "--help")
    assert via_m.returncode == 0, via_m.stderr
    assert via_m.stdout == via_entry.stdout
    for sub in ("doctor", "run", "report", "rehearse", "layout", "simulate", "index", "calibrate", "calibrate-gpu"):
        assert sub in via_m.stdout
    # a delegated subcommand, its exit code passed through
    bad = _run("-m", "mimo_accel", "report", "/nonexistent/profile/dir")
    assert bad.returncode == 2 and "mimo-accel report: error" in bad.stderr


_NOISY_IMPORT = """
import logging, os, sys, warnings
from mimo_accel.tools import quiet
with quiet.output_to(sys.argv[1]):
    os.write(2, b"c-level stderr\\n")
    print("python stdout")
    warnings.warn("a third-party UserWarning")
    noisy = logging.getLogger("noisy_third_party")
    noisy.addHandler(logging.StreamHandler(sys.stderr))
    noisy.warning("logged during the import")
noisy.warning("logged after the import")
print("project output")
os.write(2, b"project stderr\\n")
"""


def test_output_to_captures_fds_warnings_and_new_handlers(tmp_path):
    log = tmp_path / "third-party.log"
    proc = _run("-c", _NOISY_IMPORT, str(log))
    assert proc.returncode == 0, proc.stderr
    # the console is back after the block: what the project prints afterwards is seen
    assert (proc.stdout, proc.stderr) == ("project output\n", "project stderr\n")
    text = log.read_text()
    for line in ("c-level stderr", "python stdout", "a third-party UserWarning", "logged during the import",
                 "logged after the import"):
        assert line in text


def test_output_to_lets_errors_through(tmp_path, capfd):
    with pytest.raises(ImportError, match="no such module"):
        with quiet.output_to(tmp_path / "x.log"):
            raise ImportError("no such module")
    os.write(2, b"visible\n")
    assert capfd.readouterr().err == "visible\n"


@pytest.mark.distributed  # the rehearsal in the fresh process starts two gloo ranks
def test_rehearse_console_is_quiet_and_names_the_log(tmp_path):
    """A small rehearsal in a fresh process (so its forkserver imports megatron here): the console
    has the progress, the losses and the report, none of megatron's import noise, and the log's
    path, once; the log has the noise and every rank's output; the JSON has the report's keys at
    the top level."""
    out, js = tmp_path / "runs", tmp_path / "r.json"
    proc = _run("-m", "mimo_accel", "rehearse", "--workload", "uniform", "--steps", "2", "--vision-dp", "1",
                "--language-dp", "1", "--out", str(out), "--json", str(js), timeout=400)
    console = proc.stdout + proc.stderr
    assert proc.returncode == 0, console
    for noise in THIRD_PARTY:
        assert noise not in console, f"{noise!r} reached the console:\n{console}"
    assert "Per-step language loss" in console and "mimo-accel profile report" in console
    log = out / "rehearsal.log"
    assert console.count(str(log)) == 1
    text = log.read_text()
    assert "Apex" in text and "Transformer Engine" in text  # the forkserver's import, captured
    for run in ("baseline", "accelerated"):
        assert f"{run} run" in text
    assert text.count("rank 0 of 2") == text.count("rank 1 of 2") == 2
    doc = json.loads(js.read_text())
    assert doc["log"] == str(log) and "report" not in doc
    assert set(STABLE_KEYS) <= set(doc["before"]) and set(STABLE_KEYS) <= set(doc["after"])


def test_rehearse_failure_prints_the_error_and_the_log(tmp_path, monkeypatch, capsys):
    def failing_run(*args, **kwargs):
        raise RankFailure("rank 3 of 8 failed:\nValueError: the real error")

    monkeypatch.setattr(rehearsal, "run_stack", failing_run)
    rc = rehearsing.main(["--workload", "uniform", "--steps", "2", "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert rc == 1
    assert "ValueError: the real error" in err
    assert str(tmp_path / "rehearsal.log") in err
