"""Put on PYTHONPATH by ``mimo-accel run``: every Python process of the job (torchrun and each of
its workers) enables mimo_accel from the MIMO_ACCEL* environment before the script imports
megatron.bridge. With MIMO_ACCEL unset or "0", nothing at all happens; neither in an interpreter
without torch or mimo_accel (another environment that inherited the PYTHONPATH). A bad setting
prints one ``mimo_accel: error: ...`` line and exits 2 before the script runs. Any sitecustomize
that was already on the path still runs (chained).

:data:`outcome` says what it did, so ``mimo-accel run`` can ask the command's own interpreter before
the job starts: with ``MIMO_ACCEL_BOOTSTRAP_PROBE`` set (only ever for that one question, never in
the job's environment) it decides as always but stops short of enabling.
"""

import os
import sys

PROBE_ENV = "MIMO_ACCEL_BOOTSTRAP_PROBE"
#: "off" (nothing asked for), "missing: torch" / "missing: mimo_accel" / "missing: mimo_accel, torch"
#: (an interpreter it leaves alone), "ready" (the probe: it would enable), "enabled".
outcome = None


def _chain_existing_sitecustomize() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    saved_path = list(sys.path)
    saved_module = sys.modules.pop("sitecustomize", None)
    try:
        sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
        import importlib

        try:
            importlib.import_module("sitecustomize")
        except ModuleNotFoundError as exc:
            if exc.name != "sitecustomize":
                raise
    finally:
        sys.path[:] = saved_path
        if saved_module is not None:
            sys.modules["sitecustomize"] = saved_module


_chain_existing_sitecustomize()


def _enable_from_environment() -> None:
    global outcome
    if os.environ.get("MIMO_ACCEL", "").strip().lower() in ("", "0", "off", "none", "false") and \
            not os.environ.get("MIMO_ACCEL_PROFILE"):
        outcome = "off"
        return  # nothing asked for: nothing at all happens
    import importlib.util

    # An interpreter of another environment that inherited the job's PYTHONPATH (a tool the job
    # runs, a system python): without torch or mimo_accel there is nothing to enable; leave it alone.
    missing = [name for name in ("mimo_accel", "torch") if importlib.util.find_spec(name) is None]
    if missing:
        outcome = "missing: " + ", ".join(missing)
        return
    if os.environ.get(PROBE_ENV):
        outcome = "ready"
        return
    try:
        import mimo_accel

        mimo_accel.enable()  # reads MIMO_ACCEL*
        outcome = "enabled"
    except Exception as exc:
        # A bad setting must stop the job at startup, with one line. Not SystemExit: raised from
        # sitecustomize it is a "Fatal Python error: init_import_site" and a traceback.
        message = " ".join(str(exc).split()) or type(exc).__name__
        try:
            sys.stdout.flush()
        except Exception:
            pass
        argv = " ".join(getattr(sys, "argv", None) or [sys.executable])
        sys.stderr.write(f"mimo_accel: error: {message} (at the start of pid {os.getpid()}: {argv[:120]})\n")
        sys.stderr.flush()
        os._exit(2)


_enable_from_environment()
