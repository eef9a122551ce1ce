"""The rehearsal's ranks fault their memory pool in before the measured steps
(:func:`mimo_accel_dev.rehearse.rehearsal.warm_memory_pool`): the steps after it allocate from
pages already in, so no step pays the page faults of growing its working set on the timed thread
(what decided the demo's first steps: docs/measurements.md). Counted in the kernel's minor page
faults of a fresh process (its own: the pool's settings are process-wide), not in seconds."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import ctypes, ctypes.util, resource, sys
from mimo_accel_dev.rehearse import rehearsal
rehearsal._keep_freed_memory()
if sys.argv[1] == "warm":
    rehearsal.warm_memory_pool(64)
libc = ctypes.CDLL(ctypes.util.find_library("c"))
libc.malloc.restype = ctypes.c_void_p
libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for block in [libc.malloc(16 << 20) for _ in range(3)]:  # a step's new 48 MiB, written
    libc.memset(block, 2, 16 << 20)
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(mode: str) -> int:
    out = subprocess.run([sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True, timeout=60, check=True)
    return int(out.stdout.strip())


def test_a_step_after_the_warm_pool_faults_no_memory_in():
    pages = 3 * (16 << 20) // 4096
    cold, warm = _faults("cold"), _faults("warm")
    assert cold >= 0.9 * pages  # without it, every page of the step's new memory is faulted in there
    assert warm <= 0.01 * pages
