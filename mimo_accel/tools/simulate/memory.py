"""Whether a simulation fits in this machine's memory, told before anything is allocated."""

from __future__ import annotations

import os

from mimo_accel.costs import CostModel
from mimo_accel.tools.simulate.inputs import sample_costs
from mimo_accel.workloads import Profile


class TooLarge(ValueError):
    """The simulation would not fit in this machine's memory (raised before anything is allocated)."""


_MEASURED_SAMPLES = 1 << 16  # drawn once to price a sample's memory (tens of milliseconds)
_ALWAYS_FITS = 1 << 20  # below this many samples nothing is measured: a few hundred MB at most


def available_memory() -> int | None:
    """Bytes of memory available to a new allocation (MemAvailable; else the physical memory)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _gib(n: float) -> str:
    return f"{n / 2**30:,.1f} GiB"


def check_memory(profile: Profile, model: CostModel, micro_batches: int, per_micro_batch: int) -> None:
    """TooLarge, saying how much, where drawing ``micro_batches x per_micro_batch`` samples would not
    fit in the memory available. A sample's memory is measured on a small draw of the same profile
    and model (tracemalloc's peak: the table, its cost index and every module's costs), so it
    follows what a profile draws; planning one micro-batch takes about as much again per sample of
    it (RSS at 1, 2 and 4 micro-batches of 1.6 M receipts samples: within 10 % of the estimate)."""
    n = micro_batches * per_micro_batch
    if n + per_micro_batch <= _ALWAYS_FITS:
        return
    import tracemalloc

    was_tracing = tracemalloc.is_tracing()
    if not was_tracing:
        tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        start = tracemalloc.get_traced_memory()[0]
        sample_costs(profile.sample_table(_MEASURED_SAMPLES, 0).cost_index(), model, profile.modules)
        per_sample = (tracemalloc.get_traced_memory()[1] - start) / _MEASURED_SAMPLES
    finally:
        if not was_tracing:
            tracemalloc.stop()
    need, available = per_sample * (n + per_micro_batch), available_memory()
    if available is not None and need > available:
        batches = f"{micro_batches:,} micro-batch{'es' if micro_batches != 1 else ''} of {per_micro_batch:,}"
        raise TooLarge(f"the simulation needs about {_gib(need)} of memory for its {n:,} samples ({batches}, about "
                       f"{per_sample:,.0f} bytes each), and {_gib(available)} is available; give a smaller "
                       "--per-replica, fewer --steps (or a smaller --reorder-window), or smaller --dp sizes")
