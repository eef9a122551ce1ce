"""A training job imports the runtime only, never the development kit (``mimo_accel_dev``: the
CPU rehearsal, gpu-check), the offline tools or the workload profiles.

No module of the product (everything under ``mimo_accel/`` but ``tools/``, ``workloads/`` and
``__main__``, the CLI's entry) names one of those in an import, even inside a function; no module of
``mimo_accel/`` at all names the kit in an import (the tools reach it through
``mimo_accel.tools.devkit``, lazily). ``import mimo_accel``, the planner and the patch table load none of them, without
Megatron. What a GPU job runs — ``import mimo_accel; mimo_accel.enable(...)`` and upstream's MIMO modules,
patched as they are imported — is checked in a fresh interpreter. The only rehearsal-kit module
allowed in is ``mimo_accel_dev.rehearse.cpu``, loaded *before* the snapshot because megatron.bridge does not
import on this CPU machine without its stand-ins (a GPU machine imports it directly).
"""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

import pytest

from tests import _early

# The development kit, the offline tools and the workload profiles (their own packages): nothing a
# training job needs.
KIT = "mimo_accel_dev"
NOT_PRODUCT = (KIT, "mimo_accel.tools", "mimo_accel.workloads")
PACKAGE = Path(__file__).resolve().parents[1] / "mimo_accel"


def _outside_the_product(name: str) -> bool:
    return any(name == p or name.startswith(p + ".") for p in NOT_PRODUCT)


def _product_files() -> list[Path]:
    offline = {PACKAGE / p.split(".")[1] for p in NOT_PRODUCT if p.startswith("mimo_accel.")}
    return [f for f in sorted(PACKAGE.rglob("*.py"))
            if not any(d in f.parents for d in offline) and f != PACKAGE / "__main__.py"]


def _imported_names(tree: ast.AST) -> list[tuple[int, str]]:
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names += [(node.lineno, node.module)] + [(node.lineno, f"{node.module}.{a.name}") for a in node.names]
    return names


def test_no_product_module_imports_the_kit_the_tools_or_the_profiles():
    files = _product_files()
    assert PACKAGE / "planner.py" in files and PACKAGE / "patching" / "engine.py" in files  # the scan sees the product
    found = [f"{f.relative_to(PACKAGE.parent)}:{line} imports {name}" for f in files
             for line, name in _imported_names(ast.parse(f.read_text(), str(f))) if _outside_the_product(name)]
    assert not found, found


def test_no_module_of_the_package_imports_the_development_kit():
    files = sorted(PACKAGE.rglob("*.py"))
    assert PACKAGE / "tools" / "doctor.py" in files and PACKAGE / "tools" / "cli.py" in files  # the tools too
    found = [f"{f.relative_to(PACKAGE.parent)}:{line} imports {name}" for f in files
             for line, name in _imported_names(ast.parse(f.read_text(), str(f)))
             if name == KIT or name.startswith(KIT + ".")]
    assert not found, found


_PURE = r"""
import json, sys
import mimo_accel
import mimo_accel.planner, mimo_accel.patching.registry, mimo_accel.patching.engine
print("RESULT " + json.dumps(sorted(m for m in sys.modules if m.startswith("mimo_accel"))))
"""


_early.command("imports-pure", [sys.executable, "-c", _PURE], module=__name__, needs_megatron=False)


def test_the_package_the_planner_and_the_patches_load_no_tool_kit_or_profile():
    proc = _early.result("imports-pure")
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))
    loaded = json.loads(line[len("RESULT "):])
    assert {"mimo_accel.planner", "mimo_accel.patching.registry", "mimo_accel.runtime.patches.step"} <= set(loaded), loaded
    assert not [m for m in loaded if _outside_the_product(m)], loaded

@pytest.mark.megatron
def test_enable_on_a_training_job_never_imports_the_rehearsal_kit():
    # the job: enable(), then upstream's MIMO modules imported (and patched) in a fresh interpreter,
    # the probe test_patching runs early in that order (its importing Megatron takes seconds)
    from tests.test_patching import _probe

    result = _probe("before")
    status = result["status"]
    assert status["patched"] and status["waiting_for_import"] == [], status  # the job path was really patched
    loaded = set(result["loaded"])
    assert {"mimo_accel.patching.engine", "mimo_accel.runtime.reading.scope", "mimo_accel.runtime.patches.step"} <= loaded, loaded
    kit = sorted(m for m in loaded if _outside_the_product(m))
    assert not kit, f"a training job imported {kit}"
