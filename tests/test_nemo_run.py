"""NeMo-Run launches with mimo_accel on through the executor's ``env_vars`` alone: docs/cluster.md's
commands, as written (tests/_doc_commands.py reads them), each in a directory of its own with
``examples/`` linked in and no ``MIMO_ACCEL*`` variable in the launcher's environment.

- NeMo-Run's LocalExecutor runs torchrun over examples/train_mimo.py on 3 CPU ranks (real
  nemo-run, real torchrun, gloo ranks); the job's profile and rank 0's step line show mimo_accel
  acted.
- NeMo-Run's SlurmExecutor, ``--dryrun``: the sbatch script it would submit exports the variables
  ``mimo-accel env --json`` gave before its ``srun --container-image ... torchrun``. Nothing is
  submitted (there is no cluster here): ``/shared/`` is made this test's directory.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests import _early
from tests._doc_commands import ROOT, examples

BIN = Path(sys.executable).parent
DEADLINE_S = 480


def _block(slurm: bool) -> list[str]:
    """docs/cluster.md's shell commands of the block that launches examples/nemo_run_launch.py (on
    Slurm or here), with the page's `mimo-accel env --json` line before it."""
    found = [e for e in examples("docs/cluster.md") if e.kind == "shell"]
    env_line = next(e.text for e in found if e.text.startswith("mimo-accel env --json"))
    launch = [e.text for e in found if "nemo_run_launch.py" in e.text and ("--slurm" in e.text) == slurm]
    assert len(launch) == 1, f"docs/cluster.md: {len(launch)} NeMo-Run launch commands (slurm={slurm}), want one"
    return [env_line, launch[0]]


def _workdir(d: Path) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    (d / "examples").symlink_to(ROOT / "examples")
    return d


def _env(d: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MIMO_ACCEL")}
    return {**env, "PATH": f"{BIN}{os.pathsep}{env.get('PATH', '')}", "NEMORUN_HOME": str(d / "nemo_run_home"),
            "MIMO_ACCEL_CACHE_DIR": str(d / "cache"), "NO_VCS_VERSION": "1"}


_SLURM = _workdir(_early.scratch("nemo-run-slurm"))
_early.command("nemo-run-slurm-dryrun",
               ["bash", "-c", "set -eo pipefail\n" + "\n".join(c.replace("/shared/", f"{_SLURM}/shared/")
                                                               for c in _block(slurm=True))],
               module=__name__, env=_env(_SLURM), cwd=_SLURM, needs_megatron=False, timeout_s=180.0)


def test_the_slurm_executor_exports_the_variables_before_srun_in_the_container():
    proc = _early.result("nemo-run-slurm-dryrun")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    wanted = json.loads((_SLURM / "mimo_accel.json").read_text())
    assert wanted["MIMO_ACCEL"] == "reorder,packing,profile" and os.path.isabs(wanted["MIMO_ACCEL_PROFILE"])
    script = Path(re.search(r"^nemo_run_launch: sbatch script (\S+)$", proc.stdout, re.M).group(1)).read_text()
    command = _block(slurm=True)[1]
    nodes, nproc = (re.search(rf"{flag} (\d+)", command).group(1) for flag in ("--nodes", "--nproc"))
    image = re.search(r"--container-image (\S+)", command).group(1).replace("/shared/", f"{_SLURM}/shared/")
    exports = dict(re.findall(r"^export (MIMO_ACCEL\w*)=(.*)$", script, re.M))
    assert exports == {k: shlex.quote(v) for k, v in wanted.items()}
    srun = next(ln for ln in script.splitlines() if ln.startswith("srun ") and "torchrun" in ln)
    assert script.index("export MIMO_ACCEL=") < script.index(srun)
    assert f"--container-image {image}" in srun
    assert f"--nnodes {nodes} --nproc-per-node {nproc}" in srun
    assert f"#SBATCH --nodes={nodes}" in script and "#SBATCH --ntasks-per-node=1" in script


@pytest.mark.distributed
@pytest.mark.megatron
def test_the_local_executor_runs_torchrun_with_mimo_accel_on_from_env_vars_alone(tmp_path):
    d = _workdir(tmp_path / "job")
    env_line, launch = _block(slurm=False)
    proc = subprocess.Popen(["bash", "-c", f"set -eo pipefail\n{env_line}\n{launch}"], cwd=d, env=_env(d), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=DEADLINE_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        out, _ = proc.communicate()
        pytest.fail(f"NeMo-Run's job still running after {DEADLINE_S} s; its output:\n{out[-6000:]}")
    assert proc.returncode == 0 and "nemo_run_launch: task train finished SUCCEEDED" in out, out[-6000:]

    env_vars = json.loads((d / "mimo_accel.json").read_text())
    # portable: MIMO_ACCEL* alone (the cache directory this test set), nothing of this checkout
    assert set(env_vars) == {"MIMO_ACCEL", "MIMO_ACCEL_PROFILE", "MIMO_ACCEL_CACHE_DIR"}
    assert not any(str(ROOT) in v for v in env_vars.values())
    # the workers had the features from env_vars (the launcher's own environment has none)
    assert "mimo_accel features: sharded_reads, reorder, packing, profile" in out, out[-6000:]
    prof = Path(env_vars["MIMO_ACCEL_PROFILE"])
    assert prof == d / "runs" / "after"
    ranks = [[json.loads(ln) for ln in (prof / f"rank{r}.jsonl").read_text().splitlines()] for r in range(3)]
    assert all(r[0]["config"]["features"] == ["sharded_reads", "reorder", "packing", "profile"] for r in ranks)
    vision = [r for r in ranks if r[0]["module"] == "vision"]
    (language,) = [r for r in ranks if r[0]["module"] == "language"]
    steps = [s for s in language if s["kind"] == "step"]
    iters = int(re.search(r"--train-iters (\d+)", launch).group(1))
    assert len(vision) == 2 and len(steps) == iters
    for i, step in enumerate(steps):
        reads = [[s for s in r if s["kind"] == "step"][i]["samples_read"] for r in vision]
        # sharded reads: each vision replica read its half of what the one language replica read
        assert reads == [step["samples_read"] // 2] * 2 and sum(reads) == step["samples_read"] > 0
        assert "vision" in step["predicted_spreads"]  # the plan priced every replica's share
    # packing acted on the language shard (its lengths from the loss mask: Bridge's all-ones attention_mask)
    assert any("mimo_accel packing" in note for s in steps for note in s.get("notes", []))
    # and rank 0 said so at the first step: the reads, the plan, the padding removed
    line = re.search(r"mimo_accel: step 1: on: sharded_reads, reorder, packing, profile; read per rank: "
                     r"vision (\d+), language (\d+) of (\d+) samples .*; packing removed (\d+) of (\d+) language", out)
    assert line, out[-6000:]
    vision_read, language_read, whole, removed, padded = map(int, line.groups())
    assert vision_read * 2 == language_read == whole and 0 < removed < padded
