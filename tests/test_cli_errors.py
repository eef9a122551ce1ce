"""Every bad command line ends in one ``mimo-accel <cmd>: error: ...`` line naming the fix, exit 2,
never a traceback (real subprocesses, ``python -m mimo_accel``, and every subcommand's bad input
through the real ``main()`` in-process), checked before any work starts or any temp directory is
made; ``run`` / ``env`` give the job its config from ``--config FILE`` / ``--features`` /
``key=value``; the launcher's bootstrap stops a job with one line on a bad value and leaves
interpreters without torch alone."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest

from tests import _early

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
    (d / "m.jsonl").write_text('{"image_sizes": [[64, 64]], "tokens": 8}\n')
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
    # a file as the profile directory: stopped before the job starts, naming the setting
    (["run", "--features", "all", "profile={d}/run.yaml", "--", "true"], {}, "run",
     ["profile='{d}/run.yaml': {d}/run.yaml is a file, not a directory", "profile=DIR, MIMO_ACCEL_PROFILE=DIR"]),
    (["env"], {"MIMO_ACCEL": "profile", "MIMO_ACCEL_PROFILE": "{d}/run.yaml/runs"}, "env",
     ["{d}/run.yaml is a file, so the directory {d}/run.yaml/runs cannot be made"]),
    (["env"], {"MIMO_ACCEL_CACHE_DIR": "{d}/run.yaml"}, "env", ["MIMO_ACCEL_CACHE_DIR='{d}/run.yaml'"]),
    (["env", "bogus"], {}, "env", ["'bogus' is not key=value"]),
    (["env", "pad_multiple=0"], {}, "env", ["pad_multiple must be a positive integer, got 0"]),
    (["env", "--config", "{d}/bridge-only.yaml"], {}, "env", ["has no mimo_accel: section"]),
    (["env"], {"MIMO_ACCEL_COST_MODEL": "a.json", "MIMO_ACCEL_COST": "b.json"}, "env",
     ["MIMO_ACCEL_COST is not a mimo_accel variable"]),
    (["doctor", "--bogus"], {}, "doctor", ["unrecognized arguments: --bogus"]),
    # issue 29's own: mistyped names and values refused before the job starts, and the exits
    (["env"], {"MIMO_ACCEL": "reorder", "MIMO_ACCEL_REODER_WINDOW": "2"}, "env",
     ["MIMO_ACCEL_REODER_WINDOW is not a mimo_accel variable (did you mean MIMO_ACCEL_REORDER_WINDOW?)"]),
    (["run", "--", "true"], {"MIMO_ACCEL": "reorder", "MIMO_ACCEL_COSTINDEX": "c.npz"}, "run",
     ["did you mean MIMO_ACCEL_COST_INDEX?"]),
    (["run", "--", "true"], {"MIMO_ACCEL_PROFIL": "runs/x"}, "run", ["did you mean MIMO_ACCEL_PROFILE?"]),
    (["env"], {"MIMO_ACCEL_ALLOW_UNTESTED": "maybe"}, "env", ["MIMO_ACCEL_ALLOW_UNTESTED='maybe': use 1"]),
    (["run", "--features", "all", "--", "true"], {"MIMO_ACCEL_ALLOW_UNTESTED": "maybe"}, "run",
     ["MIMO_ACCEL_ALLOW_UNTESTED='maybe'"]),
    (["simulate", "--dp", "512"], {}, "simulate", ["give --layout SPEC", "benchmarks/bench_balance.py"]),
    (["index", "{d}/m.jsonl", "--out", "{d}/nonexistent/dir/x.npz"], {}, "index",
     ["the directory {d}/nonexistent/dir does not exist; create it or give another path"]),
]


@pytest.mark.parametrize("args, env, cmd, words", BAD, ids=[" ".join(b[0])[:60] for b in BAD])
def test_bad_invocations_end_in_one_error_line(files, args, env, cmd, words):
    args = [a.format(d=files) for a in args]
    proc = _cli(*args, **{k: v.format(d=files) for k, v in env.items()})
    _one_error_line(proc, cmd, *[w.format(d=files) for w in words])
    if cmd == "run":
        assert proc.stdout == ""  # the command never started
    assert not (files / "nonexistent").exists()  # a missing directory is refused, never made


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


@pytest.mark.megatron
def test_env_prints_the_exports_a_launcher_evals(files):
    proc = _cli("env", "--config", str(files / "run.yaml"), "--features", "shard,pack", "profile=runs/x",
                cwd=files, MIMO_ACCEL_COST_INDEX="stale-index.npz")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert lines[0].startswith("# mimo_accel turns on sharded_reads, packing, profile (into ")
    assert lines[1:] == ["unset MIMO_ACCEL_COST_INDEX", "export MIMO_ACCEL=sharded_reads,packing,profile",
                         f"export MIMO_ACCEL_PROFILE={files / 'runs' / 'x'}", "export MIMO_ACCEL_PAD_MULTIPLE=2"]
    # what an sbatch script does with them: every Python process of the job enables mimo_accel through the
    # install's startup hook, with nothing on PYTHONPATH, and the profile where env was run
    probe = ("import sys, mimo_accel; s = mimo_accel.status(); "
             "print(s['active'], s['config'].pad_multiple, s['config'].profile)")
    script = f'eval "$({sys.executable} -m mimo_accel env --config {files / "run.yaml"} --features shard,pack ' \
             f'profile=runs/x)" && cd / && {sys.executable} -c "{probe}"'
    env = _clean_env()
    del env["PYTHONPATH"]
    run = subprocess.run(["bash", "-c", script], env=env, cwd=files, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == f"['sharded_reads', 'packing', 'profile'] 2 {files / 'runs' / 'x'}"
    assert f"mimo_accel: enabled sharded_reads, packing, profile ({files / 'runs' / 'x'}) on megatron-bridge" in run.stderr


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


@pytest.mark.megatron
def test_a_file_as_the_profile_directory_stops_the_job_before_its_script(tmp_path):
    """Today's failure was a FileExistsError deep inside Megatron's schedule, after the model was built:
    the job's own start refuses it, in one line naming the setting, before the script runs."""
    (tmp_path / "profile").write_text("a file\n")
    env = _clean_env(MIMO_ACCEL="all", MIMO_ACCEL_PROFILE=str(tmp_path / "profile"))
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "train_mimo.py"), "--cpu"], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stdout == "" and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    (line,) = proc.stderr.splitlines()
    assert line.startswith(f"mimo_accel: error: profile='{tmp_path / 'profile'}': {tmp_path / 'profile'} is a file, "
                           "not a directory"), line


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


