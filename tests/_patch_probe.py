"""Run in a fresh interpreter by test_patching.py: reports how the binding sites look.

argv[1]: "before" (enable, then import megatron.bridge: a training job's order; the mimo_accel
modules loaded since ``import mimo_accel`` are reported as ``loaded``), "after" (import, then enable),
"env" (enable is left to the environment/sitecustomize), "script" (Qwen3.5-VL example shape:
forward_step and pretrain_megatron_mimo imported by value at the top, enable afterwards).
"""

import json
import sys

mode = sys.argv[1]
out = {"mimo_accel_imported_at_start": "mimo_accel" in sys.modules}

from mimo_accel_dev.rehearse import cpu# noqa: E402

cpu.prepare_imports()  # only so megatron.bridge imports on this CPU machine
before = {m for m in sys.modules if m.startswith("mimo_accel")}
import mimo_accel  # noqa: E402

if mode == "before":  # a training job's enable(): what it loads is reported too (test_runtime_imports)
    mimo_accel.enable(sharded_reads=True, reorder=True, packing=True, profile="/tmp/unused-profile-dir")
if mode == "script":
    from megatron.bridge.training.megatron_mimo_step import forward_step  # noqa: E402
    from megatron.bridge.training.pretrain_megatron_mimo import pretrain_megatron_mimo  # noqa: E402

import megatron.bridge.data.megatron_mimo as pkg  # noqa: E402
import megatron.bridge.data.megatron_mimo.dp_utils as dp_utils  # noqa: E402
import megatron.bridge.data.megatron_mimo.loaders as loaders  # noqa: E402
import megatron.bridge.data.samplers as samplers  # noqa: E402
import megatron.bridge.training.megatron_mimo_step as step  # noqa: E402
import megatron.bridge.training.pretrain_megatron_mimo as pretrain  # noqa: E402,F401  (its import hook)
import megatron.core.models.mimo  # noqa: E402,F401  (the fan-in sites' import hooks)
import megatron.core.pipeline_parallel.bridge_communicator  # noqa: E402,F401

SITES = {
    "slice": [dp_utils, step, pkg],
    "sampling_info": [dp_utils, loaders, pkg],
    "loader": [samplers, loaders],
}
NAMES = {"slice": "slice_batch_for_megatron_mimo", "sampling_info": "get_megatron_mimo_sampling_info",
         "loader": "build_pretraining_data_loader"}


def snapshot():
    return {k: [getattr(m, NAMES[k]) for m in mods] for k, mods in SITES.items()}


originals = snapshot() if mode in ("after", "script") else None
if mode in ("after", "script"):
    mimo_accel.enable(sharded_reads=True, packing=True, profile="/tmp/unused-profile-dir")
if mode == "script":
    out["script_forward_step_sees_replacement"] = (
        forward_step.__globals__["slice_batch_for_megatron_mimo"] is step.slice_batch_for_megatron_mimo
        and hasattr(step.slice_batch_for_megatron_mimo, "__wrapped__"))
    out["pretrain_entry_wrapped"] = hasattr(pretrain_megatron_mimo.__globals__["train_megatron_mimo"], "__wrapped__")

patched = snapshot()
out["status"] = {k: v for k, v in mimo_accel.status().items() if k in ("active", "patched", "waiting_for_import")}
out["loaded"] = sorted({m for m in sys.modules if m.startswith("mimo_accel")} - before)
out["one_replacement_per_function"] = {k: len({id(f) for f in fs}) == 1 for k, fs in patched.items()}
out["replacement_wraps_original_once"] = {
    k: getattr(fs[0], "__wrapped__", None) is not None
    and getattr(fs[0].__wrapped__, "__wrapped__", None) is None for k, fs in patched.items()}
if originals is None:
    originals = {k: [fs[0].__wrapped__] * len(fs) for k, fs in patched.items()}
mimo_accel.disable()
restored = snapshot()
out["identical_after_disable"] = {k: all(a is b for a, b in zip(restored[k], originals[k])) for k in SITES}
out["status_after_disable"] = mimo_accel.status()["patched"]
print("PROBE " + json.dumps(out))
