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

from mimo_accel.tools.arguments import TRACEBACK_ENV, UsageError, one_line, one_line_errors, output_file

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


def job_env(environ: dict, features: Optional[str] = None, config_file: Optional[str] = None,
            overrides: Sequence[str] = ()) -> dict:
    """The ``MIMO_ACCEL*`` variables a job gets (what ``mimo-accel env`` prints): the config of
    ``features`` / ``config_file`` / ``overrides`` (else of ``environ``'s variables), every path
    made absolute here (the processes of the job may start elsewhere), and the other variables
    mimo_accel reads that ``environ`` sets for the job. Raises ConfigError for a bad value, a
    ``MIMO_ACCEL*`` name mimo_accel does not read, or a path that cannot be used, before the job
    starts. Nothing of this install (no PYTHONPATH): the job's Python needs mimo-accel installed."""
    from mimo_accel.config import CONFIG_ENV, ENV_ALLOW_UNTESTED, ENV_CACHE_DIR, check_environment

    if features is not None or config_file is not None or overrides:  # they replace the config variables
        given = job_config(environ, features, config_file, overrides).to_env()
        environ = {**{k: v for k, v in environ.items() if k not in CONFIG_ENV}, **given}
    cfg = check_environment(environ)  # an unknown name or a bad value fails here, before the job starts
    cfg.check_paths(environ)
    env = cfg.absolute().to_env()
    if environ.get(ENV_ALLOW_UNTESTED):
        env[ENV_ALLOW_UNTESTED] = environ[ENV_ALLOW_UNTESTED]
    if environ.get(ENV_CACHE_DIR):
        env[ENV_CACHE_DIR] = os.path.abspath(os.path.expanduser(environ[ENV_CACHE_DIR]))
    return env


def launcher_env(environ: dict, features: Optional[str] = None, config_file: Optional[str] = None,
                 overrides: Sequence[str] = ()) -> dict:
    """The environment ``mimo-accel run`` gives the job: ``environ`` with its ``MIMO_ACCEL*``
    config variables replaced by :func:`job_env`'s, and the bootstrap directory first on PYTHONPATH
    (for a Python that imports mimo_accel from a checkout on PYTHONPATH: an install's startup hook
    needs none)."""
    from mimo_accel.config import CONFIG_ENV

    exports = job_env(environ, features, config_file, overrides)
    env = {k: v for k, v in environ.items() if k not in CONFIG_ENV}
    env.update(exports)
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


def _warn_overrides_after_the_command(command: Sequence[str]) -> None:
    """A mimo_accel override written after ``--`` goes to the job as a script argument: said, with the fix."""
    from mimo_accel.config_file import FIELDS, SECTION, is_override

    for word in command[1:]:
        key = word.lstrip("+~").split("=", 1)[0]
        if is_override(word) and (key.startswith(SECTION + ".") or key in FIELDS):
            print(f"mimo-accel run: warning: {word!r} comes after --, so it goes to the job as an argument and "
                  "mimo_accel never sees it; to set a mimo_accel option, write it before --", file=sys.stderr)


def _run(args) -> int:
    command = list(args.command)
    _check_overrides(args.overrides)
    if not command:
        raise UsageError("give the command to run after --, e.g. mimo-accel run --features all -- torchrun "
                         "--nproc-per-node 8 train.py")
    env = launcher_env(dict(os.environ), args.features, args.config, args.overrides)
    from mimo_accel.config import AccelConfig

    cfg = AccelConfig.from_env(env)
    program = shutil.which(command[0], path=env.get("PATH", os.defpath))
    if program is None:
        where = "is not an executable file" if os.sep in command[0] else "is not found on PATH"
        raise UsageError(f"command {command[0]!r} {where}; give the program to run (e.g. torchrun, python) "
                         "or its full path after --")
    _warn_overrides_after_the_command(command)
    if cfg.any_feature:  # the job's Python must be one that enables mimo_accel
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


def what_happens(cfg) -> str:
    """One line: what a job with ``cfg`` turns on (``mimo-accel env`` prints it)."""
    if not cfg.any_feature:
        return "mimo_accel stays off in the job"
    on = []
    for name in cfg.features():
        if name == "sharded_reads" and cfg.reorder:
            continue
        on.append({"reorder": "reorder (with sharded_reads)", "profile": f"profile (into {cfg.profile})"}.get(name, name))
    return (f"mimo_accel turns on {', '.join(on)} in every Python process of the job whose environment has "
            "mimo-accel installed (its startup hook reads these variables)")