def _declare_quiet_commands() -> dict:
    """`doctor` and `index --dataset`, each importing Megatron in an interpreter of its own, started
    early (tests/_early.py): name -> (its log, the factory file)."""
    d = _early.scratch("quiet")
    (d / "logs").mkdir()  # an output's directory must exist (docs/usage.md)
    factory = d / "my_train.py"
    factory.write_text(BAD_FACTORY)
    commands = {
        "doctor": (["doctor", "--log", str(d / "logs" / "doctor.log")], {"COLUMNS": "120"}, d / "logs" / "doctor.log"),
        "index": (["index", "--dataset", f"{factory}:build", "--log", str(d / "logs" / "index.log")], {},
                  d / "logs" / "index.log"),
    }
    for name, (args, env, _) in commands.items():
        _early.command(f"quiet-{name}", [sys.executable, "-m", "mimo_accel", *args], module=__name__, cwd=ROOT,
                       env=_clean_env(**env), timeout_s=120)
    return {name: (log, factory) for name, (_, _, log) in commands.items()}


_QUIET = _declare_quiet_commands()


@pytest.fixture(scope="module")
def quiet_commands():
    """name -> (completed process, its log, extra path)."""
    return {name: (_early.result(f"quiet-{name}"), log, factory) for name, (log, factory) in _QUIET.items()}


@pytest.mark.megatron
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

