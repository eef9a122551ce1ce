"""The development kit (``mimo_accel_dev``) is beside the package, not in it: the development
commands run from a checkout's install, and where the kit is missing (a wheel's install) each command
that needs it ends in one line naming the fix, exit 2.

"Missing" is simulated in this process: the kit's modules leave ``sys.modules`` and a finder first
on ``sys.meta_path`` answers for its name as Python does where no finder has it (ModuleNotFoundError
naming ``mimo_accel_dev``)."""

from __future__ import annotations

import importlib.abc
import sys

import pytest

from mimo_accel.tools import cli, devkit


def _in_kit(name: str) -> bool:
    return name == devkit.DEV_PACKAGE or name.startswith(devkit.DEV_PACKAGE + ".")


class _NoKit(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if _in_kit(name):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


@pytest.fixture
def no_kit(monkeypatch):
    for name in [m for m in sys.modules if _in_kit(m)]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(sys, "meta_path", [_NoKit(), *sys.meta_path])


def _one_line(capsys, prefix: str) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith(prefix), err
    return err


@pytest.mark.parametrize("command", ["rehearse", "calibrate-gpu", "gpu-check"])
def test_a_development_command_runs_from_the_checkout(command, capsys):
    try:
        code = cli.main([command, "--help"])
    except SystemExit as exc:  # argparse's own exit after --help
        code = exc.code
    assert code == 0
    assert f"usage: mimo-accel {command}" in capsys.readouterr().out


@pytest.mark.parametrize("command", ["rehearse", "calibrate-gpu", "gpu-check"])
def test_a_development_command_without_the_kit_says_how_to_get_it(command, no_kit, capsys):
    assert cli.main([command, "--help"]) == 2
    err = _one_line(capsys, f"mimo-accel {command}: error: this development command needs the development kit")
    assert "make setup" in err and "mimo_accel_dev" in err


def test_a_module_missing_inside_the_kit_is_not_taken_for_the_kit_missing():
    with pytest.raises(ModuleNotFoundError) as exc:
        devkit.import_dev("mimo_accel_dev.commands.nothing_here", "a test")
    assert not isinstance(exc.value, devkit.DevKitMissing) and exc.value.name == "mimo_accel_dev.commands.nothing_here"


def test_the_import_preparation_without_the_kit_leaves_the_imports_alone(no_kit):
    devkit.prepare_imports()  # an import of the kit would raise here
    assert not [m for m in sys.modules if _in_kit(m)]
