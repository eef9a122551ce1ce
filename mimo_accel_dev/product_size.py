"""How big the product is: the lines ``import mimo_accel; enable()`` can reach, and the wheel's.

Reachable: every ``mimo_accel`` module named by an import anywhere in a reachable module (inside
functions too, so a lazy import counts), from ``mimo_accel/__init__.py``, plus modules named as
``"mimo_accel.x.y"`` strings; docstrings and comments count, as they are read. The wheel: every
``.py`` under ``mimo_accel/``. Run from a checkout: ``python -m mimo_accel_dev.product_size [-v]``.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "mimo_accel"


def _path_of(module: str):
    p = ROOT / module.replace(".", "/")
    if (p / "__init__.py").exists():
        return p / "__init__.py"
    return p.with_suffix(".py") if p.with_suffix(".py").exists() else None


def _named(path: Path, module: str) -> set[str]:
    """The package's modules ``path`` names (each name with its parents)."""
    base = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            name = ".".join(base[:len(base) - node.level + 1] + ([node.module] if node.module else [])) \
                if node.level else node.module
            names |= {name} | {f"{name}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and re.fullmatch(rf"{PACKAGE}(\.\w+)+(:\w+)?", node.value):
            names.add(node.value.split(":")[0])
    parts = (n.split(".") for n in names if n and n.split(".")[0] == PACKAGE)
    return {".".join(p[:i]) for p in parts for i in range(1, len(p) + 1)}


def reachable() -> dict[str, Path]:
    seen: dict[str, Path] = {}
    todo = [PACKAGE]
    while todo:
        module = todo.pop()
        path = _path_of(module)
        if path is not None and module not in seen:
            seen[module] = path
            todo += _named(path, module)
    return seen


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines())


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    modules = reachable()
    if "-v" in argv:
        for module, path in sorted(modules.items(), key=lambda kv: _lines(kv[1])):
            print(f"{_lines(path):6d} {module}")
    wheel = list((ROOT / PACKAGE).rglob("*.py"))
    print(f"reachable from enable(): {sum(map(_lines, modules.values()))} lines in {len(modules)} modules; "
          f"the wheel: {sum(map(_lines, wheel))} lines; over 500 lines: "
          f"{sorted(str(p.relative_to(ROOT)) for p in wheel if _lines(p) > 500) or 'none'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