ARGPARSE = "argparse"  # argparse's own error, on one line with where to look (the usage block is --help's)


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

    from mimo_accel_dev.rehearse import rehearsal

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
    (["rehearse", "--loop", "bridge", "--workload", "receipts"], None, ["--workload applies to --loop stack",
                                                                            "drop --workload"]),
    (["rehearse", "--example", "x.py"], None, ["--example applies to --loop bridge", "add --loop bridge"]),
    (["rehearse", "--peer", "4608"], None, ["--peer applies to --loop bridge", "add --loop bridge"]),
    (["rehearse", "--loop", "bridge", "--cost-model", "{d}/nope.json"], None, ["--cost-model", "nope.json"]),
    (["rehearse", "--out", "{d}/file"], None, ["--out {d}/file: {d}/file is a file, not a directory",
                                               "give a directory"]),
    (["rehearse", "--out", "{d}/file/sub"], None, ["is a file, not a directory; give another path"]),
    (["rehearse", "--json", "{d}/missing/r.json"], None, ["--json {d}/missing/r.json: the directory {d}/missing does "
                                                          "not exist; create it or give another path"]),
    (["rehearse", "--json", "{d}/empty"], None, ["--json {d}/empty: is a directory; give the path of a file"]),
    (["rehearse", "--loop", "bridge", "--json", "{d}/missing/r.json"], None, ["the directory {d}/missing does not"]),
    # simulate: layout --current, spelled --layout
    (["simulate", "--layout", "reference-27b", "--steps", "0"], ARGPARSE, ["argument --steps: must be a positive integer"]),
    (["simulate", "--layout", "reference-27b", "--seed", "-1"], ARGPARSE, ["argument --seed: must be an integer >= 0"]),
    (["simulate", "--layout", "reference-27b", "--workload", "nope"], None, ["no such profile file", "shipped profiles"]),
    (["simulate", "--workload", "receipts"], None, ["give --layout SPEC", "bench_balance.py"]),
    (["simulate", "--layout", "reference-27b", "--json", "{d}/missing/s.json"], None,
     ["--json {d}/missing/s.json: the directory {d}/missing does not exist"]),
    # layout: the sources, the machine, the layout, the numbers, the outputs
    (["layout", "--gpus", "17", "--steps", "2000"], ARGPARSE, ["argument --steps: 2000 is more than 1024 draws"]),
    (["layout", "--model", "qwen35-vl-28b", "--gpus", "17"], None, ["--model qwen35-vl-28b: no such preset or file"]),
    (["layout", "--model", "qwen35-vl-27b"], None, ["give --gpus N (the GPU budget: search), or --current SPEC"]),
    (["layout", "--model", "qwen35-vl-27b", "--gpus", "0"], ARGPARSE, ["argument --gpus: must be a positive integer"]),
    (["layout", "--from", "{d}/none"], None, ["--from {d}/none: no such directory"]),
    (["layout", "--from", "{d}/runs/baseline"], None, ["--from {d}/runs/baseline: no step records"]),
    (["layout", "--model", "qwen35-vl-27b", "--gpus", "17", "--gpu", "tpu"], None,
     ["--gpu tpu: unknown GPU; give one of h100, h200, a100, a100-40, b200, cpu", "--peak-tflops"]),
    (["layout", "--model", "qwen35-vl-27b", "--gpus", "17", "--current", "nope"], None,
     ["--current: 'nope': no such preset; give one of reference-27b"]),
    (["layout", "--model", "qwen35-vl-27b", "--gpus", "17", "--mbs", "two"], None,
     ["--mbs two: give global micro-batch sizes as positive whole numbers"]),
    (["layout", "--model", "qwen35-vl-27b", "--gpus", "17", "--workload", "receipts", "--index", "{d}/m.jsonl"], None,
     ["--workload and --index both give the samples; give one"]),
    (["layout", "--model", "qwen35-vl-27b", "--gpus", "17", "--memory-reserve", "1"], ARGPARSE,
     ["argument --memory-reserve: must be a share in [0, 1)"]),
    (["layout", "--model", "qwen35-vl-27b", "--gpus", "17", "--json", "{d}/missing/l.json"], None,
     ["--json {d}/missing/l.json: the directory {d}/missing does not exist"]),
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
    assert len(lines) == 1, err
    if usage is ARGPARSE:
        assert lines[0].endswith(f" (see mimo-accel {cmd} --help)"), err
    assert out == ""
    assert list(no_work.iterdir()) == []  # no temp directory (nor file) made


