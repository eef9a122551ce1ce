"""The development kit as the shipped tools reach it.

``mimo_accel_dev`` (the CPU rehearsal, its CPU layer, the GPU self-check) lives beside the package in
a checkout: ``make setup`` puts it on the venv's path, a wheel does not ship it. The product imports it
only here, lazily, and says how to get it where it is missing.
"""

from __future__ import annotations

import importlib
from types import ModuleType

__all__ = ["DEV_PACKAGE", "DevKitMissing", "STAND_IN_MARKER", "import_dev", "prepare_imports"]

DEV_PACKAGE = "mimo_accel_dev"
FIX = "from a checkout of mimo-accel, run make setup (it puts mimo_accel_dev on the venv's path)"

# Set by the kit's CPU layer on the stand-in module it registers for a package that is not installed
# (Transformer Engine on a machine without CUDA): doctor tells a stand-in from the package by it.
STAND_IN_MARKER = "__mimo_accel_stand_in__"


class DevKitMissing(ImportError):
    """``mimo_accel_dev`` is not importable here; the message names what needed it and the fix."""


def import_dev(module: str, needed_by: str) -> ModuleType:
    """``module`` of the kit (e.g. ``mimo_accel_dev.rehearse.cpu``); :class:`DevKitMissing` naming
    ``needed_by`` and the fix where the kit is not installed. A module missing *inside* an installed
    kit (megatron, say) propagates as it is."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name != DEV_PACKAGE:
            raise
        raise DevKitMissing(f"{needed_by} needs the development kit, which this install does not have "
                            f"(a wheel does not ship it): {FIX}") from None


def prepare_imports() -> None:
    """The kit's ``cpu.prepare_imports`` (the Python 3.11 back-port, stand-ins for Transformer Engine and
    nvidia-resiliency-ext where they are not installed) where the kit is installed; else nothing: an
    install without it imports megatron.bridge as it is."""
    try:
        cpu = import_dev(f"{DEV_PACKAGE}.rehearse.cpu", "the import preparation")
    except DevKitMissing:  # the documented case above, not an error
        return
    cpu.prepare_imports()
