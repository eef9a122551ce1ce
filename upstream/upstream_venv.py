"""Build a second venv (default ``.venv-upstream``) with megatron-bridge / megatron-core installed
from source trees -- e.g. upstream main -- instead of the PyPI releases ``make setup`` installs.

    python3 upstream/upstream_venv.py --bridge DIR --core DIR          # DIRs: source trees
    python3 upstream/upstream_venv.py --from-git BRIDGE_GIT@COMMIT CORE_GIT@COMMIT [--keep-trees DIR]
    python3 upstream/upstream_venv.py ... --versions                    # print the installed versions

``make test-upstream UPSTREAM_BRIDGE=DIR UPSTREAM_CORE=DIR`` (or ``UPSTREAM_FROM_GIT="B@C C@C"``)
runs this, then the project's suite with the venv's python.

``--bridge``: a Megatron-Bridge checkout or extract (``src/`` layout). ``--core``: a Megatron-LM
checkout or extract (megatron-core installs from the tree root; Bridge's
``3rdparty/Megatron-LM`` submodule is one). ``--from-git``: check the two commits out of two git
repositories (a clone or a bare mirror) into a temp dir first -- sparse checkouts sharing the
repositories' objects, holding only what the installs need -- and delete them afterwards
(``--keep-trees DIR`` puts them in DIR and keeps them).

The venv is built like ``make setup`` builds ``.venv``: the same torch pin
(requirements/constraints.txt), the same runtime and dev requirements, nvidia-modelopt with
``--no-deps``, and mimo_accel itself editable; then the two source trees with ``pip install
--no-deps --ignore-requires-python --no-build-isolation`` (no build isolation: Bridge's
build-system requires torch, which an isolated build would fetch again; pybind11 and wheel are
installed into the venv for the builds instead).

Idempotent: the venv records what it was built from (the requirement files' contents, each tree's
identity: its git commit and local changes, or for a tree without git a listing of its files with
sizes and mtimes) in ``<venv>/.mimo-accel-installed``; a run with the same inputs does nothing.
``--force`` rebuilds the Megatron installs anyway.

Versions: Bridge and megatron-core compute ``__version__`` when built: ``X.Y.Z`` plus
``+<git rev-parse --short HEAD>`` run in the package directory. A git checkout therefore
installs as e.g. ``0.7.0+067f987df``; an extract without git (``git archive``, a tarball) as plain
``0.7.0`` -- and an extract lying inside some *other* git work tree would take that repository's
commit, so this script builds such a tree with ``NO_VCS_VERSION=1`` (plain ``X.Y.Z``) and says so.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STAMP_NAME = ".mimo-accel-installed"
REQUIREMENT_FILES = ("pyproject.toml", "requirements/constraints.txt", "requirements/megatron-runtime.txt",
                     "requirements/dev.txt")
# What `make setup` installs with --no-deps besides the two Megatron packages (Makefile MODELOPT).
DEFAULT_MODELOPT = "nvidia-modelopt==0.47.0"
BUILD_TOOLS = ("pybind11", "wheel")
# Per tree: the package directory (where package_info.py runs git) and what a sparse checkout needs.
TREES = {
    "bridge": {"dist": "megatron-bridge", "pkg": "src/megatron/bridge",
               "sparse": ("/src/", "/pyproject.toml", "/README.md", "/LICENSE", "/MANIFEST.in")},
    "core": {"dist": "megatron-core", "pkg": "megatron/core",
             "sparse": ("/megatron/", "/pyproject.toml", "/setup.py", "/README.md", "/LICENSE",
                        "/MANIFEST.in")},
}


def log(msg: str) -> None:
    print(f"[upstream-venv] {msg}", flush=True)


def run(cmd, **kw) -> subprocess.CompletedProcess:
    log("$ " + " ".join(str(c) for c in cmd))
    return subprocess.run([str(c) for c in cmd], check=True, **kw)


def git(*args, cwd=None, check=True) -> str:
    out = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True)
    if check and out.returncode:
        raise SystemExit(f"git {' '.join(args)} failed (cwd={cwd}): {out.stderr.strip()}")
    return out.stdout.strip() if out.returncode == 0 else ""


# ----------------------------------------------------------------------------------------------
# Source trees
# ----------------------------------------------------------------------------------------------


def check_tree(kind: str, tree: Path) -> Path:
    tree = tree.resolve()
    spec = TREES[kind]
    if not (tree / spec["pkg"] / "package_info.py").is_file() or not (tree / "pyproject.toml").is_file():
        raise SystemExit(f"--{kind} {tree}: not a {spec['dist']} source tree "
                         f"(no pyproject.toml or {spec['pkg']}/package_info.py)")
    return tree


def own_git_commit(kind: str, tree: Path) -> str | None:
    """The commit the build will append, or None when the tree is not its own git work tree."""
    pkg = tree / TREES[kind]["pkg"]
    top = git("rev-parse", "--show-toplevel", cwd=pkg, check=False)
    if top and Path(top).resolve() == tree:
        return git("rev-parse", "HEAD", cwd=pkg)
    return None


def enclosing_foreign_repo(kind: str, tree: Path) -> str | None:
    top = git("rev-parse", "--show-toplevel", cwd=tree / TREES[kind]["pkg"], check=False)
    return top if top and Path(top).resolve() != tree else None


def tree_identity(kind: str, tree: Path) -> dict:
    """What identifies the tree's content for the stamp: git commit + local changes, else a listing."""
    commit = own_git_commit(kind, tree)
    if commit:
        dirty = git("status", "--porcelain", "--untracked-files=no", cwd=tree, check=False)
        diff = git("diff", "HEAD", cwd=tree, check=False) if dirty else ""
        return {"git": commit, "local_changes": hashlib.sha256(diff.encode()).hexdigest() if dirty else None}
    h = hashlib.sha256()
    for top in (TREES[kind]["pkg"], ):
        for p in sorted((tree / top).rglob("*")):
            if p.is_file() and "__pycache__" not in p.parts:
                st = p.stat()
                h.update(f"{p.relative_to(tree)} {st.st_size} {int(st.st_mtime)}\n".encode())
    for name in ("pyproject.toml", "setup.py"):
        if (tree / name).is_file():
            h.update((tree / name).read_bytes())
    return {"files": h.hexdigest()}


