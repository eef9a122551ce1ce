"""Every benchmark script still runs end to end on the code as it is now, at tiny sizes.

The figures they print live in docs/measurements.md; here only that each one runs to its end
(exit 0) and prints its result table, so a script that drifts from the APIs it drives fails
here. bench_balance is covered by tests/test_bench_balance.py and
bench_metrics by tests/test_metrics.py.
"""

from __future__ import annotations

import runpy
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# script, tiny arguments, a line of its result it must print; run in a process of its own: the index
# benchmark starts worker processes from its __main__
CASES = [
    pytest.param("bench_index.py", ["--parts", "manifest,mapped", "--manifest-files", "20", "--manifest-lines", "200",
                                    "--mapped", "20000", "--before", "5000", "--procs", "2", "--batches", "1",
                                    "--batch", "64"], "memory-mapped", id="index-mapped"),
]

# benchmarks that start ranks: imported under their own name (their rank functions pickle by it, and
# the ranks find it on the path they are given) and run here, so that no fresh interpreter imports
# Megatron again
RANKS = [
    pytest.param("bench_reads.py", ["--dp", "2", "--steps", "1"], "cluster", id="reads"),
    # the reference beside one of the benchmark's own plans (the shipped plan and the others take the same path)
    pytest.param("bench_loss_normalisation.py", ["--iters", "1", "--runs", "+ reorder (loss)"],
                 "+ reorder (loss)", id="loss-normalisation"),
]


@pytest.mark.parametrize("script, args, expect", CASES)
def test_benchmark_runs(script, args, expect):
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, f"{script} exited {proc.returncode}:\n{proc.stderr[-4000:]}"
    assert expect.lower() in proc.stdout.lower(), proc.stdout[-3000:]


@pytest.mark.distributed
@pytest.mark.parametrize("script, args, expect", RANKS)
def test_a_benchmark_that_starts_ranks_runs(script, args, expect, monkeypatch, capsys):
    import importlib

    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    bench = importlib.import_module(Path(script).stem)
    assert bench.main(args) in (0, None)
    assert expect.lower() in capsys.readouterr().out.lower()


def test_the_index_benchmark_runs(monkeypatch, capsys):
    # in this process: its time is importing Megatron Bridge, which the suite has done already
    monkeypatch.setattr(sys, "argv", ["bench_index.py", "--files", "4", "--samples", "60", "--ranks", "2"])
    with pytest.raises(SystemExit) as done:
        runpy.run_path(str(ROOT / "benchmarks" / "bench_index.py"), run_name="__main__")
    assert done.value.code in (0, None)
    out = capsys.readouterr().out
    assert "headers probed per second" in out and "extrapolated time" in out


# run in the test's process: their time would be importing torch and Megatron again
IN_PROCESS = [
    pytest.param("bench_packing.py", ["--steps", "1"], "THD packing", id="packing"),
    pytest.param("bench_step_plan.py", ["--steps", "1", "--micro-batches", "4", "--ratios", "1", "--workloads",
                                        "receipts", "--large-repeats", "1"], "mimo_accel over local search",
                 id="step-plan"),
    pytest.param("bench_profiler.py", ["--steps", "2", "--rounds", "1"], "profiler on", id="profiler"),
    pytest.param("bench_plan_check.py", ["--ranks", "8,64", "--windows", "3"], "store ops per window",
                 id="plan-check"),
    pytest.param("bench_calibration.py", ["--ranks", "8", "--steps", "12", "--work-s", "0.01"], "announcements",
                 id="calibration"),
    pytest.param("bench_plan_ahead.py", ["--windows", "2", "--layouts", "1:1,three", "--work-s", "0.01",
                                         "--samples", "256", "--groups", "32"], "same as serial", id="plan-ahead"),
    pytest.param("bench_identity.py", ["--rows", "300", "--files", "4", "--repeat", "1"],
                 "a dataset's identity at 300 rows", id="identity"),
]


def run_here(script: str, args: list, monkeypatch) -> None:
    """Run ``benchmarks/<script>`` as ``__main__`` in this process; it must end with exit code 0.
    The torch thread count a benchmark sets (--threads) is put back."""
    import torch

    threads = torch.get_num_threads()
    monkeypatch.setattr(sys, "argv", [script, *args])
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    try:
        runpy.run_path(str(ROOT / "benchmarks" / script), run_name="__main__")
        code = 0
    except SystemExit as done:
        code = done.code
    finally:
        torch.set_num_threads(threads)
    assert code in (0, None), f"{script} exited {code}"


@pytest.mark.parametrize("script, args, expect", IN_PROCESS)
def test_benchmark_runs_here(script, args, expect, monkeypatch, capsys):
    run_here(script, args, monkeypatch)
    assert expect.lower() in capsys.readouterr().out.lower()
