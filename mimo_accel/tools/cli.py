"""`mimo-accel`: doctor, run, env, report, layout (and simulate --layout), index, calibrate; from a
checkout's `make setup` also the development commands rehearse, calibrate-gpu and gpu-check (mimo_accel_dev)."""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import sys
from pathlib import Path
from typing import Optional, Sequence

from mimo_accel.tools.arguments import TRACEBACK_ENV, UsageError, one_line, output_file

BOOTSTRAP_DIR = Path(__file__).resolve().parents[1] / "_bootstrap"


# -- the job's environment (run, env) ------------------------------------------------------------


def job_config(environ: dict, features: Optional[str] = None, config_file: Optional[str] = None,
               overrides: Sequence[str] = ()):
    """The AccelConfig a job gets: ``config_file``'s ``mimo_accel:`` section (else the ``MIMO_ACCEL*``
    environment), then ``--features`` (the switches, as ``MIMO_ACCEL`` words), then the overrides
    (Bridge's grammar: ``key=value``, ``+key=value``, ``++key=value``, ``~key``)."""
    from mimo_accel.config import DEFAULT_PROFILE_DIR, ENV_FEATURES, SWITCHES, AccelConfig, switches_from_words
    from mimo_accel.config_file import load_config

    if config_file is not None:
        cfg = load_config(config_file)
    else:
        cfg = AccelConfig.from_env({k: v for k, v in environ.items() if features is None or k != ENV_FEATURES})
    if features is not None:
        words = switches_from_words(features, f"--features {features!r}")
        cfg = cfg.replace(**{name: words.get(name, False) for name in SWITCHES},
                          profile=(cfg.profile or DEFAULT_PROFILE_DIR) if words.get("profile") else cfg.profile)
    return load_config(overrides=overrides, base=cfg) if overrides else cfg


def launcher_env(environ: dict, features: Optional[str] = None, config_file: Optional[str] = None,
                 overrides: Sequence[str] = ()) -> dict:
    """The environment ``mimo-accel run`` gives the job: the bootstrap dir first on PYTHONPATH and,
    with ``features`` / ``config_file`` / ``overrides``, the ``MIMO_ACCEL*`` variables of that config
    (replacing any already set). A bad value, or a ``MIMO_ACCEL*`` name mimo_accel does not read,
    raises ConfigError here, before the job starts."""
    from mimo_accel.config import CONFIG_ENV, check_environment

    env = dict(environ)
    if features is not None or config_file is not None or overrides:
        cfg = job_config(env, features, config_file, overrides)
        for var in CONFIG_ENV:
            env.pop(var, None)
        env.update(cfg.to_env())
    check_environment(env)  # an unknown name or value fails here, before the job starts
    here = str(BOOTSTRAP_DIR)
    parts = [here] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != here]
    env["PYTHONPATH"] = os.pathsep.join(parts)
    return env


def _split_command(words: list[str]) -> tuple[list[str], list[str]]:
    """``[options and key=value ...] -- COMMAND ...`` -> (options, command). Without ``--`` the
    command starts at the first word that is neither an option (or its value) nor key=value."""
    if "--" in words:
        i = words.index("--")
        return words[:i], words[i + 1:]
    from mimo_accel.config_file import is_override

    i = 0
    while i < len(words):
        w = words[i]
        if w in ("--features", "--config"):
            i += 2
        elif w.startswith("-") or is_override(w):
            i += 1
        else:
            break
    return words[:i], words[i:]


def _check_overrides(words: Sequence[str], command_after: bool = True) -> None:
    from mimo_accel.config_file import is_override

    for w in words:
        if not is_override(w):
            raise UsageError(f"{w!r} is not key=value; give mimo_accel options as e.g. packing=true (or Bridge's "
                             "+key=value, ++key=value, ~key)" + (", and the command after --" if command_after else ""))


def _warn_without_effect(cmd: str, cfg) -> None:
    for line in cfg.without_effect():
        print(f"mimo-accel {cmd}: warning: {line}", file=sys.stderr)


