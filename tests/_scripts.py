"""Scripts of this repository that are not package modules (benchmarks/, upstream/, examples/),
loaded as modules for the tests."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def load_script(relative: str, name: str) -> ModuleType:
    """``ROOT / relative`` as module ``name``, once per process."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / relative)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses resolve the module's annotations through it
        try:
            spec.loader.exec_module(module)
        except BaseException:  # a skip or an error: no half-run module for the next caller
            del sys.modules[name]
            raise
    return sys.modules[name]
