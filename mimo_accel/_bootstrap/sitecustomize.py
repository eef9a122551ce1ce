"""Put on PYTHONPATH by ``mimo-accel run``: every Python process of the job (torchrun and each of
its workers) enables mimo_accel from the MIMO_ACCEL* environment before the script imports
megatron.bridge. With MIMO_ACCEL unset or "0", nothing at all happens; neither in an interpreter
without torch or mimo_accel (another environment that inherited the PYTHONPATH). A bad setting
prints one ``mimo_accel: error: ...`` line and exits 2 before the script runs. Any sitecustomize
that was already on the path still runs (chained).
"""

import os
import sys


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
    if os.environ.get("MIMO_ACCEL", "").strip().lower() in ("", "0", "off", "none", "false") and \
            not os.environ.get("MIMO_ACCEL_PROFILE"):
        return  # nothing asked for: nothing at all happens
    import importlib.util

    # An interpreter of another environment that inherited the job's PYTHONPATH (a tool the job
    # runs, a system python): without torch or mimo_accel there is nothing to enable; leave it alone.
    if importlib.util.find_spec("torch") is None or importlib.util.find_spec("mimo_accel") is None:
        return
    try:
        import mimo_accel

        mimo_accel.enable()  # reads MIMO_ACCEL*
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
