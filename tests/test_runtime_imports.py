"""A training job imports the runtime only, never the CPU rehearsal kit or the offline tools.

What a GPU job runs — ``import mimo_accel; mimo_accel.enable(...)`` and upstream's MIMO modules,
patched as they are imported — is checked in a fresh interpreter. The only rehearsal-kit module
allowed in is ``mimo_accel.rehearse.cpu``, loaded *before* the snapshot because megatron.bridge does not
import on this CPU machine without its stand-ins (a GPU machine imports it directly).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

# The CPU rehearsal kit and the offline tools (their own subpackages): nothing a training job needs.
KIT_AND_TOOLS = ("mimo_accel.rehearse.", "mimo_accel.tools.")

_JOB = r"""
import json, sys
from mimo_accel.rehearse import cpu
cpu.prepare_imports()                      # this machine only: see the module docstring
before = {m for m in sys.modules if m.startswith("mimo_accel")}
import mimo_accel
mimo_accel.enable(sharded_reads=True, reorder=True, packing=True, profile=sys.argv[1])
import megatron.bridge.data.megatron_mimo.loaders
import megatron.bridge.training.megatron_mimo_step
import megatron.bridge.training.pretrain_megatron_mimo
import megatron.core.models.mimo
import megatron.core.pipeline_parallel.bridge_communicator
status = mimo_accel.status()
after = {m for m in sys.modules if m.startswith("mimo_accel")}
print("RESULT " + json.dumps({"new": sorted(after - before), "patched": len(status["patched"]),
                              "waiting": status["waiting_for_import"]}))
"""


@pytest.mark.megatron
def test_enable_on_a_training_job_never_imports_the_rehearsal_kit(tmp_path):
    proc = subprocess.run([sys.executable, "-c", _JOB, str(tmp_path / "prof")], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))
    result = json.loads(line[len("RESULT "):])
    assert result["patched"] > 0 and result["waiting"] == [], result  # the job path was really patched
    loaded = set(result["new"])
    assert {"mimo_accel.patching.engine", "mimo_accel.runtime.scope", "mimo_accel.runtime.step"} <= loaded, loaded
    kit = sorted(m for m in loaded if m.startswith(KIT_AND_TOOLS))
    assert not kit, f"a training job imported {kit}"
