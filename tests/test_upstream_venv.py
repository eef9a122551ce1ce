"""upstream/upstream_venv.py (make test-upstream): source trees, their identity, sparse checkouts,
and the stamp that makes a rebuild of .venv-upstream a no-op. Nothing is installed here."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tests._scripts import load_script

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")


@pytest.fixture(scope="module")
def uv():
    return load_script("upstream/upstream_venv.py", "upstream_venv")


def _git(cwd, *args):
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=cwd, check=True,
                          capture_output=True, text=True).stdout.strip()


def _bridge_tree(root: Path) -> Path:
    pkg = root / "src" / "megatron" / "bridge"
    pkg.mkdir(parents=True)
    (pkg / "package_info.py").write_text("__version__ = '0.7.0'\n")
    (root / "pyproject.toml").write_text("[project]\nname = 'megatron-bridge'\n")
    (root / "docs").mkdir()
    (root / "docs" / "big.gif").write_text("not needed for an install")
    return root


def test_a_directory_that_is_not_a_source_tree_is_refused(uv, tmp_path):
    with pytest.raises(SystemExit, match="not a megatron-bridge source tree"):
        uv.check_tree("bridge", tmp_path)
    with pytest.raises(SystemExit, match="not a megatron-core source tree"):
        uv.check_tree("core", _bridge_tree(tmp_path / "b"))


def test_identity_of_a_git_tree_and_of_a_plain_extract_inside_another_repository(uv, tmp_path):
    tree = _bridge_tree(tmp_path / "bridge")
    _git(tree, "init", "-q")
    _git(tree, "add", "-A")
    _git(tree, "commit", "-q", "-m", "x")
    head = _git(tree, "rev-parse", "HEAD")
    assert uv.own_git_commit("bridge", tree) == head
    assert uv.enclosing_foreign_repo("bridge", tree) is None
    assert uv.tree_identity("bridge", tree) == {"git": head, "local_changes": None}
    (tree / "src" / "megatron" / "bridge" / "package_info.py").write_text("__version__ = '0.7.1'\n")
    assert uv.tree_identity("bridge", tree)["local_changes"] is not None

    # An extract lying inside that repository would take its commit as a version: detected.
    nested = _bridge_tree(tree / "extract")
    assert uv.own_git_commit("bridge", nested) is None
    assert Path(uv.enclosing_foreign_repo("bridge", nested)).resolve() == tree.resolve()
    before = uv.tree_identity("bridge", nested)
    assert set(before) == {"files"}
    (nested / "src" / "megatron" / "bridge" / "package_info.py").write_text("__version__ = '0.7.0'  # edited\n")
    assert uv.tree_identity("bridge", nested) != before


def test_from_git_checks_out_only_what_the_install_needs(uv, tmp_path):
    repo = _bridge_tree(tmp_path / "repo")
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "one")
    first = _git(repo, "rev-parse", "HEAD")
    (repo / "pyproject.toml").write_text("[project]\nname = 'megatron-bridge'\n# two\n")
    _git(repo, "commit", "-q", "-am", "two")

    out = uv.checkout("bridge", f"{repo}@{first[:9]}", tmp_path / "co")
    assert (out / "src" / "megatron" / "bridge" / "package_info.py").is_file()
    assert not (out / "docs").exists()  # outside the sparse paths (a mirror may lack such blobs)
    assert "# two" not in (out / "pyproject.toml").read_text()
    assert uv.own_git_commit("bridge", out) == first
    with pytest.raises(SystemExit, match="GIT_DIR@COMMIT"):
        uv.checkout("bridge", str(repo), tmp_path / "co2")


def test_the_stamp_makes_a_second_build_a_no_op_and_a_new_tree_reinstalls_only_the_trees(uv, tmp_path, monkeypatch):
    bridge = uv.check_tree("bridge", _bridge_tree(tmp_path / "bridge"))
    core = tmp_path / "core"
    (core / "megatron" / "core").mkdir(parents=True)
    (core / "megatron" / "core" / "package_info.py").write_text("__version__ = '0.20.0'\n")
    (core / "pyproject.toml").write_text("[project]\nname = 'megatron-core'\n")
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("")  # exists: no venv creation
    calls = []
    monkeypatch.setattr(uv, "run", lambda cmd, **kw: calls.append([str(c) for c in cmd]))

    uv.build(venv, "python3", bridge, core, uv.DEFAULT_MODELOPT, force=False)
    stamp = json.loads((venv / uv.STAMP_NAME).read_text())
    assert stamp["from"] == {"bridge": str(bridge), "core": str(core)}
    assert any("torch" in c for c in calls) and any(str(bridge) in c for c in calls)

    calls.clear()
    uv.build(venv, "python3", bridge, core, uv.DEFAULT_MODELOPT, force=False)
    assert calls == []

    (bridge / "src" / "megatron" / "bridge" / "new.py").write_text("x = 1\n")
    uv.build(venv, "python3", bridge, core, uv.DEFAULT_MODELOPT, force=False)
    installs = [c for c in calls if "install" in c]
    assert not any("torch" in c for c in installs)  # requirements unchanged: not reinstalled
    assert [c[-1] for c in installs] == [str(core), str(bridge)]
    assert all("--no-build-isolation" in c and "--ignore-requires-python" in c for c in installs)