def _run(args) -> int:
    command = list(args.command)
    _check_overrides(args.overrides)
    if not command:
        raise UsageError("give the command to run after --, e.g. mimo-accel run --features all -- torchrun "
                         "--nproc-per-node 8 train.py")
    env = launcher_env(dict(os.environ), args.features, args.config, args.overrides)
    from mimo_accel.config import AccelConfig

    cfg = AccelConfig.from_env(env)
    cfg.check_files()
    program = shutil.which(command[0], path=env.get("PATH", os.defpath))
    if program is None:
        where = "is not an executable file" if os.sep in command[0] else "is not found on PATH"
        raise UsageError(f"command {command[0]!r} {where}; give the program to run (e.g. torchrun, python) "
                         "or its full path after --")
    if cfg.any_feature:  # the job's Python must be one whose bootstrap enables mimo_accel
        from mimo_accel.tools.job_python import check_job_python

        note = check_job_python(command, program, env)
        if note is not None:
            print(f"mimo-accel run: note: {note}", file=sys.stderr)
    _warn_without_effect("run", cfg)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execve(program, command, env)
    except OSError as exc:
        raise UsageError(f"cannot run {command[0]!r}: {exc.strerror}") from None
    return 0  # not reached


def _env(args) -> int:
    from mimo_accel.config import CONFIG_ENV, AccelConfig

    _check_overrides(args.overrides, command_after=False)
    environ = dict(os.environ)
    env = launcher_env(environ, args.features, args.config, args.overrides)
    cfg = AccelConfig.from_env(env)
    cfg.check_files()
    _warn_without_effect("env", cfg)
    lines = [f"unset {var}" for var in CONFIG_ENV if var in environ and var not in cfg.to_env()]
    lines += [f"export {var}={shlex.quote(value)}" for var, value in cfg.to_env().items()]
    lines.append(f"export PYTHONPATH={shlex.quote(env['PYTHONPATH'])}")
    print("\n".join(lines))
    return 0


# -- the commands ----------------------------------------------------------------------------------


def _doctor(args) -> int:
    from mimo_accel.tools.doctor import main as doctor_main

    output_file("--log", args.log)

    return doctor_main(log_path=args.log)


# Subcommands whose module parses its own arguments.
DELEGATED = {
    "report": ("mimo_accel.tools.report", "before/after straggler report from profiler runs"),
    "rehearse": ("mimo_accel_dev.commands.rehearse", "CPU rehearsal of a real MegatronMIMO layout, baseline vs accelerated"),
    "layout": ("mimo_accel.tools.layout", "what a job's layout will do (--current), and the layouts (each module's "
               "TP/PP/DP) within a GPU budget that fit, priced with and without mimo_accel, and the settings of the best"),
    "simulate": ("mimo_accel.tools.simulate", "--layout SPEC: the same as layout --current SPEC"),
    "index": ("mimo_accel.tools.indexing", "build a per-sample cost index from a manifest or the training dataset"),
    "calibrate": ("mimo_accel.tools.calibrate", "fit the cost model from profiler logs"),
    "calibrate-gpu": ("mimo_accel_dev.commands.calibrate_gpu", "measure each module's cost curve on this machine's GPU "
                      "(Qwen3-VL vision, Qwen3-8B layers) and write the cost-model file"),
    "gpu-check": ("mimo_accel_dev.commands.gpu_check", "check on one GPU: packing under Transformer Engine, CUDA-event "
                  "timers, calibrate-gpu, online calibration, NVTX ranges"),
}
# Their modules are the development kit's (mimo_accel.tools.devkit): a wheel does not ship them.
DEV_COMMANDS = ("rehearse", "calibrate-gpu", "gpu-check")

_CONFIG_HELP = ("a YAML file whose mimo_accel: section is the job's config (instead of the MIMO_ACCEL* "
                "environment)")
_FEATURES_HELP = "the switches, as MIMO_ACCEL words: e.g. all, or shard,reorder,pack,profile; 0 = off"
_OVERRIDES_HELP = ("mimo_accel options on top, e.g. packing=true pad_multiple=2 (OmegaConf values; Bridge's "
                   "+key=value, ++key=value and ~key too)")


