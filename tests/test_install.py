"""What a user installs: a wheel built from a copy of the tree (as from a fresh clone, no network),
installed with pip into a scratch target, and its CLI run from there in a fresh interpreter — the
version, a simulation of a shipped workload, the bootstrap directory `mimo-accel env` exports."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# mimo-accel declares Requires-Python >= 3.12 like Megatron; this project's CPU venv may be 3.11 (the
# rehearsal's back-port), where the Makefile installs with --ignore-requires-python too.
PY_FLAGS = ["--ignore-requires-python"] if sys.version_info < (3, 12) else []


def _tracked_files() -> list[str]:
    out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True,
                         text=True, check=True, timeout=60)
    return [f for f in out.stdout.splitlines() if (ROOT / f).is_file()]


def _pip(*args: str, cwd: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"pip {' '.join(args)}:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(the wheel, the target directory it was installed into, the tracked files)."""
    tmp = tmp_path_factory.mktemp("install")
    src = tmp / "src"
    files = _tracked_files()
    for f in files:
        (src / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / f, src / f)
    _pip("wheel", "--no-deps", "--no-build-isolation", "--no-index", *PY_FLAGS, "-w", str(tmp / "dist"), str(src),
         cwd=tmp)
    (wheel,) = (tmp / "dist").glob("mimo_accel-*.whl")
    target = tmp / "target"
    _pip("install", "--no-deps", "--no-index", *PY_FLAGS, "--target", str(target), str(wheel), cwd=tmp)
    return wheel, target, files


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
    assert any(f.endswith(".toml") for f in package)  # the shipped workloads are package data
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    from mimo_accel import __version__

    for line in (f"Version: {__version__}", "License-Expression: Apache-2.0", "Requires-Python: >=3.12",
                 'Requires-Dist: megatron-bridge<0.6.3,>=0.6.0; extra == "megatron"',
                 'Requires-Dist: megatron-core<0.20,>=0.19.0; extra == "megatron"', "Requires-Dist: omegaconf>=2.3"):
        assert line in meta.splitlines(), line


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
    sim = _from_target(target, "simulate", "--workload", "receipts", "--dp", "2,4", "--steps", "3")
    assert sim.returncode == 0, sim.stderr
    assert "receipts" in sim.stdout and "simulated in" in sim.stdout
    env = _from_target(target, "env", "--features", "all")
    assert env.returncode == 0, env.stderr
    assert f"export PYTHONPATH={target / 'mimo_accel' / '_bootstrap'}{os.pathsep}{target}" in env.stdout
    assert (target / "mimo_accel" / "_bootstrap" / "sitecustomize.py").is_file()
    # what `rehearse --loop bridge` runs by default is a module of the package
    spec = _from_target(target, "-c", "import importlib.util as u; "
                                      "print(u.find_spec('mimo_accel.rehearse.bridge_script').origin)")
    assert spec.returncode == 0 and Path(spec.stdout.strip()).is_relative_to(target), spec.stderr
