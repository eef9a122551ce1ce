"""Suite-wide set-up.

- Megatron installed: its MIMO modules must import, else every test fails loudly (no test may
  pass by skipping what it tests). Megatron not installed (megatron-core / megatron-bridge have no
  distribution here): the pure tests run, and every test that imports the Megatron stack skips,
  with the package it needed as the reason (``make test`` refuses to start without Megatron).
- ``distributed``: a test that starts ranks (gloo processes through ``run_ranks``,
  ``torch.multiprocessing`` or torchrun)
  carries the marker, so ``pytest -m "not distributed"`` is the quick loop of the pure core and
  the single-process logic. The marker is checked, not trusted: an unmarked test that starts
  ranks fails, naming the marker.
- Ranks forked from the process's one forkserver start with megatron imported (and the 3.11
  back-port in place), whichever test starts that forkserver first: its preload is set here.
"""

import importlib.abc
import subprocess
import sys
from importlib import metadata

import pytest

from tests import _early
from tests import _hypothesis  # noqa: F401  (loads the examples profile before any test module)
from mimo_accel_dev.rehearse import cpu
from mimo_accel_dev.rehearse import ranks as _ranks


MEGATRON_DISTRIBUTIONS = ("megatron-core", "megatron-bridge")
# The top-level modules of the Megatron stack: the two packages and the runtime dependencies that
# requirements/megatron-runtime.txt installs beside them.
# (scipy, which simulate uses where it is installed, stays an ordinary ImportError.)
MEGATRON_STACK = ("megatron", "transformers", "datasets", "einops", "tensorboard", "triton", "modelopt", "pulp")
# mimo_accel's own `audio` extra, which requirements/megatron-runtime.txt installs: its skip names the
# extra, since the audio costs do not need Megatron.
AUDIO = ("soundfile",)
# requirements/dev.txt's chart library (`report --png`, `simulate --png`), not needed by the pure loop.
CHARTS = ("matplotlib",)


def _missing_distributions() -> list[str]:
    missing = []
    for dist in MEGATRON_DISTRIBUTIONS:
        try:
            metadata.version(dist)
        except metadata.PackageNotFoundError:
            missing.append(dist)
    return missing


class _SkipWithoutMegatron(importlib.abc.MetaPathFinder):
    """Last on ``sys.meta_path``, so it is asked only about modules no installed package has: an
    import of the Megatron stack skips the test (or the test module) that made it."""

    def __init__(self, missing: list[str]):
        self.missing = missing

    def find_spec(self, fullname, path=None, target=None):
        top = fullname.partition(".")[0]
        if top in MEGATRON_STACK:
            pytest.skip(f"needs the Megatron stack: {fullname} does not import ({', '.join(self.missing)} not "
                        "installed; `make test` runs everything)", allow_module_level=True)
        if top in AUDIO:
            pytest.skip(f"needs {top} (mimo_accel's `audio` extra), not installed here", allow_module_level=True)
        if top in CHARTS:
            pytest.skip(f"needs {top} (requirements/dev.txt), not installed here", allow_module_level=True)
        return None


def pytest_configure(config):
    missing = config._mimo_missing = _missing_distributions()
    if missing:
        sys.meta_path.append(_SkipWithoutMegatron(missing))
        config._mimo_header = f"megatron: {', '.join(missing)} not installed: the tests that import it skip"
    else:
        try:
            versions = cpu.check_megatron_importable()
        except RuntimeError as exc:
            raise pytest.UsageError(str(exc)) from exc
        # prepare_imports() left the 3.11 back-port and stand-ins in place for importing; tests
        # that need a clean state call cpu.deactivate() themselves.
        config._mimo_header = "megatron: " + ", ".join(f"{k} {versions[k]}" for k in sorted(versions))
    # before any test can start the process's one forkserver, whichever test runs first
    _ranks.preload_megatron_in_forkserver()
    _guard_rank_starts()


def pytest_collection_modifyitems(config, items):
    # the modules that wait on early commands run last (each in its own order): by then the runner has
    # run those commands on the other core, and no test stands waiting for one
    waiting = _early.declaring_modules()
    later = [i for i in items if getattr(i.module, "__name__", None) in waiting]
    items[:] = [i for i in items if getattr(i.module, "__name__", None) not in waiting] + later
    missing = config._mimo_missing
    if not missing:
        return
    skip = pytest.mark.skip(reason=f"needs {', '.join(missing)} installed (enable() checks their versions, or a "
                                   "subprocess imports them); `make test` runs everything")
    for item in items:
        if item.get_closest_marker("megatron") is not None:
            item.add_marker(skip)


def pytest_collection_finish(session):
    _early.start({item.module.__name__ for item in session.items if item.module is not None},
                 megatron_installed=not session.config._mimo_missing)


def pytest_sessionfinish(session):
    _early.clean()


def pytest_report_header(config):
    return getattr(config, "_mimo_header", None)


# Whether the test being set up, run or torn down carries the marker (module-scoped fixtures that
# start ranks are set up for the first test of their module, so the hooks below decide, not a fixture).
_current = {"distributed": True}


def pytest_runtest_setup(item):
    _current["distributed"] = item.get_closest_marker("distributed") is not None


def _refuse(what: str) -> None:
    if not _current["distributed"]:
        raise AssertionError(f"this test {what} but is not marked @pytest.mark.distributed; mark it (the quick "
                             "loop `pytest -m \"not distributed\"` must not start ranks)")


def _guard_rank_starts() -> None:
    context = _ranks._context

    def checked_context():
        _refuse("starts gloo ranks (run_ranks)")
        return context()

    _ranks._context = checked_context
    import torch.multiprocessing

    mp_spawn = sys.modules["torch.multiprocessing.spawn"]  # the module (the package's name is the function)
    start_processes = mp_spawn.start_processes

    def checked_start_processes(*args, **kwargs):
        _refuse("starts ranks with torch.multiprocessing")
        return start_processes(*args, **kwargs)

    # spawn() calls the one in its own module, a test the one the package re-exports
    mp_spawn.start_processes = torch.multiprocessing.start_processes = checked_start_processes
    popen = subprocess.Popen.__init__

    def no_unmarked_torchrun(self, args, *rest, **kwargs):
        words = [str(a) for a in (args if isinstance(args, (list, tuple)) else [args])]
        if any("torchrun" in w for w in words):
            _refuse("starts ranks with torchrun")
        return popen(self, args, *rest, **kwargs)

    subprocess.Popen.__init__ = no_unmarked_torchrun


@pytest.fixture(autouse=True)
def _mimo_accel_lines_reach_caplog(request):
    """mimo_accel's lines stop at its own logger (mimo_accel.notices): a test that reads them with
    ``caplog`` gets caplog's handler on that logger too."""
    if "caplog" not in request.fixturenames:
        yield
        return
    import logging

    handler = request.getfixturevalue("caplog").handler
    logger = logging.getLogger("mimo_accel")
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)
