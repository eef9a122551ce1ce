"""Suite-wide set-up. The Megatron packages are not optional here: if they cannot be imported,
every test fails loudly (no test may pass by skipping what it tests)."""

import pytest

from mimo_accel.rehearse import cpu


def pytest_configure(config):
    try:
        versions = cpu.check_megatron_importable()
    except RuntimeError as exc:
        raise pytest.UsageError(str(exc)) from exc
    finally:
        # prepare_imports() left the 3.11 back-port and stand-ins in place for importing; tests
        # that need a clean state call cpu.deactivate() themselves.
        pass
    config._mimo_versions = versions


def pytest_report_header(config):
    v = getattr(config, "_mimo_versions", {})
    return "megatron: " + ", ".join(f"{k} {v[k]}" for k in sorted(v))