def checkout(kind: str, spec: str, dest: Path) -> Path:
    """GIT@COMMIT -> a sparse checkout at ``dest`` sharing GIT's objects (a mirror may lack large
    blobs outside the sparse paths, so a full checkout could fail)."""
    repo, sep, rev = spec.rpartition("@")
    if not sep or not repo or not rev:
        raise SystemExit(f"--from-git {spec!r}: use GIT_DIR@COMMIT")
    repo_path = Path(repo).resolve()
    commit = git("--git-dir", str(repo_path), "rev-parse", "--verify", f"{rev}^{{commit}}", check=False) \
        or git("rev-parse", "--verify", f"{rev}^{{commit}}", cwd=repo_path)
    if dest.exists():
        shutil.rmtree(dest)
    run(["git", "clone", "-q", "--shared", "--no-checkout", repo_path, dest])
    git("config", "core.sparseCheckout", "true", cwd=dest)
    info = dest / ".git" / "info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "sparse-checkout").write_text("\n".join(TREES[kind]["sparse"]) + "\n")
    run(["git", "-c", "advice.detachedHead=false", "checkout", "-q", "--detach", commit], cwd=dest)
    log(f"{kind}: {repo_path} @ {commit[:12]} -> {dest}")
    return dest


# ----------------------------------------------------------------------------------------------
# The venv
# ----------------------------------------------------------------------------------------------


def requirements_digest(modelopt: str) -> str:
    h = hashlib.sha256(modelopt.encode())
    for name in REQUIREMENT_FILES:
        h.update(name.encode() + b"\0" + (ROOT / name).read_bytes())
    return h.hexdigest()


