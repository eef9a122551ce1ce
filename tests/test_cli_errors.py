"""Every bad command line ends in one ``mimo-accel <cmd>: error: ...`` line naming the fix, exit 2,
never a traceback (real subprocesses, ``python -m mimo_accel``); ``run`` / ``env`` give the job its
config from ``--config FILE`` / ``--features`` / ``key=value``; the launcher's bootstrap stops a job
with one line on a bad value and leaves interpreters without torch alone."""

from __future__ import annotations

import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

from mimo_accel.tools import cli

ROOT = Path(__file__).resolve().parents[1]


def _clean_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MIMO_ACCEL")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env.update(extra)
    return env


def _cli(*args: str, cwd=None, timeout: float = 120, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mimo_accel", *args], cwd=cwd or ROOT, env=_clean_env(**env),
                          capture_output=True, text=True, timeout=timeout)


def _one_error_line(proc: subprocess.CompletedProcess, cmd: str, *words: str) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr and "Fatal Python error" not in proc.stderr, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"mimo-accel {cmd}: error: "), proc.stderr
    for w in words:
        assert w in last, last
    return last


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli")
    (d / "run.yaml").write_text("train: {micro_batch_size: 4}\nmimo_accel:\n  pad_multiple: 2\n")
    (d / "bridge-only.yaml").write_text("train: {micro_batch_size: 4}\n")
    return d


def test_version():
    from mimo_accel import __version__

    proc = _cli("--version")
    assert proc.returncode == 0 and proc.stdout.strip() == f"mimo-accel {__version__}"


BAD = [
    (["run", "--", "mimo-accel-no-such-binary"], {}, "run", ["'mimo-accel-no-such-binary' is not found on PATH"]),
    (["run", "--", "./no/such/script.sh"], {}, "run", ["is not an executable file"]),
    (["run", "--", sys.executable, "-c", "print(1)"], {"MIMO_ACCEL": "turbo"}, "run",
     ["MIMO_ACCEL='turbo': unknown value 'turbo'", "Valid values"]),
    (["run", "--", "true"], {"MIMO_ACCEL": "pack", "MIMO_ACCEL_PAD_MULTIPLE": "two"}, "run",
     ["MIMO_ACCEL_PAD_MULTIPLE='two' is not an integer"]),
    (["run", "--features", "turbo", "--", "true"], {}, "run", ["--features 'turbo': unknown value"]),
    (["run"], {}, "run", ["give the command to run after --"]),
    (["run", "--features", "all"], {}, "run", ["give the command to run after --"]),
    (["run", "--config", "{d}/missing.yaml", "--", "true"], {}, "run", ["missing.yaml' does not exist"]),
    (["run", "--config", "{d}/bridge-only.yaml", "--", "true"], {}, "run", ["has no mimo_accel: section"]),
    (["run", "packng=true", "--", "true"], {}, "run", ["'packng' is not a mimo_accel option"]),
    (["run", "packing=2", "--", "true"], {}, "run", ["mimo_accel.packing must be true or false"]),
    (["run", "cost_model={d}/none.json", "--", "true"], {}, "run", ["none.json': no such file", "mimo-accel calibrate"]),
    (["run", "--features", "reorder", "cost_index={d}/c-{{split}}.npz", "--", "true"], {}, "run",
     ["c-train.npz' (the train split of", "mimo-accel index"]),
    (["run", "--bogus", "--", "true"], {}, "run", ["unrecognized arguments: --bogus"]),
    (["env", "bogus"], {}, "env", ["'bogus' is not key=value"]),
    (["env", "pad_multiple=0"], {}, "env", ["pad_multiple must be a positive integer, got 0"]),
    (["env", "--config", "{d}/bridge-only.yaml"], {}, "env", ["has no mimo_accel: section"]),
    (["env"], {"MIMO_ACCEL_COST_MODEL": "a.json", "MIMO_ACCEL_COST": "b.json"}, "env", ["disagree"]),
    (["doctor", "--bogus"], {}, "doctor", ["unrecognized arguments: --bogus"]),
]


@pytest.mark.parametrize("args, env, cmd, words", BAD, ids=[" ".join(b[0])[:60] for b in BAD])
def test_bad_invocations_end_in_one_error_line(files, args, env, cmd, words):
    args = [a.format(d=files) for a in args]
    proc = _cli(*args, **env)
    _one_error_line(proc, cmd, *[w.format(d=files) for w in words])
    if cmd == "run":
        assert proc.stdout == ""  # the command never started