def test_the_old_spelling_of_a_renamed_flag_is_refused(no_work, capsys):
    assert cli.main(["simulate", "--layout", "reference-27b", "--window", "3"]) == 2
    assert capsys.readouterr().err == ("mimo-accel simulate: error: unrecognized arguments: --window 3 (see "
                                       "mimo-accel simulate --help)\n")
    help_text = subprocess.run([sys.executable, "-m", "mimo_accel", "simulate", "--help"], env=_clean_env(),
                               capture_output=True, text=True, timeout=60).stdout
    assert "--steps" in help_text and "--layout SPEC" in help_text
    assert "--window" not in help_text and "--current" not in help_text  # layout's flag, which simulate spells --layout


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
    assert cli.main(["layout", "--current", "reference-27b", "--workload", str(tmp_path / "nope.toml")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("Traceback (most recent call last):") and "in load_profile" in err
    assert err.splitlines()[-1].startswith("mimo-accel layout: error: ")


@pytest.mark.parametrize("args, words", [
    (["rehearse", "--steps", "0"], "argument --steps: must be a positive integer"),
    (["rehearse", "--workload", "nope"], "no such profile file"),
    (["rehearse", "--json", "/nonexistent-dir/r.json"], "the directory /nonexistent-dir does not exist"),
])
def test_rehearse_refuses_before_making_its_temp_directory(tmp_path, args, words):
    proc = _cli(*args, TMPDIR=str(tmp_path), timeout=60)
    _one_error_line(proc, "rehearse", words)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.megatron
def test_index_dataset_noise_goes_to_the_log_and_a_factory_error_is_one_line(quiet_commands):
    proc, log, factory = quiet_commands["index"]
    assert proc.stdout == ""
    assert proc.stderr.count("\n") == 1, proc.stderr  # none of the noise: only the line
    _one_error_line(proc, "index", f"--dataset {factory}:build: KeyError: 'spilt'", f"the traceback is in {log}")
    text = log.read_text()
    for noise in ("noise from importing the factory", "noise on stdout", "noise on stderr", "Traceback",
                  "Transformer Engine"):
        assert noise in text


# -- mistyped settings, the job's Python, sizes and paths: 20+ invocations as a person types them --

@pytest.fixture(scope="module")
def typed(tmp_path_factory):
    """Files the invocations below name: a config with a typo, a script, another environment's
    Python (a bare venv: no torch, no mimo_accel of its own) and a console script of it."""
    d = tmp_path_factory.mktemp("typed")
    (d / "run.yaml").write_text("mimo_accel:\n  reorder: true\n  reorder_windows: 4\n")
    (d / "train.py").write_text("print('trained')\n")
    (d / "m.jsonl").write_text('{"image_sizes": [[64, 64]], "tokens": 8}\n')
    (d / "runs").mkdir()
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(d / "other-venv")], check=True, timeout=120)
    launcher = d / "launch"  # a console script of that environment (torchrun's kind), as pip writes one
    launcher.write_text(f"#!{d / 'other-venv' / 'bin' / 'python'}\nimport sys\nprint('started')\n")
    launcher.chmod(0o755)
    return d


