"""`mimo-accel doctor`: what this install has, what mimo_accel can patch on it, and what the
``MIMO_ACCEL*`` variables here turn on in a job started from this environment (doctor is a process
of its own: nothing is enabled in it)."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import platform
import sys
import time
from pathlib import Path
from typing import Optional


def _target_state(t) -> tuple[str, str]:
    from mimo_accel.patching.engine import find_attribute, target_problem

    try:
        module = importlib.import_module(t.site)
    except Exception as exc:  # report, don't crash: this is a diagnosis
        return "missing", f"import failed: {type(exc).__name__}: {exc}"[:120]
    problem = target_problem(t, module)
    if problem is not None:
        return ("missing" if problem == "it does not exist" else "mismatch"), problem
    _, _, obj = find_attribute(module, t.name)
    defined = getattr(inspect.unwrap(obj), "__module__", "?")
    return "ok", "defined here" if defined == t.site else f"bound from {_short(defined)}"


def _short(module: str) -> str:
    return module.replace("megatron.bridge.", "bridge.").replace("megatron.core.", "core.")


def _torch():
    """torch, or None where it is not installed (doctor then says so instead of crashing)."""
    try:
        import torch
    except ImportError:
        return None
    return torch


def missing_packages(torch, bridge: Optional[str], core: Optional[str]) -> list[str]:
    """What this environment lacks for mimo_accel to patch anything, each with how to get it."""
    missing = []
    if torch is None:
        missing.append("torch (install the build for this machine first: https://pytorch.org/get-started/locally/)")
    absent = [name for name, v in (("megatron-bridge", bridge), ("megatron-core", core)) if v is None]
    if absent:
        missing.append(f"{' and '.join(absent)} (after torch: pip install --no-build-isolation "
                       "'megatron-bridge>=0.6,<0.7' 'megatron-core>=0.19,<0.20'; see the README's Install)")
    return missing


def collect() -> dict:
    from mimo_accel.patching import engine, registry, targets
    from mimo_accel.tools import devkit
    from mimo_accel.tools.devkit import STAND_IN_MARKER

    from mimo_accel._version import __version__

    torch = _torch()
    bridge, core = engine.installed_versions()
    info = {
        "mimo-accel": __version__,
        "python": platform.python_version(),
        "torch": torch.__version__ if torch is not None else "not installed",
        "megatron-core": core or "not installed",
        "megatron-bridge": bridge or "not installed",
        "cuda_available": bool(torch is not None and torch.cuda.is_available()),
        "nccl_available": bool(torch is not None and torch.distributed.is_available()
                               and torch.distributed.is_nccl_available()),
        "transformer_engine": importlib.util.find_spec("transformer_engine") is not None
        and not getattr(sys.modules.get("transformer_engine"), STAND_IN_MARKER, False),
    }
    m = targets.match(bridge, core)
    shape = m.shape
    info["shape"] = shape.name if shape else None
    info["support"] = support_line(m)
    info["missing"] = missing_packages(torch, bridge, core)
    info["refused"] = bool(info["missing"]) or m.status == "missing" or (m.status == "untested" and not _allowed())
    rows, internals = [], []
    if shape is not None and torch is not None:
        devkit.prepare_imports()  # import-time compatibility only (3.11 back-port, stand-ins where absent)
        for name, patch in registry.PATCHES.items():
            if not patch.applies_to(shape):
                continue
            users = [f for f, needs in registry.FEATURES.items() if name in needs]
            for t in patch.targets:
                state, where = _target_state(t)
                rows.append(dict(patch=name, features=users, target=f"{_short(t.site)}:{t.name}", state=state,
                                 detail=where))
        for internal in targets.INTERNALS:
            problem = engine.internal_problem(internal)
            internals.append(dict(name=_short(internal.where), features=list(internal.features),
                                  state="ok" if problem is None else "missing", detail=problem or internal.used_for))
    info["targets"] = rows
    info["internals"] = internals
    # what enable() would refuse, naming it: the features that need it cannot be turned on here
    info["differ"] = [f"{r.get('target') or r.get('name')}: {r['detail']}" for r in rows + internals if r["state"] != "ok"]
    info.update(environment())
    return info


def environment(environ=None) -> dict:
    """What the ``MIMO_ACCEL*`` variables of ``environ`` (default: this process's) turn on in a job
    started with them: ``{"env_features": [...], "env_error": None or the one line, "startup_hook":
    path or None}``."""
    from mimo_accel._bootstrap.startup import installed_hook
    from mimo_accel.config import ConfigError, check_environment

    env = os.environ if environ is None else environ
    features, error = [], None
    try:
        cfg = check_environment(env)
        cfg.check_paths(env)
        features = cfg.features()
    except ConfigError as exc:
        error = " ".join(str(exc).split())
    hook = installed_hook()
    return {"env_features": features, "env_error": error, "startup_hook": str(hook) if hook else None,
            "env_variables": {k: v for k, v in sorted(env.items()) if k.upper().startswith("MIMO_ACCEL")}}


def _allowed() -> bool:
    from mimo_accel.config import ConfigError
    from mimo_accel.patching import engine

    try:
        return engine.allow_untested()
    except ConfigError:
        return False


def support_line(m) -> str:
    """Whether enable() accepts this installed pair: tested / declared / untested / refused."""
    from mimo_accel.patching import targets

    if m.status in ("tested", "declared"):
        return f"{m.shape.support}: {m.shape.evidence}"
    if m.status in ("patch", "build"):
        what = "newer patch release" if m.status == "patch" else "source build"
        return (f"{what}, accepted as shape '{m.shape.name}' where its targets match "
                f"({'; '.join(m.problems)})")
    why = "; ".join(m.problems)
    if m.status == "untested" and _allowed():
        return (f"untested, allowed by {targets.ALLOW_UNTESTED_ENV}=1: patched as nearest shape "
                f"'{m.shape.name}' ({why})")
    nearest = f"; {targets.ALLOW_UNTESTED_ENV}=1 would use nearest shape '{m.shape.name}'" if m.shape else ""
    return f"refused: {why}{nearest}"


FEATURES = ("sharded_reads", "reorder", "packing", "profile")


def _print_environment(console, info: dict) -> None:
    """What a job started from here gets: the variables, what they turn on, and how."""
    shown = ", ".join(f"{k}={v}" for k, v in info["env_variables"].items()) or "none set"
    console.print(f"MIMO_ACCEL* here: {shown}", highlight=False, soft_wrap=True)
    if info["env_error"]:
        console.print(f"[red]a job started with them stops at its start: {info['env_error']}[/red]", soft_wrap=True)
    elif info["env_features"]:
        how = (f"through the startup hook {info['startup_hook']}" if info["startup_hook"] else
               "through mimo-accel run only (no startup hook in this Python: reinstall mimo-accel)")
        console.print(f"a Python process started with them turns on {', '.join(info['env_features'])}, {how}",
                      highlight=False, soft_wrap=True)


def default_log_path() -> str:
    import tempfile

    return os.path.join(tempfile.gettempdir(), "mimo-accel-doctor.log")


def main(log_path: Optional[str] = None) -> int:
    """Print the tables; what importing megatron prints (TE/Apex fallbacks, modelopt plugins, ...)
    goes to ``log_path`` (default :func:`default_log_path`), named on the last line."""
    from rich.console import Console
    from rich.table import Table

    from mimo_accel.tools.quiet import output_to

    log = Path(log_path or default_log_path())
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(f"mimo-accel doctor, {time.strftime('%Y-%m-%d %H:%M:%S')}: third-party import output\n",
                   encoding="utf-8")
    with output_to(log):
        info = collect()
    console = Console(width=max(Console().width, 120))
    env = Table(title="mimo-accel doctor: environment", show_header=False)
    for key in ("mimo-accel", "python", "torch", "megatron-core", "megatron-bridge", "shape", "support", "cuda_available",
                "nccl_available", "transformer_engine"):
        env.add_row(key, str(info[key]))
    console.print(env)
    colors = {"ok": "green", "missing": "red", "mismatch": "yellow"}
    tt = Table(title="MegatronMIMO targets (what mimo_accel patches)")
    for col in ("patch", "target", "state", "found as"):
        tt.add_column(col)
    for r in info["targets"]:
        color = colors[r["state"]]
        tt.add_row(r["patch"], r["target"], f"[{color}]{r['state']}[/{color}]", r["detail"])
    if info["targets"]:  # none to show where megatron (or torch) is missing: the last line says so
        console.print(tt)
    it = Table(title="private upstream names (what mimo_accel reads)")
    for col in ("name", "needed by", "state", "what for"):
        it.add_column(col)
    for r in info["internals"]:
        color = colors[r["state"]]
        it.add_row(r["name"], ", ".join(r["features"]), f"[{color}]{r['state']}[/{color}]", r["detail"])
    if info["internals"]:
        console.print(it)
    ft = Table(title="features")
    ft.add_column("feature")
    ft.add_column("can be patched here")
    ft.add_column("on from MIMO_ACCEL* here")
    broken = {f for r in info["targets"] + info["internals"] if r["state"] != "ok" for f in r["features"]}
    for feature in FEATURES:
        ok = not info["refused"] and feature not in broken and not (feature == "reorder" and "sharded_reads" in broken)
        ft.add_row(feature, "[green]yes[/green]" if ok else "[red]no[/red]",
                   "yes" if feature in info["env_features"] else "no")
    console.print(ft)
    _print_environment(console, info)
    if info["differ"]:
        console.print(f"[red]what differs from shape '{info['shape']}' (enable() refuses the features that "
                      f"need it): {'; '.join(info['differ'])}[/red]", soft_wrap=True)
    elif info["targets"]:
        console.print(f"every target has shape '{info['shape']}'", highlight=False)
    console.print(f"third-party import output: {log}", highlight=False, soft_wrap=True)
    if info["missing"]:
        console.print(f"[red]missing: {'; '.join(info['missing'])}[/red]", soft_wrap=True)
        return 1
    if info["refused"]:
        console.print(f"[red]mimo_accel.enable() refuses megatron-bridge {info['megatron-bridge']} with "
                      f"megatron-core {info['megatron-core']}: {info['support']}[/red]")
        return 1
    return 1 if info["differ"] else 0