def test_run_gives_the_job_the_config_and_replaces_stale_variables(files):
    code = ("import os; print({k: v for k, v in os.environ.items() if k.startswith('MIMO_ACCEL')}); "
            "print(os.environ['PYTHONPATH'].split(os.pathsep)[0])")
    proc = _cli("run", "--config", str(files / "run.yaml"), "reorder_window=3", "--", sys.executable, "-c", code,
                MIMO_ACCEL_COST_INDEX="stale-index.npz", MIMO_ACCEL_ALLOW_UNTESTED="0")
    assert proc.returncode == 0, proc.stderr
    got, first = proc.stdout.strip().splitlines()
    assert eval(got) == {"MIMO_ACCEL": "0", "MIMO_ACCEL_PAD_MULTIPLE": "2", "MIMO_ACCEL_REORDER_WINDOW": "3",
                         "MIMO_ACCEL_ALLOW_UNTESTED": "0"}  # not a config variable: passed through
    assert first == str(cli.BOOTSTRAP_DIR)


def test_env_prints_the_exports_a_launcher_evals(files):
    proc = _cli("env", "--config", str(files / "run.yaml"), "--features", "shard,pack", "profile=runs/x",
                MIMO_ACCEL_COST_INDEX="stale-index.npz")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert lines[:4] == ["unset MIMO_ACCEL_COST_INDEX", "export MIMO_ACCEL=sharded_reads,packing",
                         "export MIMO_ACCEL_PROFILE=runs/x", "export MIMO_ACCEL_PAD_MULTIPLE=2"]
    assert len(lines) == 5 and lines[4].startswith(f"export PYTHONPATH={cli.BOOTSTRAP_DIR}{os.pathsep}{ROOT}")
    # what an sbatch script does with them: every Python process of the job enables mimo_accel
    probe = ("import sys, mimo_accel; s = mimo_accel.status(); "
             "print(s['active'], s['config'].pad_multiple, s['config'].profile)")
    script = f'eval "$({sys.executable} -m mimo_accel env --config {files / "run.yaml"} --features shard,pack ' \
             f'profile=runs/x)" && {sys.executable} -c "{probe}"'
    run = subprocess.run(["bash", "-c", script], env=_clean_env(), cwd=files, capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "['sharded_reads', 'packing', 'profile'] 2 runs/x"
    assert "mimo_accel: enabled sharded_reads, packing, profile (runs/x) on megatron-bridge" in run.stderr


@pytest.mark.parametrize("exc, words", [
    (FileNotFoundError(2, "No such file or directory", "missing/dir/x.json"),
     "missing/dir/x.json: No such file or directory (the directory missing/dir does not exist"),
    (ValueError("--steps must be >= 1\nsecond line"), "--steps must be >= 1 second line"),
    (PermissionError(13, "Permission denied", "/root/x"), "/root/x: Permission denied"),
])
def test_errors_escaping_a_delegated_subcommand_become_one_line(monkeypatch, capsys, exc, words):
    def main(argv):
        raise exc

    monkeypatch.setitem(sys.modules, "mimo_accel_i20_stub", types.SimpleNamespace(main=main))
    monkeypatch.setitem(cli.DELEGATED, "report", ("mimo_accel_i20_stub", "stub"))
    monkeypatch.delenv(cli.TRACEBACK_ENV, raising=False)
    assert cli.main(["report", "x"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("mimo-accel report: error: ") and words in err
    monkeypatch.setenv(cli.TRACEBACK_ENV, "1")  # debugging: the traceback instead
    with pytest.raises(type(exc)):
        cli.main(["report", "x"])


def test_bootstrap_stops_a_job_with_one_line_on_a_bad_value():
    env = _clean_env(MIMO_ACCEL="shard,turbo")
    env["PYTHONPATH"] = os.pathsep.join([str(cli.BOOTSTRAP_DIR), env["PYTHONPATH"]])
    proc = subprocess.run([sys.executable, "-c", "print('ran')"], env=env, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2 and proc.stdout == ""
    assert "Fatal Python error" not in proc.stderr and "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mimo_accel: error: MIMO_ACCEL='shard,turbo': unknown value")


def test_bootstrap_leaves_an_interpreter_without_torch_alone(tmp_path):
    # another environment's interpreter that inherited the job's PYTHONPATH (here: a bare venv)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "bare")], check=True, timeout=120)
    bare = tmp_path / "bare" / "bin" / "python"
    env = cli.launcher_env(_clean_env(), features="all")
    code = "import sys; print('mimo_accel' in sys.modules, 'torch' in sys.modules)"
    proc = subprocess.run([str(bare), "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.split() == ["False", "False"], proc.stderr
    assert proc.stderr == ""


def test_doctor_sends_import_noise_to_its_log(tmp_path):
    log = tmp_path / "logs" / "doctor.log"
    proc = _cli("doctor", "--log", str(log), COLUMNS="120")
    assert proc.returncode == 0, proc.stderr
    console = proc.stdout + proc.stderr
    for noise in ("UserWarning", "Traceback", "Transformer Engine", "modelopt"):
        assert noise not in console
    assert console.strip().splitlines()[-1] == f"third-party import output: {log}"
    assert "megatron-bridge" in proc.stdout and "mimo-accel" in proc.stdout
    assert "UserWarning" in log.read_text()
