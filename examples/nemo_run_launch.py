#!/usr/bin/env python3
"""Launch a MegatronMIMO training script with NeMo-Run, mimo_accel on through the executor's env_vars alone.

On this machine (NeMo-Run's LocalExecutor runs torchrun; CPU ranks):
    mimo-accel env --json --features all profile=$PWD/runs/after > mimo_accel.json
    python examples/nemo_run_launch.py --env-json mimo_accel.json --nproc 3 -- \\
        --cpu --vision-dp 2 --language-dp 1 --dataset images
On a Slurm cluster (NeMo-Run's SlurmExecutor: one torchrun per node in the container; --dryrun
writes the sbatch script NeMo-Run would submit, and prints where):
    python examples/nemo_run_launch.py --env-json mimo_accel.json --slurm --account ACCOUNT --partition gpu \\
        --nodes 3 --nproc 8 --container-image IMAGE --container-mounts /shared:/shared \\
        --job-dir /shared/nemo-run --script /shared/code/train.py -- ARGS

Every worker's Python has mimo-accel installed, so its startup hook reads the MIMO_ACCEL* variables
of ``env_vars`` and enables mimo_accel before the script imports anything: the script is unchanged
(docs/cluster.md). Exits 0 when the job succeeded (or the dry run wrote its script), 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent / "train_mimo.py"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--env-json", required=True, help="the MIMO_ACCEL* variables: `mimo-accel env --json` output")
    p.add_argument("--nproc", type=int, default=8, help="ranks per node (torchrun --nproc-per-node)")
    p.add_argument("--script", default=str(SCRIPT), help="the training script (default: examples/train_mimo.py)")
    p.add_argument("--name", default="mimo-accel", help="the NeMo-Run experiment's name")
    slurm = p.add_argument_group("Slurm (NeMo-Run's SlurmExecutor, from a login node of the cluster)")
    slurm.add_argument("--slurm", action="store_true", help="submit to Slurm instead of running here")
    slurm.add_argument("--account")
    slurm.add_argument("--partition")
    slurm.add_argument("--nodes", type=int, default=1)
    slurm.add_argument("--time", default="01:00:00")
    slurm.add_argument("--container-image", help="an image (or .sqsh) with mimo-accel installed")
    slurm.add_argument("--container-mounts", nargs="*", default=[], help="SRC:DST, e.g. the shared file system")
    slurm.add_argument("--job-dir", help="where NeMo-Run keeps the job's files (on the shared file system)")
    slurm.add_argument("--dryrun", action="store_true", help="write the sbatch script, submit nothing")
    p.add_argument("script_args", nargs=argparse.REMAINDER, help="after --: the training script's own arguments")
    args = p.parse_args(argv)
    if args.script_args[:1] == ["--"]:
        args.script_args = args.script_args[1:]
    if args.slurm and not (args.account and args.container_image and args.job_dir):
        p.error("--slurm needs --account, --container-image and --job-dir")
    return args


def executor(run, args, env_vars: dict):
    if not args.slurm:
        return run.LocalExecutor(ntasks_per_node=args.nproc, launcher="torchrun", env_vars=env_vars)
    # launcher torchrun: one Slurm task per node, torchrun starts --nproc ranks there
    return run.SlurmExecutor(account=args.account, partition=args.partition, nodes=args.nodes,
                             ntasks_per_node=args.nproc, gpus_per_node=args.nproc, time=args.time,
                             container_image=args.container_image, container_mounts=list(args.container_mounts),
                             env_vars=env_vars, launcher="torchrun", packager=run.Packager(),
                             tunnel=run.LocalTunnel(job_dir=args.job_dir))


def main(argv=None) -> int:
    import nemo_run as run

    args = parse_args(argv)
    env_vars = json.loads(Path(args.env_json).read_text())
    ex = executor(run, args, env_vars)
    # entrypoint "python": torchrun starts the file with its Python (else it runs it as a program)
    script = run.Script(path=args.script, args=list(args.script_args), entrypoint="python")
    with run.Experiment(args.name, executor=ex) as exp:
        exp.add(script, name="train", tail_logs=True)
        if args.dryrun:
            exp.dryrun(delete_exp_dir=False)  # keep the script it writes
        else:
            exp.run(sequential=True, detach=False)
    if args.dryrun:  # NeMo-Run wrote the sbatch script into the experiment's directory
        written = sorted(Path(exp._exp_dir).rglob("*_sbatch.sh"))
        print(f"nemo_run_launch: sbatch script {written[0] if written else 'not written'}", flush=True)
        return 0 if written else 1
    # the experiment waits for its tasks as the block ends
    state = exp.status(return_dict=True)["train"]["status"]
    print(f"nemo_run_launch: task train finished {state.name}", flush=True)
    return 0 if state.name == "SUCCEEDED" else 1


if __name__ == "__main__":
    sys.exit(main())
