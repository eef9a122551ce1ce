"""Put on PYTHONPATH by ``mimo-accel run``: every Python process of the job (torchrun and each of
its workers) enables mimo_accel from the MIMO_ACCEL* environment before the script imports
megatron.bridge. With MIMO_ACCEL unset or "0", nothing at all happens. Any sitecustomize that was
already on the path still runs (chained).
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

if os.environ.get("MIMO_ACCEL", "").strip().lower() not in ("", "0", "off", "none", "false") or \
        os.environ.get("MIMO_ACCEL_PROFILE"):
    import mimo_accel

    try:
        mimo_accel.enable()  # reads MIMO_ACCEL*
    except Exception as exc:
        # site.py would print and carry on; a bad setting must stop the job at startup instead.
        print(f"mimo-accel: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