def _env(args) -> int:
    import json

    from mimo_accel.config import CONFIG_ENV, AccelConfig

    _check_overrides(args.overrides, command_after=False)
    environ = dict(os.environ)
    exports = job_env(environ, args.features, args.config, args.overrides)
    cfg = AccelConfig.from_env(exports)
    _warn_without_effect("env", cfg)
    if args.json:
        print(json.dumps(exports, indent=2))
        return 0
    lines = [f"# {what_happens(cfg)}"]
    lines += [f"unset {var}" for var in CONFIG_ENV if var in environ and var not in exports]
    lines += [f"export {var}={shlex.quote(value)}" for var, value in exports.items()]
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
_FEATURES_HELP = ("the switches, as MIMO_ACCEL words: all, or some of sharded_reads,reorder,packing,profile; "
                  "0 = off")
_OVERRIDES_HELP = ("mimo_accel options on top, e.g. packing=true pad_multiple=2 (OmegaConf values; Bridge's "
                   "+key=value, ++key=value and ~key too)")


def _version() -> str:
    from mimo_accel._version import __version__

    return f"mimo-accel {__version__}"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mimo-accel", description=__doc__)
    p.add_argument("--version", action="version", version=_version())
    sub = p.add_subparsers(dest="cmd", required=True)
    doctor = sub.add_parser("doctor", help="versions, CUDA/TE/NCCL, which MegatronMIMO targets can be patched, and "
                                           "what the MIMO_ACCEL* variables here turn on")
    doctor.add_argument("--log", metavar="PATH", help="where the imports' third-party output goes (default: "
                                                      "mimo-accel-doctor.log in the temp directory)")
    doctor.set_defaults(func=_doctor)
    run = sub.add_parser("run", help="run a command (e.g. torchrun ...) with mimo_accel enabled in every Python "
                                     "process, from MIMO_ACCEL*, --config or --features",
                         usage="mimo-accel run [--config FILE] [--features WORDS] [key=value ...] -- COMMAND ...",
                         description="Run COMMAND with mimo_accel turned on in every Python process of the job "
                                     "(torchrun and each worker): each calls mimo_accel.enable() from the "
                                     "MIMO_ACCEL* variables before the script imports megatron.bridge (the startup "
                                     "hook of an install, or the bootstrap run puts first on PYTHONPATH). "
                                     "--config / --features / key=value set those variables for the job (they "
                                     "replace any already set); without them the job gets the current ones. "
                                     "Every MIMO_ACCEL* variable and path is checked first (paths are made absolute "
                                     "here), and with a feature on the "
                                     "command's Python (the program, or the interpreter its #! line names) is "
                                     "asked whether its bootstrap will enable mimo_accel: refused if not.",
                         epilog="e.g. mimo-accel run --config run.yaml pad_multiple=2 -- torchrun "
                                "--nproc-per-node 8 train.py")
    env = sub.add_parser("env", help="print the MIMO_ACCEL* variables that turn mimo_accel on in a job, for "
                                     "launchers that cannot wrap a command (sbatch, NeMo-Run, k8s)",
                         usage="mimo-accel env [--config FILE] [--features WORDS] [key=value ...] [--json]",
                         description="Print the MIMO_ACCEL* variables of the config as shell export lines (after "
                                     "a comment saying what the job turns on), or with --json as one JSON object "
                                     "for NeMo-Run's env_vars or a PyTorchJob's env. Paths are made absolute here. "
                                     "Nothing of this machine's install is printed: the job's Python needs "
                                     "mimo-accel installed, whose startup hook reads the variables.",
                         epilog='e.g. eval "$(mimo-accel env --config run.yaml)"; srun python train.py')
    env.add_argument("--json", action="store_true", help="one JSON object of the variables (NeMo-Run's env_vars)")
    for parser in (run, env):
        parser.add_argument("--config", metavar="FILE", help=_CONFIG_HELP)
        parser.add_argument("--features", metavar="WORDS", help=_FEATURES_HELP)
        parser.add_argument("overrides", nargs="*", metavar="key=value", help=_OVERRIDES_HELP)
    run.set_defaults(func=_run, command=[])
    env.set_defaults(func=_env)
    for name, (_, help_) in DELEGATED.items():
        dev = "; a development command: a checkout's make setup" if name in DEV_COMMANDS else ""
        sub.add_parser(name, help=help_ + f" (mimo-accel {name} --help{dev})")
    return one_line_errors(p)


def _subparser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return action.choices[name]


def main(argv: Optional[Sequence[str]] = None) -> int:
    from mimo_accel.config import ConfigError
    from mimo_accel.notices import own_lines
    from mimo_accel.tools.devkit import DevKitMissing, import_dev

    own_lines()  # what the tools log: one prefix, on stderr
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
