"""Suite-wide set-up.

- The Megatron packages are not optional here: if they cannot be imported, every test fails
  loudly (no test may pass by skipping what it tests).
- ``distributed``: a test that starts ranks (gloo processes through ``run_ranks``, or torchrun)
  carries the marker, so ``pytest -m "not distributed"`` is the quick loop of the pure core and
  the single-process logic. The marker is checked, not trusted: an unmarked test that starts
  ranks fails, naming the marker.
"""

import subprocess

import pytest

from mimo_accel.rehearse import cpu
from mimo_accel.rehearse import ranks as _ranks


def pytest_configure(config):
    try:
        versions = cpu.check_megatron_importable()
    except RuntimeError as exc:
        raise pytest.UsageError(str(exc)) from exc
    # prepare_imports() left the 3.11 back-port and stand-ins in place for importing; tests
    # that need a clean state call cpu.deactivate() themselves.
    config._mimo_versions = versions
    _guard_rank_starts()


def pytest_report_header(config):
    v = getattr(config, "_mimo_versions", {})
    return "megatron: " + ", ".join(f"{k} {v[k]}" for k in sorted(v))


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
    popen = subprocess.Popen.__init__

    def no_unmarked_torchrun(self, args, *rest, **kwargs):
        words = [str(a) for a in (args if isinstance(args, (list, tuple)) else [args])]
        if any("torchrun" in w for w in words):
            _refuse("starts ranks with torchrun")
        return popen(self, args, *rest, **kwargs)

    subprocess.Popen.__init__ = no_unmarked_torchrun
