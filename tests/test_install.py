"""What a user installs: a wheel built from a copy of the tree (as from a fresh clone, no network),
installed with pip into a scratch target, and its CLI run from there in a fresh interpreter — the
version, a layout priced on a shipped workload, what `mimo-accel env` exports. The development kit
beside the package (mimo_accel_dev) is not in the wheel, and enable() never loads it. In a fresh venv
the wheel's startup hook turns mimo_accel on from MIMO_ACCEL* alone."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests import _early

ROOT = Path(__file__).resolve().parents[1]

# Building the wheel, its target and the fresh venv takes seconds of pip: started early, on an idle
# core (tests/_early.py), by tests/_install_build.py.
_early.command("install-build", [sys.executable, str(Path(__file__).with_name("_install_build.py")), str(ROOT),
                                 str(_early.scratch("install"))], module=__name__, needs_megatron=False, timeout_s=600)


@pytest.fixture(scope="module")
def built() -> dict:
    proc = _early.result("install-build")
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def installed(built):
    """(the wheel, the target directory it was installed into, the tracked files). Installed
    without byte-compiling (--no-compile): the interpreter compiles what it imports."""
    return Path(built["wheel"]), Path(built["target"]), built["files"]


def _from_target(target: Path, *args: str, script: bool = False) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MIMO_ACCEL") and k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(target)
    cmd = [str(target / "bin" / "mimo-accel")] if script else [sys.executable, *(() if args[:1] == ("-c",) else
                                                                                ("-m", "mimo_accel"))]
    return subprocess.run([*cmd, *args], cwd=target.parent, env=env, capture_output=True, text=True, timeout=300)


def test_the_wheel_holds_the_package_its_data_and_the_license(installed):
    wheel, _, files = installed
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        meta_name = next(n for n in names if n.endswith(".dist-info/METADATA"))
        meta = z.read(meta_name).decode()
    package = [f for f in files if f.startswith("mimo_accel/") and "__pycache__" not in f]
    assert set(package) <= names, sorted(set(package) - names)
    assert any(f.startswith("mimo_accel_dev/") for f in files)  # the checkout has the kit ...
    assert not [n for n in names if n.startswith("mimo_accel_dev")], sorted(names)  # ... the wheel does not
    assert any(f.endswith(".toml") for f in package)  # the shipped workloads are package data
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    from mimo_accel import __version__

    for line in (f"Version: {__version__}", "License-Expression: Apache-2.0", "Requires-Python: >=3.12",
                 'Requires-Dist: megatron-bridge<0.7,>=0.6.0; extra == "megatron"',
                 'Requires-Dist: megatron-core<0.20,>=0.19.0; extra == "megatron"', "Requires-Dist: omegaconf>=2.3",
                 "Requires-Dist: packaging>=22", "Requires-Dist: torch>=2.6",
                 "Classifier: Programming Language :: Python :: 3.12",
                 "Project-URL: Megatron Bridge, https://github.com/NVIDIA-NeMo/Megatron-Bridge"):
        assert line in meta.splitlines(), line
    from packaging.requirements import Requirement
    from packaging.version import Version

    import torch

    # the torch requirement is a range the installed torch meets: pip never replaces it
    (torch_req,) = [Requirement(l.split(": ", 1)[1]) for l in meta.splitlines()
                    if l.startswith("Requires-Dist: torch")]
    assert torch_req.specifier and torch_req.specifier.contains(Version(torch.__version__).public)


def test_the_installed_cli_runs_from_the_target(installed):
    _, target, _ = installed
    from mimo_accel import __version__

    where = _from_target(target, "-c", "import mimo_accel, mimo_accel.workloads as w; "
                                       "print(mimo_accel.__file__); print(w.PROFILES_DIR)")
    assert where.returncode == 0, where.stderr
    package, workloads = where.stdout.split()
    assert Path(package).is_relative_to(target) and Path(workloads).is_relative_to(target)
    for script in (False, True):
        proc = _from_target(target, "--version", script=script)
        assert proc.returncode == 0 and proc.stdout.strip() == f"mimo-accel {__version__}", proc.stderr
    sim = _from_target(target, "layout", "--current", "reference-27b", "--steps", "1")
    assert sim.returncode == 0, sim.stderr
    assert "receipts" in sim.stdout and "With mimo_accel" in sim.stdout
    env = _from_target(target, "env", "--features", "all")
    assert env.returncode == 0, env.stderr
    assert "PYTHONPATH" not in env.stdout and str(target) not in env.stdout, env.stdout
    assert (target / "mimo_accel" / "_bootstrap" / "sitecustomize.py").is_file()
    # the startup hook at the root of what pip installed (site-packages, in an environment)
    assert (target / "mimo_accel.pth").read_text() == (ROOT / "mimo_accel" / "_bootstrap" / "mimo_accel.pth").read_text()
    assert not (target / "mimo_accel_dev").exists()


@pytest.mark.megatron  # enable() checks the installed Megatron pair before it patches
def test_enable_from_the_target_loads_none_of_the_kit(installed):
    _, target, _ = installed
    # enable() loads none of the kit, even where a checkout's install would let it (this test's venv)
    job = _from_target(target, "-c", "import sys, mimo_accel; mimo_accel.enable(sharded_reads=True, reorder=True, "
                                     "packing=True); print(mimo_accel.__file__); "
                                     "print(sorted(m for m in sys.modules if m.startswith('mimo_accel_dev')))")
    assert job.returncode == 0, job.stderr[-3000:]
    package, kit = job.stdout.splitlines()[-2:]
    assert Path(package).is_relative_to(target) and kit == "[]", job.stdout


# -- a fresh environment: the wheel and its declared dependencies beside torch, and nothing else --


@pytest.fixture(scope="module")
def fresh(built):
    """A venv with torch (linked) and the wheel installed by pip with its declared dependencies."""
    return Path(built["venv"]), built["linked"]


def _in_fresh(venv: Path, *args: str, env_extra=None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MIMO_ACCEL") and k != "PYTHONPATH"}
    env.update(env_extra or {})
    return subprocess.run(list(args), cwd=venv.parent, env=env, capture_output=True, text=True, timeout=300)


def test_a_fresh_environment_runs_the_cli_and_names_the_missing_megatron(fresh):
    venv, linked = fresh
    python, cli = str(venv / "bin" / "python"), str(venv / "bin" / "mimo-accel")
    assert "torch" in linked and not {"numpy", "packaging", "wrapt", "rich"} & set(linked)
    listed = _in_fresh(venv, python, "-c", "import importlib.metadata as m; print(sorted(d.metadata['Name'].lower() "
                                            "for d in m.distributions()))").stdout
    assert "megatron-bridge" not in listed and "packaging" in listed and "mimo-accel" in listed
    from mimo_accel import __version__

    version = _in_fresh(venv, cli, "--version")
    assert version.returncode == 0 and version.stdout.strip() == f"mimo-accel {__version__}", version.stderr
    sim = _in_fresh(venv, cli, "layout", "--current", "reference-27b", "--steps", "1")
    assert sim.returncode == 0 and "With mimo_accel" in sim.stdout, sim.stderr[-3000:]
    for command in ("rehearse", "calibrate-gpu", "gpu-check"):  # the development commands: one line saying how to get them
        dev = _in_fresh(venv, cli, command, "--help")
        assert dev.returncode == 2 and not dev.stdout and "Traceback" not in dev.stderr, dev.stderr[-3000:]
        (line,) = dev.stderr.splitlines()
        assert line.startswith(f"mimo-accel {command}: error: this development command") and "make setup" in line
    doctor = _in_fresh(venv, cli, "doctor")
    assert doctor.returncode == 1 and "Traceback" not in doctor.stderr + doctor.stdout, doctor.stderr[-3000:]
    missing = [l for l in doctor.stdout.splitlines() if l.startswith("missing:")]
    assert len(missing) == 1 and "megatron-bridge and megatron-core" in missing[0], doctor.stdout[-2000:]
    # enable() in a script: one PatchError line naming both packages, nothing else raised
    enable = _in_fresh(venv, python, "-c", "import mimo_accel\nfrom mimo_accel.patching.engine import PatchError\n"
                                           "try:\n    mimo_accel.enable(sharded_reads=True)\n"
                                           "except PatchError as exc:\n    print(exc)")
    assert enable.returncode == 0 and "Traceback" not in enable.stderr, enable.stderr[-3000:]
    (line,) = enable.stdout.splitlines()
    assert "megatron-bridge is not installed; megatron-core is not installed" in line
    # enable() from the environment (mimo-accel run's bootstrap): one line, exit 2, before the script
    env = _in_fresh(venv, cli, "env", "--features", "shard")
    assert env.returncode == 0, env.stderr
    exports = dict(l[len("export "):].split("=", 1) for l in env.stdout.splitlines() if l.startswith("export "))
    run = _in_fresh(venv, python, "-c", "print('the script ran')",
                    env_extra={k: v.strip("'\"") for k, v in exports.items()})
    assert run.returncode == 2 and "the script ran" not in run.stdout and "Traceback" not in run.stderr, run.stderr
    (error,) = run.stderr.splitlines()
    assert error.startswith("mimo_accel: error:") and "megatron-bridge is not installed" in error


def test_the_startup_hook_turns_mimo_accel_on_from_the_environment_alone(built):
    """The wheel in a fresh venv beside Megatron (its packages linked): no PYTHONPATH, no checkout,
    no enable() in the script; MIMO_ACCEL=all alone."""
    venv = Path(built["megatron_venv"])
    python = str(venv / "bin" / "python")
    probe = ("import sys, json, mimo_accel; s = mimo_accel.status(); "
             "print(json.dumps({'file': mimo_accel.__file__, 'active': s['active'], 'waiting': s['waiting_for_import'], "
             "'by': sys.modules['mimo_accel._bootstrap.startup'].decided_by, "
             "'checkout': [p for p in sys.path if p.startswith(" + repr(str(ROOT)) + ")]}))")
    on = _in_fresh(venv, python, "-c", probe, env_extra={"MIMO_ACCEL": "all"})
    assert on.returncode == 0, on.stderr[-3000:]
    got = json.loads(on.stdout.splitlines()[-1])
    assert Path(got["file"]).parent.parent.parent.parent.parent == venv and got["checkout"] == [], got
    assert got["active"] == ["sharded_reads", "reorder", "packing"] and got["by"] == "mimo_accel.pth", got
    # the import hooks are registered: Bridge's modules are patched as the script imports them
    assert "megatron.bridge.training.megatron_mimo_step" in got["waiting"], got
    assert on.stderr.count("mimo_accel: enabled sharded_reads, reorder, packing on megatron-bridge") == 1, on.stderr
    # off: the hook imports nothing at all
    off = _in_fresh(venv, python, "-c", "import sys; print(sorted(m for m in sys.modules if 'mimo' in m))",
                    env_extra={"MIMO_ACCEL": "0"})
    assert off.returncode == 0 and off.stdout.strip() == "[]" and off.stderr == "", off.stderr
    # a bad value stops the process at its start with one line, before the script
    bad = _in_fresh(venv, python, "-c", "print('the script ran')", env_extra={"MIMO_ACCEL": "al"})
    assert bad.returncode == 2 and bad.stdout == "" and "Traceback" not in bad.stderr, bad.stderr
    (line,) = bad.stderr.splitlines()
    assert line.startswith("mimo_accel: error: MIMO_ACCEL='al': unknown value 'al'")


def test_env_json_is_portable(built, tmp_path):
    """What `mimo-accel env --json` prints for NeMo-Run's env_vars holds no path of this machine's
    install or of the caller's PYTHONPATH; a relative setting becomes absolute where env ran."""
    venv = Path(built["venv"])
    cli = str(venv / "bin" / "mimo-accel")
    env = _in_fresh(venv, cli, "env", "--features", "all", "--json",
                    env_extra={"PYTHONPATH": str(tmp_path / "callers-own-path")})
    assert env.returncode == 0, env.stderr
    assert json.loads(env.stdout) == {"MIMO_ACCEL": "reorder,packing"}
    with_profile = subprocess.run([cli, "env", "--features", "all", "profile=runs/after", "--json"], cwd=tmp_path,
                                  env={k: v for k, v in os.environ.items() if not k.startswith("MIMO_ACCEL")},
                                  capture_output=True, text=True, timeout=120)
    assert with_profile.returncode == 0, with_profile.stderr
    assert json.loads(with_profile.stdout) == {"MIMO_ACCEL": "reorder,packing,profile",
                                               "MIMO_ACCEL_PROFILE": str(tmp_path / "runs" / "after")}
    for where in (str(venv.parent), str(ROOT), "site-packages", "_bootstrap"):
        assert where not in env.stdout + with_profile.stdout