# Not among the ones issue 29 lists (MIMO_ACCEL_REODER_WINDOW / COSTINDEX / PROFIL,
# ALLOW_UNTESTED=maybe, /usr/bin/python3, reorder_window without reorder, +key/++key/~key,
# report --png, index --out /nonexistent/dir/x.npz).
# (argv, environment, command, words in the error line, a path that must not have been made)
TYPED = [
    (["env"], {"MIMO_ACCEL": "reorder", "MIMO_ACCEL_WINDOW": "4"}, "env",
     ["MIMO_ACCEL_WINDOW is not a mimo_accel variable (did you mean MIMO_ACCEL_REORDER_WINDOW?)"], None),
    (["run", "--", "python", "{d}/train.py"], {"mimo_accel": "all"}, "run",
     ["mimo_accel is not a mimo_accel variable (did you mean MIMO_ACCEL?)", "rename or unset it"], None),
    (["run", "--features", "all", "--", "python", "{d}/train.py"], {"MIMO_ACCEL_COST_MODLE": "cost.json"}, "run",
     ["did you mean MIMO_ACCEL_COST_MODEL?"], None),
    (["env"], {"MIMO_ACCEL": "reorder", "MIMO_ACCEL_STRICT_GRADIENT": "1"}, "env",
     ["did you mean MIMO_ACCEL_STRICT_GRADIENTS?"], None),
    (["env"], {"MIMO_ACCEL_FEATURES": "all"}, "env", ["did you mean MIMO_ACCEL?"], None),
    (["env"], {"MIMO_ACCEL": "reorder", "MIMO_ACCEL_CALIBRATE_ONLINE": "disabled"}, "env",
     ["MIMO_ACCEL_CALIBRATE_ONLINE='disabled': expected 1 or 0"], None),
    (["env"], {"MIMO_ACCEL_TRACEBACK": "true"}, "env", ["MIMO_ACCEL_TRACEBACK='true': use 1"], None),
    (["env", "reorder=ture"], {}, "env", ["mimo_accel.reorder must be true or false, got 'ture'"], None),
    (["env", "reorder_windw=4"], {}, "env", ["'reorder_windw' is not a mimo_accel option; did you mean "
                                            "'reorder_window'?"], None),
    (["env", "mimo_acel.packing=true"], {}, "env", ["did you mean 'mimo_accel.packing'?"], None),
    (["env", "--features", "pack", "~reorder=true"], {}, "env",
     ["override '~reorder=true': mimo_accel.reorder is False, not True; write ~reorder"], None),
    (["env", "+packing"], {}, "env", ["'+packing' is not key=value", "+key=value, ++key=value, ~key"], None),
    (["env", "reorder_mode=Exchange"], {}, "env", ["reorder_mode='Exchange' is not one of"], None),
    (["env", "--features", "pack", "pad_multiple=2.0"], {}, "env",
     ["mimo_accel.pad_multiple must be a positive integer, got 2.0"], None),
    (["env", "--features", "reorder", "cost_model=~/costs/model.json"], {}, "env",  # quoted: the shell left ~
     ["cost_model='~/costs/model.json': no such file"], None),
    (["run", "--config", "{d}/run.yaml", "--", "python", "{d}/train.py"], {}, "run",
     ["'reorder_windows' is not a mimo_accel option; did you mean 'reorder_window'?"], None),
    (["run", "--features", "pack", "--", sys.executable, "-S", "{d}/train.py"], {}, "run",
     ["runs neither mimo_accel's startup hook nor the bootstrap mimo-accel run puts on PYTHONPATH (-S: it skips the "
      "site import", "drop -S"], None),
    (["run", "--features", "all", "--", "{d}/launch", "--nproc-per-node", "2", "{d}/train.py"], {}, "run",
     ["the Python '{d}/launch' runs, {d}/other-venv/bin/python", "has no torch", "nothing would be enabled"], None),
    (["layout", "--current", "images=tp1,pp1,dp1 language=tp4,pp3,dp2 mbs=2 gbs=32"], {}, "layout",
     ["language=pp3: 64 layers do not split evenly over 3 stages", "first=N / last=N"], None),
    (["rehearse", "--out", "{d}/runs/2026/demo"], {}, "rehearse",
     ["--out {d}/runs/2026/demo: the directory {d}/runs/2026 does not exist"], "{d}/runs/2026"),
    (["doctor", "--log", "{d}/logs/doctor.log"], {}, "doctor", ["the directory {d}/logs does not exist"], "{d}/logs"),
    (["index", "--dataset", "{d}/train.py:build", "--cache-dir", "{d}/cache/mimo/v1"], {}, "index",
     ["--cache-dir {d}/cache/mimo/v1: the directory {d}/cache/mimo does not exist"], "{d}/cache"),
    (["index", "{d}/m.jsonl", "--out", "{d}/indexes/costs.npz"], {}, "index",
     ["--out {d}/indexes/costs.npz: the directory {d}/indexes does not exist"], "{d}/indexes"),
    (["gpu-check", "--device", "cpu", "--size", "tiny", "--out", "{d}/results/gpu"], {}, "gpu-check",
     ["--out {d}/results/gpu: the directory {d}/results does not exist"], "{d}/results"),
]


