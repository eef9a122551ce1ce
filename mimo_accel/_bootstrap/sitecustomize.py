"""Put on PYTHONPATH by ``mimo-accel run``: every Python process of the job (torchrun and each of
its workers) enables mimo_accel from the MIMO_ACCEL* environment before the script imports
megatron.bridge, also where mimo_accel comes from a checkout on PYTHONPATH rather than an install
(an install's startup hook, ``mimo_accel.pth``, does the same; whichever runs first decides:
:mod:`mimo_accel._bootstrap.startup`). With MIMO_ACCEL unset or "0", nothing at all happens; nor in
an interpreter that cannot import mimo_accel (another environment that inherited the PYTHONPATH).
Any sitecustomize that was already on the path still runs (chained).

:data:`outcome` says what it did, so ``mimo-accel run`` can ask the command's own interpreter before
the job starts (``MIMO_ACCEL_BOOTSTRAP_PROBE``: decide, but stop short of enabling).
"""

import os
import sys

#: "off" (nothing asked for), "missing: torch" / "missing: mimo_accel" / "missing: mimo_accel, torch"
#: (an interpreter it leaves alone), else what mimo_accel._bootstrap.startup decided ("ready", "enabled", ...).
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
    from mimo_accel._bootstrap import startup

    outcome = startup.start("sitecustomize")


_enable_from_environment()
