"""The patch engine: import order, exact undo, no double wrapping, version guard, env activation."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import _early
import mimo_accel
from mimo_accel.tools import cli
from mimo_accel.config import AccelConfig, ConfigError
from mimo_accel.patching import engine
from mimo_accel.patching.engine import PatchError

ROOT = Path(__file__).resolve().parent.parent
PROBE = Path(__file__).resolve().parent / "_patch_probe.py"
ALL_SITES = {"slice", "sampling_info", "loader"}


_PROBES = {  # mode -> (extra environment, through the launcher)
    "before": ({}, False),
    "script": ({}, False),  # imports Megatron, then enables: "after" as well (see below)
    "env": ({"MIMO_ACCEL": "shard,pack", "MIMO_ACCEL_PROFILE": "/tmp/unused"}, True),
}


def _declare_probe(mode: str) -> None:
    env_extra, launcher = _PROBES[mode]
    env = {k: v for k, v in os.environ.items() if not k.startswith("MIMO_ACCEL")}
    env.update(env_extra)
    if launcher:
        env = cli.launcher_env(env)
    _early.command(f"patch-probe-{mode}", [sys.executable, str(PROBE), mode], module=__name__, env=env, cwd=ROOT,
                   timeout_s=240)


for _mode in _PROBES:  # each probe's fresh interpreter spends seconds importing megatron: started early
    _declare_probe(_mode)


def _probe(mode: str) -> dict:
    proc = _early.result(f"patch-probe-{mode}")
    lines = [l for l in proc.stdout.splitlines() if l.startswith("PROBE ")]
    assert proc.returncode == 0 and lines, f"probe {mode} failed (rc {proc.returncode}):\n{proc.stderr[-3000:]}"
    return json.loads(lines[-1][len("PROBE "):])


def _check_patched_and_restored(out: dict) -> None:
    assert set(out["status"]["active"]) >= {"sharded_reads", "packing", "profile"}
    assert out["status"]["waiting_for_import"] == [] or all(
        "pretrain" not in s and "megatron_mimo" not in s for s in out["status"]["waiting_for_import"])
    assert out["one_replacement_per_function"] == {k: True for k in ALL_SITES}
    assert out["replacement_wraps_original_once"] == {k: True for k in ALL_SITES}
    assert out["identical_after_disable"] == {k: True for k in ALL_SITES}
    assert out["status_after_disable"] == []


@pytest.mark.megatron
@pytest.mark.parametrize("mode", ["before", "after"])
def test_enable_before_or_after_importing_megatron_bridge(mode):
    # "after": the script probe imports every site's module, then enables (its two by-value imports
    # come on top), so one interpreter importing Megatron serves both tests
    _check_patched_and_restored(_probe({"before": "before", "after": "script"}[mode]))


@pytest.mark.megatron
def test_qwen_example_script_shape_is_reached_through_call_time_lookups():
    # forward_step and pretrain_megatron_mimo imported by value at the top of the script, then
    # enable(): the by-value forward_step still resolves the slicing helper in its module globals,
    # and pretrain_megatron_mimo looks up train_megatron_mimo at call time.
    out = _probe("script")
    assert out["script_forward_step_sees_replacement"] is True
    assert out["pretrain_entry_wrapped"] is True
    _check_patched_and_restored(out)


@pytest.mark.megatron
def test_launcher_enables_every_python_process_from_the_environment():
    # `mimo-accel run` puts the bootstrap sitecustomize first on PYTHONPATH; the probe (mode
    # "env") never calls enable() itself.
    out = _probe("env")
    assert out["mimo_accel_imported_at_start"] is True
    _check_patched_and_restored(out)


def test_launcher_with_variable_unset_does_nothing_at_all():
    env = cli.launcher_env({k: v for k, v in os.environ.items() if not k.startswith("MIMO_ACCEL")})
    code = "import sys; print('mimo_accel' in sys.modules, 'megatron' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["False", "False"]


def test_the_startup_hooks_read_the_off_words_of_the_config():
    """The startup hook (one line in a .pth, run before anything can be imported) and run's
    sitecustomize spell the off words themselves: the same ones the config reads."""
    import ast
    import re

    from mimo_accel.config import OFF_WORDS

    pth = (ROOT / "mimo_accel" / "_bootstrap" / "mimo_accel.pth").read_text()
    assert pth.count("\n") == 1 and pth.startswith("import os;")
    site = (ROOT / "mimo_accel" / "_bootstrap" / "sitecustomize.py").read_text()
    for text in (pth, site):
        spelled = re.findall(r"\((?:''|\"\"), [^)]*\)", text)  # the tuples that start with ""
        assert len(spelled) == 1 and ast.literal_eval(spelled[0]) == OFF_WORDS, text


def test_launcher_chains_an_existing_sitecustomize(tmp_path):
    (tmp_path / "sitecustomize.py").write_text("import builtins; builtins.USER_SITECUSTOMIZE_RAN = True\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("MIMO_ACCEL")}
    env["PYTHONPATH"] = str(tmp_path)
    env = cli.launcher_env(env)
    code = "import builtins; print(getattr(builtins, 'USER_SITECUSTOMIZE_RAN', False))"
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert proc.stdout.strip() == "True", proc.stderr


@pytest.mark.megatron
def test_unknown_environment_value_fails_at_startup_with_the_valid_list():
    env = {k: v for k, v in os.environ.items() if not k.startswith("MIMO_ACCEL")}
    env["MIMO_ACCEL"] = "shard,turbo"
    env["PYTHONPATH"] = str(cli.BOOTSTRAP_DIR)
    proc = subprocess.run([sys.executable, "-c", "print('ran')"], env=env, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode != 0 and "ran" not in proc.stdout
    assert "'turbo'" in proc.stderr and "reorder" in proc.stderr and "all" in proc.stderr
    with pytest.raises(ConfigError, match="turbo"):
        cli.launcher_env(env)


# -- in-process checks (megatron.bridge is already imported by conftest) ------------------------


@pytest.fixture
def clean_engine():
    mimo_accel.disable()
    yield
    mimo_accel.disable()


def _sites():
    import megatron.bridge.data.megatron_mimo as pkg
    import megatron.bridge.data.megatron_mimo.dp_utils as dp_utils
    import megatron.bridge.training.megatron_mimo_step as step

    return dp_utils, step, pkg


def test_enable_is_idempotent_and_reconfiguring_never_chains_wrappers(clean_engine):
    dp_utils, step, pkg = _sites()
    original = dp_utils.slice_batch_for_megatron_mimo
    mimo_accel.enable(sharded_reads=True)
    first = step.slice_batch_for_megatron_mimo
    patched = mimo_accel.status()["patched"]
    mimo_accel.enable(sharded_reads=True)
    assert step.slice_batch_for_megatron_mimo is first and mimo_accel.status()["patched"] == patched
    mimo_accel.enable(sharded_reads=True, packing=True)
    second = step.slice_batch_for_megatron_mimo
    assert second is not first and second.__wrapped__ is original
    mimo_accel.disable()
    assert step.slice_batch_for_megatron_mimo is original and pkg.slice_batch_for_megatron_mimo is original


def test_everything_off_patches_nothing(clean_engine):
    dp_utils, step, pkg = _sites()
    before = (dp_utils.slice_batch_for_megatron_mimo, step._get_module_dp_info)
    cfg = mimo_accel.enable(AccelConfig())
    assert cfg.features() == [] and mimo_accel.status()["patched"] == []
    assert (dp_utils.slice_batch_for_megatron_mimo, step._get_module_dp_info) == before


def test_mismatched_upstream_signature_is_refused_before_anything_is_patched(clean_engine, monkeypatch):
    dp_utils, step, pkg = _sites()

    def slice_batch_for_megatron_mimo(batch, rank, size):  # a renamed parameter: a moved target
        return batch

    monkeypatch.setattr(step, "slice_batch_for_megatron_mimo", slice_batch_for_megatron_mimo)
    untouched = dp_utils.get_megatron_mimo_sampling_info
    with pytest.raises(PatchError, match=r"megatron_mimo_step\.slice_batch_for_megatron_mimo.*Nothing was patched"):
        mimo_accel.enable(sharded_reads=True)
    assert mimo_accel.status()["patched"] == []
    assert dp_utils.get_megatron_mimo_sampling_info is untouched


def test_unsupported_version_is_refused(clean_engine, monkeypatch):
    # the full version guard is tested in test_version_guard.py
    monkeypatch.delenv("MIMO_ACCEL_ALLOW_UNTESTED", raising=False)
    monkeypatch.setattr(engine, "installed_versions", lambda: ("0.5.1", "0.19.2"))
    with pytest.raises(PatchError, match=r"megatron-bridge 0\.5\.1 .*not a tested combination"):
        mimo_accel.enable(packing=True)
    assert mimo_accel.status()["patched"] == []


def test_explicit_arguments_override_environment_override_defaults(monkeypatch):
    from mimo_accel.config import resolve

    monkeypatch.setenv("MIMO_ACCEL", "pack,reorder")
    monkeypatch.setenv("MIMO_ACCEL_PAD_MULTIPLE", "8")
    cfg = resolve(None, {"packing": False})
    assert cfg.reorder and cfg.sharded_reads and not cfg.packing and cfg.pad_multiple == 8
    monkeypatch.setenv("MIMO_ACCEL", "0")
    monkeypatch.delenv("MIMO_ACCEL_PAD_MULTIPLE")
    assert resolve(None, {}) == AccelConfig()


def test_profiler_off_installs_no_wrappers_and_on_installs_the_hooks(clean_engine):
    """The encoders are timed only with the profiler (or online calibration); the optimizer step,
    where rank 0's step line comes from, ends every feature's step."""
    from megatron.core.models.mimo.optimizer import MimoOptimizer
    from megatron.core.models.mimo.submodules.base import ModalitySubmodules

    encode, step = ModalitySubmodules.__dict__["encode"], MimoOptimizer.__dict__["step"]
    mimo_accel.enable(sharded_reads=True, packing=True)
    assert ModalitySubmodules.__dict__["encode"] is encode and MimoOptimizer.__dict__["step"] is not step
    assert not any("encode" in p for p in mimo_accel.status()["patched"])
    mimo_accel.enable(sharded_reads=True, packing=True, profile="/tmp/mimo-accel-unused")
    assert ModalitySubmodules.__dict__["encode"] is not encode and MimoOptimizer.__dict__["step"] is not step
    mimo_accel.disable()
    assert ModalitySubmodules.__dict__["encode"] is encode and MimoOptimizer.__dict__["step"] is step


# -- the log line at enable() ------------------------------------------------------------------

_ENABLE_TWICE = """
import logging, sys
if sys.argv[1] == "info":  # what Bridge's MIMO example does in main()
    logging.basicConfig(level=logging.INFO, format="[Rank 0] %(name)s: %(message)s")
