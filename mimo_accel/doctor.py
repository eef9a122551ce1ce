"""`mimo-accel doctor`: what this install has, and what mimo_accel can patch on it."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import platform
import sys
from importlib import metadata


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def _target_state(t) -> tuple[str, str]:
    from mimo_accel.patching.engine import _resolve

    try:
        module = importlib.import_module(t.site)
    except Exception as exc:  # report, don't crash: this is a diagnosis
        return "missing", f"import failed: {type(exc).__name__}: {exc}"[:120]
    try:
        _, _, obj = _resolve(module, t.name)
    except AttributeError:
        obj = None
    if obj is None:
        return "missing", "not found"
    params = tuple(inspect.signature(obj).parameters)
    if params[:len(t.params)] != t.params:
        return "mismatch", f"params {params[:len(t.params)]} != {t.params}"
    defined = getattr(inspect.unwrap(obj), "__module__", "?")
    return "ok", "defined here" if defined == t.site else f"bound from {_short(defined)}"


def _short(module: str) -> str:
    return module.replace("megatron.bridge.", "bridge.").replace("megatron.core.", "core.")


def collect() -> dict:
    import torch

    from mimo_accel import cpu
    from mimo_accel.patching import engine, targets

    info = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "megatron-core": _version("megatron-core"),
        "megatron-bridge": _version("megatron-bridge"),
        "cuda_available": torch.cuda.is_available(),
        "nccl_available": bool(torch.distributed.is_available() and torch.distributed.is_nccl_available()),
        "transformer_engine": importlib.util.find_spec("transformer_engine") is not None
        and not getattr(sys.modules.get("transformer_engine"), cpu.STAND_IN_MARKER, False),
    }
    version = info["megatron-bridge"]
    shape = targets.shape_for(version) if version != "not installed" else None
    info["shape"] = shape.name if shape else None
    rows = []
    if version != "not installed":
        cpu.prepare_imports()  # import-time compatibility only (3.11 back-port, stand-ins where absent)
        for feature in ("context", "sharded_reads", "step", "fan_in", "profile", "train_entry"):
            for t in (shape or targets.SHAPES[0]).targets(feature):
                state, where = _target_state(t)
                rows.append(dict(feature=feature, target=f"{_short(t.site)}:{t.name}", state=state, detail=where))
    info["targets"] = rows
    st = engine.status()
    info["active"] = st["active"]
    info["patched"] = st["patched"]
    return info


FEATURE_NEEDS = {"sharded_reads": ("context", "sharded_reads", "step", "fan_in"),
                 "reorder": ("context", "sharded_reads", "step", "fan_in"),
                 "packing": ("context", "step", "fan_in"), "profile": ("profile", "step", "context")}


def main() -> int:
    from rich.console import Console
    from rich.table import Table

    info = collect()
    console = Console(width=max(Console().width, 120))
    env = Table(title="mimo-accel doctor: environment", show_header=False)
    for key in ("python", "torch", "megatron-core", "megatron-bridge", "shape", "cuda_available",
                "nccl_available", "transformer_engine"):
        env.add_row(key, str(info[key]))
    console.print(env)
    tt = Table(title="MegatronMIMO targets")
    for col in ("feature", "target", "state", "found as"):
        tt.add_column(col)
    for r in info["targets"]:
        color = {"ok": "green", "missing": "red", "mismatch": "yellow"}[r["state"]]
        tt.add_row(r["feature"], r["target"], f"[{color}]{r['state']}[/{color}]", r["detail"])
    console.print(tt)
    ft = Table(title="features")
    ft.add_column("feature")
    ft.add_column("can be patched here")
    ft.add_column("active")
    broken = {r["feature"] for r in info["targets"] if r["state"] != "ok"}
    for feature, needs in FEATURE_NEEDS.items():
        ok = info["shape"] is not None and not (set(needs) & broken)
        ft.add_row(feature, "[green]yes[/green]" if ok else "[red]no[/red]",
                   "yes" if feature in info["active"] else "no")
    console.print(ft)
    if info["shape"] is None:
        console.print(f"[red]megatron-bridge {info['megatron-bridge']} is not a supported shape[/red]")
        return 1
    return 0