@pytest.mark.parametrize("args, env, cmd, words, not_made", TYPED, ids=[" ".join(t[0])[:60] for t in TYPED])
def test_invocations_as_a_person_types_them_end_in_one_line(typed, args, env, cmd, words, not_made):
    proc = _cli(*[a.format(d=typed) for a in args], **env)
    line = _one_error_line(proc, cmd, *[w.format(d=typed) for w in words])
    assert proc.stderr.strip() == line and proc.stdout == ""  # one line, and nothing started
    if not_made is not None:
        assert not Path(not_made.format(d=typed)).exists()  # a missing directory is refused, never made


def test_run_refuses_a_python_that_cannot_import_mimo_accel(typed, monkeypatch, capsys):
    # the job's PYTHONPATH without this checkout: the other environment has no mimo_accel at all
    monkeypatch.setenv("PYTHONPATH", "")
    for var in [v for v in os.environ if v.startswith("MIMO_ACCEL")]:
        monkeypatch.delenv(var)
    monkeypatch.setattr(os, "execve", lambda *args: pytest.fail("the job started"))
    python = typed / "other-venv" / "bin" / "python"
    assert cli.main(["run", "--features", "all", "--", str(python), str(typed / "train.py")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"mimo-accel run: error: the command's Python, {python} (Python ")
    assert "cannot import mimo_accel, so nothing would be enabled; install mimo-accel into that environment" in err


@pytest.mark.parametrize("flags, words", [
    (["-S"], "(-S: it skips the site import that runs startup hooks and sitecustomize)"),
    (["-u", "-S"], "(-S: it skips the site import that runs startup hooks and sitecustomize)"),
    (["-IS"], "(-S: it skips the site import that runs startup hooks and sitecustomize)"),
])
def test_run_refuses_startup_options_that_skip_the_bootstrap(typed, flags, words):
    proc = _cli("run", "--features", "shard", "--", sys.executable, *flags, str(typed / "train.py"))
    _one_error_line(proc, "run", words, f"drop {words[1:3]}")
    assert proc.stdout == ""


@pytest.mark.megatron
def test_run_starts_a_job_whose_python_enables_mimo_accel(typed, tmp_path):
    probe = "import mimo_accel, sys; print(mimo_accel.status()['active'], sys.argv[1:])"
    proc = _cli("run", "--features", "shard", "--", sys.executable, "-u", "-c", probe, "x")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "['sharded_reads'] ['x']"
    # a console script of this environment: its #! line names this Python
    script = tmp_path / "launch"
    script.write_text(f"#!{sys.executable}\nimport mimo_accel\nprint(mimo_accel.status()['active'])\n")
    script.chmod(0o755)
    proc = _cli("run", "--features", "pack", "--", str(script))
    assert proc.returncode == 0 and proc.stdout.strip() == "['packing']", proc.stderr
    # isolated mode ignores PYTHONPATH, not the install's startup hook
    proc = _cli("run", "--features", "shard", "--", sys.executable, "-I", "-c", probe, "x")
    assert proc.returncode == 0 and proc.stdout.strip() == "['sharded_reads'] ['x']", proc.stderr
    assert proc.stderr.count("mimo_accel: enabled") == 1  # the hook and run's bootstrap: enabled once


def test_run_says_when_it_cannot_ask_the_jobs_python():
    proc = _cli("run", "--features", "shard", "--", "bash", "-c", "echo started")
    assert proc.returncode == 0 and proc.stdout == "started\n", proc.stderr
    assert proc.stderr.strip() == ("mimo-accel run: note: 'bash' is neither a Python interpreter nor a Python script, "
                                   "so run cannot ask the job's Python whether it imports mimo_accel; each process "
                                   "that does logs 'mimo_accel: enabled ...' at its start")
    proc = _cli("run", "--", "bash", "-c", "echo started")  # nothing enabled: nothing to ask, nothing said
    assert proc.returncode == 0 and proc.stderr == ""


@pytest.mark.megatron
def test_run_and_env_warn_an_option_without_its_feature():
    proc = _cli("env", "--features", "pack", "reorder_window=4")
    assert proc.returncode == 0
    assert proc.stderr == ("mimo-accel env: warning: reorder_window=4 has no effect without reorder: turn reorder on, "
                           "or drop reorder_window\n")
    proc = _cli("run", "--features", "shard", "pad_multiple=2", "--", sys.executable, "-c", "print('ran')")
    assert proc.returncode == 0 and proc.stdout == "ran\n"
    assert "mimo-accel run: warning: pad_multiple=2 has no effect without packing" in proc.stderr


def test_bridge_override_grammar_reaches_the_job():
    proc = _cli("env", "+packing=true", "++mimo_accel.pad_multiple=2", "--features", "reorder", "~reorder",
                "+reorder_window=3", "~reorder_window=3")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[1:] == ["export MIMO_ACCEL=sharded_reads,packing",
                                            "export MIMO_ACCEL_PAD_MULTIPLE=2"]


def test_the_interpreter_a_command_starts(tmp_path):
    from mimo_accel.tools.job_python import interpreter_of, startup_flags

    assert startup_flags(["-u", "-IS", "train.py", "-E"]) == ["-I", "-S"]
    assert startup_flags(["-W", "ignore", "-E", "-m", "torch.distributed.run", "-I"]) == ["-E"]
    assert startup_flags(["-Xdev", "-sc", "code", "-I"]) == ["-s"]
    assert startup_flags(["--check-hash-based-pycs", "never", "-P", "x.py"]) == ["-P"]
    path = os.environ.get("PATH", os.defpath)
    assert interpreter_of("/usr/bin/python3.12", ["-I", "x.py"], path) == ["/usr/bin/python3.12", "-I"]
    scripts = {
        "direct": (f"#!{sys.executable} -E\nprint(1)\n", [sys.executable, "-E"]),
        "env": (f"#!/usr/bin/env -S {Path(sys.executable).name} -s\n", [shutil.which(Path(sys.executable).name,
                                                                                     path=path), "-s"]),
        # pip's launcher where the interpreter's path is too long for a #! line
        "trampoline": (f"#!/bin/sh\n'''exec' \"{sys.executable}\" \"$0\" \"$@\"\n' '''\nprint(1)\n", [sys.executable]),
        "shell": ("#!/bin/bash\necho hi\n", None),
        "text": ("print(1)\n", None),
    }
    for name, (text, expect) in scripts.items():
        (tmp_path / name).write_text(text)
        assert interpreter_of(str(tmp_path / name), [], path) == expect, name
    assert interpreter_of(shutil.which("true"), [], path) is None  # a binary


# -- exits of the tools: optional packages, sizes ------------------------------------------------


@pytest.mark.parametrize("args", [
    ["report", "{d}/runs/baseline", "--png", "{d}/r.png"],
])
def test_png_without_matplotlib_names_the_extra_before_any_work(inputs, no_work, monkeypatch, capsys, args):
    # matplotlib is installed here: a None entry in sys.modules makes its import fail as if it were not
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert cli.main([a.format(d=inputs) for a in args]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err == (f"mimo-accel {args[0]}: error: --png needs matplotlib, which is not installed: "
                                 "pip install 'mimo-accel[charts]' (the extra charts), or pip install matplotlib\n")
    assert not (inputs / "s.png").exists() and not (inputs / "r.png").exists()