elif sys.argv[1] == "warning":
    logging.basicConfig(level=logging.WARNING)
import mimo_accel
mimo_accel.enable(sharded_reads=True, reorder=True, packing=True)
mimo_accel.enable(sharded_reads=True, reorder=True, packing=True)  # the same config again: a no-op
mimo_accel.enable(packing=True, profile="/tmp/mimo-accel-unused")  # another config: re-patched
"""


@pytest.mark.megatron
@pytest.mark.parametrize("logging_setup", ["none", "info", "warning"])
def test_enable_logs_one_line_naming_what_is_on(logging_setup):
    """Whatever the job's logging set-up (none, Bridge's example's format at INFO, Python's default
    at WARNING), the line has the one documented prefix, once."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MIMO_ACCEL")}
    proc = subprocess.run([sys.executable, "-c", _ENABLE_TWICE, logging_setup], env=env, capture_output=True,
                          text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    lines = [l for l in proc.stderr.splitlines() if "mimo_accel" in l and "enabled" in l]
    m = engine.T.match(*engine.installed_versions())
    versions = f"on megatron-bridge {m.bridge} / megatron-core {m.core} (shape {m.shape.name}, {m.status})"
    assert lines == [f"mimo_accel: enabled sharded_reads, reorder, packing {versions}",
                     f"mimo_accel: enabled packing, profile (/tmp/mimo-accel-unused) {versions}"]
    assert "mimo_accel: mimo_accel" not in proc.stderr and "INFO:mimo_accel" not in proc.stderr


_NOTICE_UNDER_A_FORMAT = """
import logging, sys
logging.basicConfig(level=logging.INFO, format="[Rank 0] %(name)s: %(message)s")
from mimo_accel.notices import Notices
import mimo_accel
Notices(logging.getLogger("mimo_accel")).say_once("k", "mimo_accel packing: a notice")
logging.getLogger("mimo_accel.datasets.shared_index").warning("mimo_accel: a child's line")
logging.getLogger("mimo_accel").setLevel(logging.ERROR)  # the user's level on the logger holds
Notices(logging.getLogger("mimo_accel")).say_once("k2", "mimo_accel: not shown")
"""


def test_every_line_has_the_one_prefix_under_a_jobs_format():
    proc = subprocess.run([sys.executable, "-c", _NOTICE_UNDER_A_FORMAT], capture_output=True, text=True, timeout=60,
                          env={k: v for k, v in os.environ.items() if not k.startswith("MIMO_ACCEL")})
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.splitlines() == ["mimo_accel: packing: a notice", "mimo_accel: a child's line"]


@pytest.mark.parametrize("kwargs, profiled", [
    (dict(sharded_reads=True, packing=True), False),
    (dict(reorder=True, calibrate_online=False), False),
    (dict(profile="{d}"), True),
    (dict(reorder=True), True),  # online calibration learns from the profiler's module timers
    (dict(reorder=True, profile="{d}"), True),  # both rows keep the same Profiling: built once
])
def test_the_registry_builds_what_each_feature_keeps_in_the_runtime(tmp_path, kwargs, profiled):
    from mimo_accel.patching import registry
    from mimo_accel.patching.targets import SHAPES
    from mimo_accel.runtime.measuring.profiling import Profiling

    cfg = AccelConfig(**{k: v.format(d=tmp_path) if isinstance(v, str) else v for k, v in kwargs.items()})
    for shape in SHAPES:
        runtime = registry.runtime_for(cfg, shape)
        assert runtime.config is cfg and runtime.native_packing == shape.native_packing
        assert isinstance(runtime.profiling, Profiling) == profiled, (kwargs, runtime.profiling)
        if profiled:
            assert runtime.profiling.runtime is runtime
        runtime.close()