def _version() -> str:
    from mimo_accel._version import __version__

    return f"mimo-accel {__version__}"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mimo-accel", description=__doc__)
    p.add_argument("--version", action="version", version=_version())
    sub = p.add_subparsers(dest="cmd", required=True)
    doctor = sub.add_parser("doctor", help="versions, CUDA/TE/NCCL, and which MegatronMIMO targets can be patched")
    doctor.add_argument("--log", metavar="PATH", help="where the imports' third-party output goes (default: "
                                                      "mimo-accel-doctor.log in the temp directory)")
    doctor.set_defaults(func=_doctor)
    run = sub.add_parser("run", help="run a command (e.g. torchrun ...) with mimo_accel enabled in every Python "
                                     "process, from MIMO_ACCEL*, --config or --features",
                         usage="mimo-accel run [--config FILE] [--features WORDS] [key=value ...] -- COMMAND ...",
                         description="Run COMMAND with the mimo_accel bootstrap first on PYTHONPATH: every Python "
                                     "process of the job (torchrun and each worker) calls mimo_accel.enable() "
                                     "from the MIMO_ACCEL* variables before the script imports megatron.bridge. "
                                     "--config / --features / key=value set those variables for the job (they "
                                     "replace any already set); without them the job gets the current ones. "
                                     "Every MIMO_ACCEL* variable is checked first, and with a feature on the "
                                     "command's Python (the program, or the interpreter its #! line names) is "
                                     "asked whether its bootstrap will enable mimo_accel: refused if not.",
                         epilog="e.g. mimo-accel run --config run.yaml pad_multiple=2 -- torchrun "
                                "--nproc-per-node 8 train.py")
    env = sub.add_parser("env", help="print the export lines a launcher needs (sbatch, NeMo-Run, k8s) for what "
                                     "`mimo-accel run` would set",
                         usage="mimo-accel env [--config FILE] [--features WORDS] [key=value ...]",
                         description="Print, as shell export lines, the variables `mimo-accel run` would give the "
                                     "job: the MIMO_ACCEL* of the config and the PYTHONPATH with the bootstrap "
                                     "directory first. For launchers that cannot wrap a command: eval them in an "
                                     "sbatch script, or copy the values into NeMo-Run's env_vars or a PyTorchJob's "
                                     "env.",
                         epilog='e.g. eval "$(mimo-accel env --config run.yaml)"; srun python train.py')
    for parser in (run, env):
        parser.add_argument("--config", metavar="FILE", help=_CONFIG_HELP)
        parser.add_argument("--features", metavar="WORDS", help=_FEATURES_HELP)
        parser.add_argument("overrides", nargs="*", metavar="key=value", help=_OVERRIDES_HELP)
    run.set_defaults(func=_run, command=[])
    env.set_defaults(func=_env)
    for name, (_, help_) in DELEGATED.items():
        dev = "; a development command: a checkout's make setup" if name in DEV_COMMANDS else ""
        sub.add_parser(name, help=help_ + f" (mimo-accel {name} --help{dev})")
    return p


def _subparser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return action.choices[name]


def main(argv: Optional[Sequence[str]] = None) -> int:
    from mimo_accel.config import ConfigError
    from mimo_accel.tools.devkit import DevKitMissing, import_dev

    argv = list(sys.argv[1:] if argv is None else argv)
    cmd = argv[0] if argv and not argv[0].startswith("-") else None
    try:
        if cmd in DELEGATED:
            import importlib

            module = (import_dev(DELEGATED[cmd][0], "this development command") if cmd in DEV_COMMANDS
                      else importlib.import_module(DELEGATED[cmd][0]))
            return int(module.main(argv[1:]) or 0)
        parser = build_parser()
        if cmd in ("doctor", "run", "env"):  # options and key=value in any order (run: the command after --)
            words, command = _split_command(argv[1:]) if cmd == "run" else (argv[1:], [])
            args = _subparser(parser, cmd).parse_intermixed_args(words)
            args.command = command
        else:
            args = parser.parse_args(argv)
        return int(args.func(args) or 0)
    except (UsageError, ConfigError, ValueError, OSError, DevKitMissing) as exc:
        if os.environ.get(TRACEBACK_ENV) == "1":
            raise
        print(f"mimo-accel {cmd or ''}: error: {one_line(exc)}".replace("mimo-accel : ", "mimo-accel: "),
              file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"mimo-accel {cmd or ''}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
