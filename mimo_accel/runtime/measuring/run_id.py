"""The run id every rank of one run writes in its profile header, so that the report and calibrate
can tell one run's rank files from another's (a file copied from an earlier run, a directory
written twice).

Every rank comes to the same id without a collective, from what the ranks already share:

- the launcher's names for the run, for a reader: Slurm's ``SLURM_JOB_ID`` / ``SLURM_STEP_ID``,
  else torchrun's ``TORCHELASTIC_RUN_ID`` unless it is its default ``none``. These repeat across
  runs (a fixed ``--rdzv-id``; two torchrun commands in one Slurm job step), so they are a prefix;
- the rendezvous store every rank joined (the default process group's): the first rank to make
  its recorder sets a fresh random token under a key of mimo_accel's namespace with one
  compare-and-set, and every other rank's compare-and-set reads that token back. No rank waits for
  another, and a new run (a new store) gets a new token even with the same launcher settings.

A process without a process group is a run of one rank: its own token.
"""

from __future__ import annotations

import hashlib
import os
import secrets
from typing import Optional

from mimo_accel.runtime.store import default_store, next_round, store_key

_TORCHRUN_DEFAULT = "none"  # TORCHELASTIC_RUN_ID when torchrun is given no --rdzv-id


def launcher_name(environ=os.environ) -> Optional[str]:
    """The launcher's name for this run, shared by every rank: ``slurm<job>.<step>``, or torchrun's
    run id; None where neither is set."""
    job = environ.get("SLURM_JOB_ID")
    if job:
        step = environ.get("SLURM_STEP_ID")
        return f"slurm{job}" + (f".{step}" if step else "")
    elastic = environ.get("TORCHELASTIC_RUN_ID")
    if elastic and elastic != _TORCHRUN_DEFAULT:
        return elastic
    return None


def _store_token(profile: str) -> Optional[str]:
    """The token the first rank set for this run's profile directory in the job's store (set here if
    this rank is the first); None without a process group or where the store cannot be reached."""
    import torch.distributed as dist

    if not dist.is_initialized():
        return None
    try:
        store = default_store()
        # a count per profile setting: a second profiled run in the same process group (the same
        # store) is a new run, and every rank counts its runs alike
        digest = hashlib.sha256(profile.encode()).hexdigest()[:16]
        key = store_key("run_id", digest, next_round(("run_id", profile)))
        token = store.compare_set(key, "", secrets.token_hex(6))
    except Exception:  # noqa: BLE001 - a store without compare_set, or one that went away: no token
        return None
    return token.decode() if isinstance(token, bytes) else str(token)


def run_identity(profile: str, environ=os.environ) -> tuple[Optional[str], str]:
    """``(run_id, what it comes from)`` for this rank's profile header: the launcher's name and the
    store's token (``slurm4242.0-3f9c2a1b7d0e``), the token alone, or the launcher's name alone
    where the store cannot be reached (then two runs of one launcher setting share it, said by
    ``from``: ``launcher``); ``(None, "none")`` with neither in a run of several ranks."""
    import torch.distributed as dist

    name = launcher_name(environ)
    token = _store_token(profile)
    if token is None and not (dist.is_initialized() and dist.get_world_size() > 1):
        return "-".join(p for p in (name, secrets.token_hex(6)) if p), "process"
    if token is None:
        return (name, "launcher") if name else (None, "none")
    return "-".join(p for p in (name, token) if p), ("launcher+store" if name else "store")
