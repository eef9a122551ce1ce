"""`mimo-accel`: doctor, run, report, rehearse, simulate, index, calibrate."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Optional, Sequence

BOOTSTRAP_DIR = Path(__file__).resolve().parents[1] / "_bootstrap"


def _doctor(args) -> int:
    from mimo_accel.tools.doctor import main as doctor_main

    return doctor_main()


def launcher_env(environ: dict, features: Optional[str] = None) -> dict:
    """The environment ``mimo-accel run`` gives the job: the bootstrap dir first on PYTHONPATH."""
    env = dict(environ)
    if features is not None:
        env["MIMO_ACCEL"] = features
    from mimo_accel.config import AccelConfig

    AccelConfig.from_env(env)  # an unknown value fails here, before the job starts
    parts = [str(BOOTSTRAP_DIR)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(parts)
    return env


def _run(args) -> int:
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        print("mimo-accel run: give the command to run after --, e.g. "
              "mimo-accel run --features all -- torchrun --nproc-per-node 8 train.py", file=sys.stderr)
        return 2
    env = launcher_env(dict(os.environ), args.features)
    os.execvpe(command[0], command, env)
    return 0  # not reached


# Subcommands whose module parses its own arguments.
DELEGATED = {
    "report": ("mimo_accel.tools.report", "before/after straggler report from profiler runs"),
    "rehearse": ("mimo_accel.tools.rehearsing", "CPU rehearsal of a real MegatronMIMO layout, baseline vs accelerated"),
    "simulate": ("mimo_accel.tools.simulate", "the planners at cluster scale, no processes"),
    "index": ("mimo_accel.tools.indexing", "build a per-sample cost index from a manifest or the training dataset"),
    "calibrate": ("mimo_accel.tools.calibrate", "fit the cost model from profiler logs"),
}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mimo-accel", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("doctor", help="versions, CUDA/TE/NCCL, and which MegatronMIMO targets can be patched"
                   ).set_defaults(func=_doctor)
    run = sub.add_parser("run", help="run a command (e.g. torchrun ...) with mimo_accel enabled in every "
                                     "Python process, from MIMO_ACCEL* or --features")
    run.add_argument("--features", help="MIMO_ACCEL value for the job, e.g. all or shard,pack,reorder")
    run.add_argument("command", nargs=argparse.REMAINDER)
    run.set_defaults(func=_run)
    for name, (_, help_) in DELEGATED.items():
        sub.add_parser(name, help=help_ + f" (mimo-accel {name} --help)")
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in DELEGATED:
        import importlib

        return int(importlib.import_module(DELEGATED[argv[0]][0]).main(argv[1:]) or 0)
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
