"""mimo_accel turned on from the ``MIMO_ACCEL*`` environment when a Python process starts, once.

Two ways in, one decision (:func:`start`):

- ``mimo_accel.pth``, the startup hook pip installs into site-packages with the package: every
  Python process of that environment. While no ``MIMO_ACCEL`` / ``MIMO_ACCEL_PROFILE`` is set it
  reads two variables and imports nothing. Else it waits for the end of the interpreter's site
  set-up (:func:`at_interpreter_start`): a site directory processed after this one (a venv's
  system site-packages, where a container keeps torch and Megatron) is then on ``sys.path`` too.
- the sitecustomize ``mimo-accel run`` puts on PYTHONPATH (``_bootstrap/sitecustomize.py``), for a
  Python that imports mimo_accel from a checkout on PYTHONPATH rather than from an install.

Whichever comes first decides; the other finds :data:`outcome` set and does nothing (never two
enables). The ``mimo-accel`` command itself is left alone: it reads the variables to check them, and
must report a bad one as its own error. A bad setting prints one ``mimo_accel: error: ...`` line and
exits 2 before the script runs.
"""

import os
import sys

# Set by `mimo-accel run` only for its question to the job's Python, never in the job: decide as
# always, but stop short of enabling (mimo_accel/tools/job_python.py).
PROBE_ENV = "MIMO_ACCEL_BOOTSTRAP_PROBE"

#: None (not decided yet), "off" (nothing asked for), "skipped: ..." (the mimo-accel command),
#: "missing: torch" (an interpreter it leaves alone), "ready" (the probe: it would enable), "enabled".
outcome = None
#: which way in decided: "mimo_accel.pth" or "sitecustomize"
decided_by = None


def asked(environ=None) -> bool:
    """Whether the environment asks for anything (a feature word, or a profile directory)."""
    from mimo_accel.config import ENV_FEATURES, ENV_PROFILE, OFF_WORDS

    env = os.environ if environ is None else environ
    return env.get(ENV_FEATURES, "").strip().lower() not in OFF_WORDS or bool(env.get(ENV_PROFILE))


def _is_the_command() -> bool:
    """Whether this process is ``mimo-accel`` (the console script, or ``python -m mimo_accel``)."""
    argv = getattr(sys, "argv", None) or []
    if argv and os.path.basename(argv[0]) == "mimo-accel":
        return True
    orig = list(getattr(sys, "orig_argv", None) or [])
    return "-m" in orig and orig[orig.index("-m") + 1:orig.index("-m") + 2] == ["mimo_accel"]


def start(via: str) -> str:
    """Decide, once per process, and enable mimo_accel from the environment where it is asked for."""
    global outcome, decided_by
    if outcome is not None:
        return outcome
    decided_by = via
    if not asked():
        outcome = "off"
    elif _is_the_command():
        outcome = "skipped: the mimo-accel command"
    else:
        import importlib.util

        # an interpreter without torch (a tool of another environment) has nothing to enable
        if importlib.util.find_spec("torch") is None:
            outcome = "missing: torch"
        elif os.environ.get(PROBE_ENV):
            outcome = "ready"
        else:
            outcome = "enabling"
            _enable()
            outcome = "enabled"
    return outcome


def _enable() -> None:
    try:
        import mimo_accel

        mimo_accel.enable()  # reads MIMO_ACCEL*
    except Exception as exc:
        # A bad setting must stop the job at startup, with one line. Not SystemExit: raised during
        # site set-up it is a "Fatal Python error: init_import_site" and a traceback.
        message = " ".join(str(exc).split()) or type(exc).__name__
        try:
            sys.stdout.flush()
        except Exception:
            pass
        argv = " ".join(getattr(sys, "argv", None) or [sys.executable])
        sys.stderr.write(f"mimo_accel: error: {message} (at the start of pid {os.getpid()}: {argv[:120]})\n")
        sys.stderr.flush()
        os._exit(2)


class _AtSiteEnd:
    """A meta-path entry that finds nothing: at site's ``import sitecustomize``, which comes after
    every site directory is on ``sys.path``, it takes itself out and starts mimo_accel."""

    @classmethod
    def find_spec(cls, fullname, path=None, target=None):
        if fullname in ("sitecustomize", "usercustomize"):
            cls.remove()
            start("mimo_accel.pth")
        return None

    @classmethod
    def remove(cls) -> None:
        while cls in sys.meta_path:
            sys.meta_path.remove(cls)


def at_interpreter_start() -> None:
    """The startup hook's entry (``mimo_accel.pth``): start at the end of site's set-up."""
    if outcome is None and _AtSiteEnd not in sys.meta_path:
        sys.meta_path.insert(0, _AtSiteEnd)


def installed_hook():
    """Where this interpreter's startup hook is (a ``mimo_accel.pth`` in a site directory on
    ``sys.path``), or None: then only ``enable()`` or ``mimo-accel run`` turn mimo_accel on here."""
    from pathlib import Path

    for entry in sys.path:
        hook = Path(entry or os.curdir) / "mimo_accel.pth"
        if hook.is_file():
            return hook
    return None
