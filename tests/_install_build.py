"""What tests/test_install.py checks, built: a wheel from a copy of the tree (as from a fresh clone,
no network), installed with pip into a target directory, a fresh venv holding torch (linked) and
the wheel with its declared dependencies, and a second venv holding all of that (linked) and the
installed megatron-core / megatron-bridge (linked: enable() reads their versions, the import hooks
wait for their modules). Run as a script by the suite's early-command runner (tests/_early.py), on
a core the in-process tests leave idle: ``python _install_build.py ROOT OUT`` prints ``{"wheel",
"target", "files", "venv", "linked", "megatron_venv"}`` as JSON."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

# mimo-accel declares Requires-Python >= 3.12 like Megatron; this project's CPU venv may be 3.11 (the
# rehearsal's back-port), where the Makefile installs with --ignore-requires-python too.
PY_FLAGS = ["--ignore-requires-python"] if sys.version_info < (3, 12) else []


def tracked_files(root: Path) -> list[str]:
    out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=root, capture_output=True,
                         text=True, check=True, timeout=60)
    return [f for f in out.stdout.splitlines() if (root / f).is_file()]


def _pip(*args: str, cwd: Path) -> None:
    # without the suite's PYTHONPATH: a checkout there holding mimo_accel.egg-info (left by a build)
    # would be "already installed" in the fresh venv's eyes, and pip would install nothing
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        raise SystemExit(f"pip {' '.join(args)}:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")


def install(root: Path, out: Path) -> dict:
    """The wheel and the target it was installed into, without byte-compiling (--no-compile): the
    interpreter compiles what it imports."""
    src = out / "src"
    files = tracked_files(root)
    for f in files:
        (src / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / f, src / f)
    _pip("wheel", "--no-deps", "--no-build-isolation", "--no-index", *PY_FLAGS, "-w", str(out / "dist"), str(src),
         cwd=out)
    (wheel,) = (out / "dist").glob("mimo_accel-*.whl")
    target = out / "target"
    _pip("install", "--no-deps", "--no-index", "--no-compile", *PY_FLAGS, "--target", str(target), str(wheel), cwd=out)
    return {"wheel": str(wheel), "target": str(target), "files": files}


def linked_torch(site: Path, roots=("torch",), follow: bool = True) -> list[str]:
    """Link the torch this interpreter runs with (and what torch itself requires) into ``site``: a
    fresh environment that holds torch only, in seconds instead of unpacking a torch wheel.
    ``roots``: other distributions; ``follow=False``: without what they require."""
    from importlib import metadata
    from packaging.requirements import Requirement

    linked, todo = [], list(roots)
    while todo:
        dist = metadata.distribution(todo.pop())
        name = dist.metadata["Name"]
        if name in linked:
            continue
        linked.append(name)
        base = Path(dist.locate_file(""))
        for top in {Path(str(f)).parts[0] for f in dist.files or ()} - {"..", "__pycache__"}:
            if not (site / top).exists():
                (site / top).symlink_to(base / top)
        for raw in (dist.requires or ()) if follow else ():
            req = Requirement(raw)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return linked


def declared_requirements(wheel: Path) -> list[str]:
    """The wheel's Requires-Dist without an extra: what ``pip install <wheel>`` installs."""
    from packaging.requirements import Requirement

    with zipfile.ZipFile(wheel) as z:
        meta = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))).decode()
    reqs = [Requirement(l.split(": ", 1)[1]) for l in meta.splitlines() if l.startswith("Requires-Dist: ")]
    return [str(r) for r in reqs if r.marker is None or r.marker.evaluate({"extra": ""})]


def _site_of(python: Path) -> Path:
    return Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True, timeout=60).stdout.strip())


def fresh_venv(wheel: Path, out: Path) -> dict:
    """A venv with torch (linked) and the wheel installed by pip with its declared dependencies."""
    venv = out / "fresh" / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    site = _site_of(python)
    linked = linked_torch(site)
    # this pip installs into the fresh venv (--python): the venv needs no pip of its own;
    # --no-compile: byte-compiling every installed file first (numpy, rich, ...) only costs seconds
    into = ("--python", str(python), "install", "--no-compile")
    if PY_FLAGS:  # Python 3.11: the wheel's own Requires-Python set aside, its dependencies resolved as declared
        _pip(*into, *declared_requirements(wheel), cwd=venv.parent)
        _pip(*into, "--no-deps", *PY_FLAGS, str(wheel), cwd=venv.parent)
    else:
        _pip(*into, str(wheel), cwd=venv.parent)
    return {"venv": str(venv), "linked": linked}


def megatron_venv(fresh: Path, out: Path) -> str:
    """A venv holding the fresh venv's site-packages (linked, the startup hook included) and this
    interpreter's megatron-core and megatron-bridge (linked, without their requirements)."""
    venv = out / "fresh-megatron" / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    site = _site_of(venv / "bin" / "python")
    for entry in _site_of(fresh / "bin" / "python").iterdir():
        if not (site / entry.name).exists():
            (site / entry.name).symlink_to(entry)
    linked_torch(site, roots=("megatron-core", "megatron-bridge"), follow=False)
    return str(venv)


if __name__ == "__main__":
    root, out = Path(sys.argv[1]), Path(sys.argv[2])
    built = install(root, out)
    built.update(fresh_venv(Path(built["wheel"]), out))
    built["megatron_venv"] = megatron_venv(Path(built["venv"]), out)
    print(json.dumps(built))