def build(venv: Path, python: str, bridge: Path, core: Path, modelopt: str, force: bool) -> None:
    py = venv / "bin" / "python"
    stamp = venv / STAMP_NAME
    want = {"requirements": requirements_digest(modelopt),
            "bridge": tree_identity("bridge", bridge), "core": tree_identity("core", core)}
    have = {}
    if stamp.is_file():
        try:
            have = json.loads(stamp.read_text())
        except ValueError:
            have = {}
    have.pop("from", None)  # where the trees were: informative only (--from-git uses a temp dir)
    if py.exists() and have == want and not force:
        log(f"{venv} is up to date ({stamp.name} matches); nothing to do")
        return
    pip = [py, "-m", "pip", "--disable-pip-version-check"]
    pins = ["-c", ROOT / "requirements/constraints.txt"]
    if not py.exists():
        run([python, "-m", "venv", venv])
    if have.get("requirements") != want["requirements"] or not py.exists():
        stamp.unlink(missing_ok=True)
        # As `make setup`: torch first, pinned to the CPU build; then the runtime/dev requirements.
        run([*pip, "install", "-q", "--upgrade", "pip"])
        run([*pip, "install", "-q", *pins, "torch"])
        run([*pip, "install", "-q", *pins, "-r", ROOT / "requirements/megatron-runtime.txt",
             "-r", ROOT / "requirements/dev.txt", *BUILD_TOOLS])
        run([*pip, "install", "-q", "--no-deps", "--ignore-requires-python", modelopt])
        run([*pip, "install", "-q", "--no-deps", "--ignore-requires-python", "-e", ROOT])  # mimo-accel: >= 3.12, like Megatron
    for kind, tree in (("core", core), ("bridge", bridge)):
        env = dict(os.environ)
        foreign = enclosing_foreign_repo(kind, tree)
        if foreign:
            # package_info.py would append *that* repository's commit to the version.
            log(f"{kind}: {tree} lies inside another git work tree ({foreign}); building with "
                "NO_VCS_VERSION=1, so it installs as a plain X.Y.Z")
            env["NO_VCS_VERSION"] = "1"
        # Rebuild from a clean slate: stale build/ or *.egg-info in the tree must not leak in.
        run([*pip, "install", "-q", "--no-deps", "--ignore-requires-python", "--no-build-isolation",
             "--force-reinstall", tree], env=env)
    run([py, "-m", "mimo_accel_dev.on_path"], cwd=ROOT)  # the development kit, as `make setup`
    run([py, "-c", "import mimo_accel_dev.rehearse.cpu as c; c.check_megatron_importable()"], cwd=ROOT)
    stamp.write_text(json.dumps({**want, "from": {"bridge": str(bridge), "core": str(core)}},
                                indent=1, sort_keys=True) + "\n")
    log(f"built {venv}")


def report_versions(venv: Path) -> int:
    code = (
        "from importlib import metadata\n"
        "from mimo_accel.patching import targets as T\n"
        "b, c = (metadata.version(d) for d in ('megatron-bridge', 'megatron-core'))\n"
        "m = T.match(b, c)\n"
        "print(f'megatron-bridge {b}; megatron-core {c}; torch {metadata.version(\"torch\")}')\n"
        "print(f'mimo_accel version guard: {m.status}' + (f\" (shape '{m.shape.name}')\" if m.shape else '')"
        " + (': ' + '; '.join(m.problems) if m.problems else ''))\n"
    )
    return subprocess.run([str(venv / "bin" / "python"), "-c", code], cwd=ROOT).returncode


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--venv", default=str(ROOT / ".venv-upstream"))
    ap.add_argument("--python", default=sys.executable, help="interpreter that creates the venv")
    ap.add_argument("--bridge", type=Path, help="Megatron-Bridge source tree")
    ap.add_argument("--core", type=Path, help="Megatron-LM source tree (megatron-core)")
    ap.add_argument("--from-git", nargs=2, metavar=("BRIDGE_GIT@COMMIT", "CORE_GIT@COMMIT"))
    ap.add_argument("--keep-trees", type=Path, metavar="DIR",
                    help="with --from-git: check out into DIR/{bridge,core} and keep them")
    ap.add_argument("--modelopt", default=DEFAULT_MODELOPT)
    ap.add_argument("--force", action="store_true", help="reinstall the two trees even if up to date")
    ap.add_argument("--versions", action="store_true",
                    help="only print the venv's installed versions and the version guard's verdict")
    args = ap.parse_args(argv)
    venv = Path(args.venv).resolve()
    if args.versions:
        return report_versions(venv)
    if bool(args.from_git) == bool(args.bridge or args.core) or (not args.from_git and not (args.bridge and args.core)):
        ap.error("give either --bridge DIR --core DIR, or --from-git BRIDGE_GIT@COMMIT CORE_GIT@COMMIT")
    if args.from_git:
        base = args.keep_trees.resolve() if args.keep_trees else Path(tempfile.mkdtemp(prefix="mimo-upstream-"))
        base.mkdir(parents=True, exist_ok=True)
        try:
            bridge = checkout("bridge", args.from_git[0], base / "bridge")
            core = checkout("core", args.from_git[1], base / "core")
            build(venv, args.python, bridge, core, args.modelopt, args.force)
        finally:
            if not args.keep_trees:
                shutil.rmtree(base, ignore_errors=True)
    else:
        build(venv, args.python, check_tree("bridge", args.bridge), check_tree("core", args.core),
              args.modelopt, args.force)
    return report_versions(venv)


if __name__ == "__main__":
    sys.exit(main())
