"""Every bad command line ends in one ``mimo-accel <cmd>: error: ...`` line naming the fix, exit 2,
never a traceback (real subprocesses, ``python -m mimo_accel``, and every subcommand's bad input
through the real ``main()`` in-process), checked before any work starts or any temp directory is
made; ``run`` / ``env`` give the job its config from ``--config FILE`` / ``--features`` /
``key=value``; the launcher's bootstrap stops a job with one line on a bad value and leaves
interpreters without torch alone."""

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


BAD_FACTORY = """
import sys, warnings
warnings.warn("noise from importing the factory")
print("noise on stdout")
print("noise on stderr", file=sys.stderr)

def build():
    return {"split": "train"}["spilt"]
"""


@pytest.fixture(scope="module")
def quiet_commands(tmp_path_factory):
    """`doctor` and `index --dataset`, each importing Megatron in an interpreter of its own, started
    side by side (the test process only waits): name -> (completed process, its log, extra path)."""
    d = tmp_path_factory.mktemp("quiet")
    factory = d / "my_train.py"
    factory.write_text(BAD_FACTORY)
    commands = {
        "doctor": (["doctor", "--log", str(d / "logs" / "doctor.log")], {"COLUMNS": "120"}, d / "logs" / "doctor.log"),
        "index": (["index", "--dataset", f"{factory}:build", "--log", str(d / "logs" / "index.log")], {},
                  d / "logs" / "index.log"),
    }
    started = {name: subprocess.Popen([sys.executable, "-m", "mimo_accel", *args], cwd=ROOT, env=_clean_env(**env),
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
               for name, (args, env, _) in commands.items()}
    done = {}
    for name, proc in started.items():
        out, err = proc.communicate(timeout=120)
        done[name] = (subprocess.CompletedProcess(proc.args, proc.returncode, out, err), commands[name][2], factory)
    return done


def test_doctor_sends_import_noise_to_its_log(quiet_commands):
    proc, log, _ = quiet_commands["doctor"]
    assert proc.returncode == 0, proc.stderr
    console = proc.stdout + proc.stderr
    for noise in ("UserWarning", "Traceback", "Transformer Engine", "modelopt"):
        assert noise not in console
    assert console.strip().splitlines()[-1] == f"third-party import output: {log}"
    assert "megatron-bridge" in proc.stdout and "mimo-accel" in proc.stdout
    assert "UserWarning" in log.read_text()


# -- every subcommand's bad input, through the real main(), before any work -----------------------

ARGPARSE = "argparse"  # the usage line(s) come first, as argparse prints them


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    d = tmp_path_factory.mktemp("inputs")
    (d / "file").write_text("not a directory\n")
    (d / "empty").mkdir()
    (d / "runs" / "baseline").mkdir(parents=True)
    (d / "runs" / "baseline" / "rank0.jsonl").write_text("")
    (d / "m.jsonl").write_text('{"image_sizes": [[64, 64]], "tokens": 8}\n')
    return d


@pytest.fixture
def no_work(tmp_path, monkeypatch):
    """An empty temp directory for the command, and no rehearsal can start: a bad argument must be
    refused before either."""
    import tempfile

    from mimo_accel.rehearse import rehearsal

    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    monkeypatch.setenv("TMPDIR", str(tmp))
    monkeypatch.delenv(cli.TRACEBACK_ENV, raising=False)

    def started(*args, **kwargs):
        pytest.fail("the rehearsal started before its arguments were checked")

    monkeypatch.setattr(rehearsal, "run_stack", started)
    monkeypatch.setattr(rehearsal, "run_bridge", started)
    return tmp


IN_PROCESS = [
    # rehearse: numbers, the workload, the example, the layout, the outputs
    (["rehearse", "--steps", "0"], ARGPARSE, ["argument --steps: must be a positive integer", "got 0"]),
    (["rehearse", "--steps", "two"], ARGPARSE, ["argument --steps: must be a positive integer", "got 'two'"]),
    (["rehearse", "--vision-dp", "0"], ARGPARSE, ["argument --vision-dp: must be a positive integer"]),
    (["rehearse", "--language-dp", "-2"], ARGPARSE, ["argument --language-dp: must be a positive integer", "-2"]),
    (["rehearse", "--seed", "-1"], ARGPARSE, ["argument --seed: must be an integer >= 0"]),
    (["rehearse", "--loop", "bridge", "--steps", "0"], ARGPARSE, ["argument --steps: must be a positive integer"]),
    (["rehearse", "--workload", "nope"], None, ["nope.toml: no such profile file", "shipped profiles (", "receipts"]),
    (["rehearse", "--workload", "{d}/file"], None, ["{d}/file: not valid TOML", "fix the syntax"]),
    (["rehearse", "--vision-dp", "3"], None, ["--vision-dp 3: vision DP 3 and language DP 4: one must divide the other",
                                              "give e.g. --vision-dp 3 --language-dp 3"]),
    (["rehearse", "--vision-dp", "32"], None, ["--vision-dp 32: workload receipts: the rehearsal micro-batch of 48",
                                               "give DP sizes that divide 48"]),
    (["rehearse", "--loop", "bridge", "--example", "{d}/nope.py"], None, ["nope.py does not exist", "pass --example"]),
    (["rehearse", "--loop", "bridge", "--vision-dp", "3"], None, ["one must divide the other"]),
    (["rehearse", "--loop", "bridge", "--vision-dp", "128", "--language-dp", "128"], None,
     ["the micro-batch of 64 samples does not split evenly", "give DP sizes that divide 64"]),
    (["rehearse", "--loop", "bridge", "--workload", "receipts"], ARGPARSE, ["--workload applies to --loop stack",
                                                                            "drop --workload"]),
    (["rehearse", "--example", "x.py"], ARGPARSE, ["--example applies to --loop bridge", "add --loop bridge"]),
    (["rehearse", "--out", "{d}/file"], None, ["--out {d}/file: {d}/file is a file, not a directory",
                                               "give a directory"]),
    (["rehearse", "--out", "{d}/file/sub"], None, ["is a file, not a directory; give another path"]),
    (["rehearse", "--json", "{d}/missing/r.json"], None, ["--json {d}/missing/r.json: the directory {d}/missing does "
                                                          "not exist; create it or give another path"]),
    (["rehearse", "--json", "{d}/empty"], None, ["--json {d}/empty: is a directory; give the path of a file"]),
    (["rehearse", "--loop", "bridge", "--json", "{d}/missing/r.json"], None, ["the directory {d}/missing does not"]),
    # simulate
    (["simulate", "--steps", "0"], ARGPARSE, ["argument --steps: must be a positive integer"]),
    (["simulate", "--reorder-window", "0"], ARGPARSE, ["argument --reorder-window: must be a positive integer"]),
    (["simulate", "--per-replica", "0"], ARGPARSE, ["argument --per-replica: must be a positive integer"]),
    (["simulate", "--seed", "-1"], ARGPARSE, ["argument --seed: must be an integer >= 0"]),
    (["simulate", "--dp", "0"], None, ["--dp '0': DP sizes must be >= 1"]),
    (["simulate", "--workload", "nope"], None, ["no such profile file", "shipped profiles"]),
    (["simulate", "--cost-model", "{d}/none.json"], None, ["--cost-model {d}/none.json: no such file",
                                                           "mimo-accel calibrate RUN_DIR --out FILE"]),
    (["simulate", "--cost-model", "{d}/file"], None, ["not a JSON cost model",
                                                      "recreate it with `mimo-accel calibrate`"]),
    (["simulate", "--audio-dp", "2"], None, ["--audio-dp 2: the workload receipts has no [audio] encoder",
                                             "drop --audio-dp"]),
    (["simulate", "--language-dp", "twice"], None, ["--language-dp twice: give ratio", "equal, or a positive number"]),
    (["simulate", "--json", "{d}/missing/s.json"], None, ["--json {d}/missing/s.json: the directory {d}/missing does "
                                                          "not exist"]),
    (["simulate", "--png", "{d}/missing/s.png"], None, ["--png {d}/missing/s.png: the directory"]),
    # index
    (["index"], None, ["give a manifest or --dataset MODULE:NAME"]),
    (["index", "{d}/none.jsonl"], None, ["none.jsonl: no such file; give the JSONL manifest"]),
    (["index", "{d}/empty"], None, ["empty: is a directory; give the JSONL manifest"]),
    (["index", "{d}/m.jsonl", "--workers", "0"], ARGPARSE, ["argument --workers: must be a positive integer"]),
    (["index", "{d}/m.jsonl", "--patch-size", "0"], ARGPARSE, ["argument --patch-size: must be a positive integer"]),
    (["index", "{d}/m.jsonl", "--min-pixels", "10", "--max-pixels", "5"], None,
     ["--min-pixels 10 exceeds --max-pixels 5", "give a smaller --min-pixels or a larger --max-pixels"]),
    (["index", "{d}/m.jsonl", "--out", "{d}/file/x.npz"], None, ["--out {d}/file/x.npz:",
                                                                 "is a file, not a directory"]),
    (["index", "{d}/m.jsonl", "--cache-dir", "{d}/empty"], None, ["--cache-dir and --refresh apply to --dataset only",
                                                                  "drop them"]),
    (["index", "{d}/m.jsonl", "--log", "{d}/i.log"], None, ["--log applies to --dataset only", "drop --log"]),
    (["index", "--dataset", "no_colon"], None, ["expected MODULE:NAME, e.g. my_train:build_dataset"]),
    (["index", "--dataset", "mimo_accel_no_such_module:build"], None,
     ["no module named 'mimo_accel_no_such_module' here", "put it on PYTHONPATH"]),
    (["index", "--dataset", "{d}/nope.py:build"], None, ["no such file {d}/nope.py; give the .py file"]),
    (["index", "--dataset", "x:build", "--patch-size", "16"], None, ["--patch-size applies to manifests only",
                                                                     "drop it"]),
    (["index", "--dataset", "{d}/nope.py:build", "--module", "images"], None, ["--module applies to manifests only"]),
    # calibrate
    (["calibrate", "{d}/none"], None, ["none: no such directory", "give the DIR of a job run with profile=DIR"]),
    (["calibrate", "{d}/empty"], None, ["empty: no rank<N>.jsonl files", "MIMO_ACCEL_PROFILE=DIR"]),
    (["calibrate", "{d}/runs"], None, ["its subdirectories hold runs: give one of them ({d}/runs/baseline)"]),
    (["calibrate", "{d}/runs/baseline", "--out", "{d}/missing/c.json"], None,
     ["--out {d}/missing/c.json: the directory {d}/missing does not exist"]),
    (["calibrate", "{d}/runs/baseline", "--warmup", "-1"], ARGPARSE, ["argument --warmup: must be an integer >= 0"]),
    (["calibrate", "{d}/runs/baseline", "--per-step", "--no-intercept"], None, ["drop --no-intercept"]),
    # report
    (["report", "{d}/none"], None, ["none: no such directory", "give the DIR of a job run with profile=DIR"]),
    (["report", "{d}/runs"], None, ["give one of them ({d}/runs/baseline)"]),
    (["report", "{d}/runs/baseline", "--json", "{d}/missing/r.json"], None,
     ["--json {d}/missing/r.json: the directory {d}/missing does not exist"]),
    (["report", "{d}/runs/baseline", "--warmup", "-1"], ARGPARSE, ["argument --warmup: must be an integer >= 0"]),
    # doctor: its log, before the imports
    (["doctor", "--log", "{d}/file/doctor.log"], None, ["--log {d}/file/doctor.log:", "is a file, not a directory"]),
]


@pytest.mark.parametrize("args, usage, words", IN_PROCESS, ids=[" ".join(b[0])[:70] for b in IN_PROCESS])
def test_every_bad_argument_is_one_error_line_before_any_work(inputs, no_work, capsys, args, usage, words):
    cmd = args[0]
    assert cli.main([a.format(d=inputs) for a in args]) == 2
    out, err = capsys.readouterr()
    lines = err.rstrip("\n").split("\n")
    assert lines[-1].startswith(f"mimo-accel {cmd}: error: "), err
    for w in words:
        assert w.format(d=inputs) in lines[-1], lines[-1]
    if usage is ARGPARSE:
        assert lines[0].startswith(f"usage: mimo-accel {cmd}"), err
        assert all(not line.startswith("mimo-accel") for line in lines[:-1]), err
    else:
        assert len(lines) == 1, err
    assert out == ""
    assert list(no_work.iterdir()) == []  # no temp directory (nor file) made


def test_a_renamed_flag_still_works_says_so_once_and_its_errors_name_the_new_one(inputs, no_work, capsys):
    assert cli.main(["simulate", "--cost", str(inputs / "none.json")]) == 2
    warning, error = capsys.readouterr().err.splitlines()
    assert warning == ("mimo-accel simulate: warning: --cost is renamed --cost-model; the old spelling still works "
                       "for now")
    assert error.startswith("mimo-accel simulate: error: --cost-model ") and "no such file" in error
    assert cli.main(["simulate", "--window", "0"]) == 2  # the old spelling is checked as the new one
    assert capsys.readouterr().err.splitlines()[-1] == ("mimo-accel simulate: error: argument --window: must be a "
                                                        "positive integer (1, 2, ...), got 0")
    help_text = subprocess.run([sys.executable, "-m", "mimo_accel", "simulate", "--help"], env=_clean_env(),
                               capture_output=True, text=True, timeout=60).stdout
    assert "--cost-model" in help_text and "--reorder-window" in help_text
    assert "--cost " not in help_text and "--window" not in help_text  # hidden


def test_a_genuine_bug_is_not_made_one_line(monkeypatch, capsys):
    """The one line is for what the user can fix; a bug (here a TypeError) keeps its traceback."""
    def main(argv):
        raise TypeError("unsupported operand")

    monkeypatch.setitem(sys.modules, "mimo_accel_i20_bug", types.SimpleNamespace(main=main))
    monkeypatch.setitem(cli.DELEGATED, "report", ("mimo_accel_i20_bug", "stub"))
    with pytest.raises(TypeError, match="unsupported operand"):
        cli.main(["report", "x"])


def test_traceback_env_shows_where_a_subcommand_error_came_from(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv(cli.TRACEBACK_ENV, "1")
    assert cli.main(["simulate", "--workload", str(tmp_path / "nope.toml")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("Traceback (most recent call last):") and "in load_profile" in err
    assert err.splitlines()[-1].startswith("mimo-accel simulate: error: ")


@pytest.mark.parametrize("args, words", [
    (["rehearse", "--steps", "0"], "argument --steps: must be a positive integer"),
    (["rehearse", "--workload", "nope"], "no such profile file"),
    (["rehearse", "--json", "/nonexistent-dir/r.json"], "the directory /nonexistent-dir does not exist"),
])
def test_rehearse_refuses_before_making_its_temp_directory(tmp_path, args, words):
    proc = _cli(*args, TMPDIR=str(tmp_path), timeout=60)
    _one_error_line(proc, "rehearse", words)
    assert list(tmp_path.iterdir()) == []


def test_index_dataset_noise_goes_to_the_log_and_a_factory_error_is_one_line(quiet_commands):
    proc, log, factory = quiet_commands["index"]
    assert proc.stdout == ""
    assert proc.stderr.count("\n") == 1, proc.stderr  # none of the noise: only the line
    _one_error_line(proc, "index", f"--dataset {factory}:build: KeyError: 'spilt'", f"the traceback is in {log}")
    text = log.read_text()
    for noise in ("noise from importing the factory", "noise on stdout", "noise on stderr", "Traceback",
                  "Transformer Engine"):
        assert noise in text
