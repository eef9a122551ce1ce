"""pytest plugin for the upstream peer suite (loaded with ``-p peer_plugin``).

Before any conftest or test module is imported it

1. calls ``mimo_accel_dev.rehearse.cpu.prepare_imports()`` (in *every* mode, the baseline included): the
   Python 3.11 ``typing.override`` back-port and stand-ins for transformer_engine /
   nvidia_resiliency_ext, without which ``megatron.bridge`` does not import on a CPU machine;
2. in modes ``b`` and ``c`` imports mimo_accel and calls ``mimo_accel.enable(...)``;

and writes one JSON record per test (outcome + the last lines of any failure) to the file named
by ``UPSTREAM_PEER_REPORT``. The mode comes from ``UPSTREAM_PEER_MODE``:

    a  baseline: no mimo_accel import
    b  ``mimo_accel.enable()`` with no features
    c  ``mimo_accel.enable(sharded_reads=True, reorder=True, packing=True)``
"""

from __future__ import annotations

import json
import os
import traceback

import pytest

MODES = {
    "a": None,
    "b": {},
    "c": {"sharded_reads": True, "reorder": True, "packing": True},
}

_records: dict[str, dict] = {}
_setup_info: dict = {}
_TAIL_LINES = 15


def _mode() -> str:
    mode = os.environ.get("UPSTREAM_PEER_MODE", "a")
    if mode not in MODES:
        raise pytest.UsageError(f"UPSTREAM_PEER_MODE must be one of {sorted(MODES)}, got {mode!r}")
    return mode


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config, parser, args):
    mode = _mode()
    import mimo_accel_dev.rehearse.cpu

    mimo_accel_dev.rehearse.cpu.prepare_imports()
    _setup_info.update(mode=mode, prepare_imports=True, enable_kwargs=MODES[mode])
    if MODES[mode] is not None:
        import mimo_accel

        try:
            cfg = mimo_accel.enable(**MODES[mode])
            _setup_info["enabled"] = repr(cfg)
        except Exception as exc:  # recorded; the run then shows every test's result anyway
            _setup_info["enable_error"] = "".join(traceback.format_exception_only(type(exc), exc)).strip()
            raise


def _tail(report) -> str:
    """The failure's last lines, preceded by the frames it went through (``where:``)."""
    text = getattr(report, "longreprtext", "") or ""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    frames = []
    for entry in getattr(getattr(report.longrepr, "reprtraceback", None), "reprentries", None) or []:
        loc = getattr(entry, "reprfileloc", None)
        if loc is not None:
            frames.append(f"{loc.path}:{loc.lineno}")
    head = ["where: " + " -> ".join(frames)] if frames else []
    return "\n".join(head + lines[-_TAIL_LINES:])


def pytest_runtest_logreport(report):
    rec = _records.setdefault(report.nodeid, {"outcome": None, "detail": ""})
    if report.when == "setup":
        if report.failed:
            rec.update(outcome="error", detail=_tail(report))
        elif report.skipped:
            reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else _tail(report)
            rec.update(outcome="skipped", detail=str(reason))
    elif report.when == "call":
        if hasattr(report, "wasxfail"):
            rec.update(outcome="xfailed" if report.skipped else "xpassed", detail=str(report.wasxfail))
        elif report.passed:
            rec.update(outcome="passed")
        elif report.failed:
            rec.update(outcome="failed", detail=_tail(report))
        elif report.skipped:
            reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else _tail(report)
            rec.update(outcome="skipped", detail=str(reason))
    elif report.when == "teardown" and report.failed and rec["outcome"] in (None, "passed"):
        rec.update(outcome="error", detail="teardown: " + _tail(report))


def pytest_collectreport(report):
    if report.failed:  # a module that does not even import
        _records[report.nodeid] = {"outcome": "error", "detail": "collection: " + _tail(report)}


def pytest_sessionfinish(session, exitstatus):
    path = os.environ.get("UPSTREAM_PEER_REPORT")
    if not path:
        return
    info = dict(_setup_info)
    if info.get("enable_kwargs") is not None:
        try:
            import mimo_accel

            st = mimo_accel.status()
            info["status"] = json.loads(json.dumps(st, default=repr))
        except Exception as exc:  # noqa: BLE001
            info["status_error"] = repr(exc)
    with open(path, "w") as fh:
        json.dump({"setup": info, "exitstatus": int(exitstatus), "tests": _records}, fh, indent=1)
