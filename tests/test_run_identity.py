"""A profile knows its run: every rank of one run writes the same run id, two runs started alike get
different ones, and the report and calibrate refuse a directory that mixes runs (or take one by
``--run``). Files written before the id existed are read with one warning, or refused where their
clocks cannot be one run's."""

from __future__ import annotations

import datetime
import io
import json
import shutil
import socket

import pytest
from rich.console import Console

from mimo_accel.profiler.run import NO_RUN_ID, MixedRuns, UnknownRun, read_run
from mimo_accel.runtime.measuring.run_id import launcher_name, run_identity
from mimo_accel.tools import calibrate
from mimo_accel.tools.report import main as report
from tests.test_calibrate import write_module_run
from tests.test_report import write_run

EIGHT = {"vision": 4, "language": 4}  # ranks 0-3 vision, 4-7 language


def _console() -> Console:
    return Console(file=io.StringIO(), width=120)


def _two_runs(tmp_path):
    """Two runs of the same label, layout and features, the earlier one's rank 5 copied into the
    later one's directory (as a re-used output directory or a stray copy leaves it)."""
    early = write_module_run(tmp_path / "early", dps=EIGHT, seed=1, steps=8, run_id="slurm42.0-aaaa11112222")
    late = write_module_run(tmp_path / "late", dps=EIGHT, seed=2, steps=8, run_id="slurm42.0-bbbb33334444")
    shutil.copy(early / "rank5.jsonl", late / "rank5.jsonl")
    return early, late


def test_a_rank_file_of_another_run_is_refused_naming_the_files_of_each(tmp_path, capsys):
    _, late = _two_runs(tmp_path)
    with pytest.raises(MixedRuns) as err:
        read_run(late)
    message = str(err.value)
    assert ("holds the rank files of 2 runs: run slurm42.0-bbbb33334444 (rank0.jsonl to rank4.jsonl, rank6.jsonl, "
            "rank7.jsonl), run slurm42.0-aaaa11112222 (rank5.jsonl); report one with --run ID") in message
    for command in (report, calibrate.main):
        assert command([str(late)], console=_console()) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "error:" in err and "rank5.jsonl" in err and "--run ID" in err


def test_one_run_of_a_mixed_directory_is_taken_by_its_id(tmp_path, capsys):
    _, late = _two_runs(tmp_path)
    run = read_run(late, run="slurm42.0-bbbb")  # the start of the id names it alone
    assert run.run_id == "slurm42.0-bbbb33334444" and sorted(run.ranks) == [0, 1, 2, 3, 4, 6, 7]
    assert "run slurm42.0-bbbb33334444 only: left out rank5.jsonl" in run.warnings
    assert any("rank 5 of world 8 missing" in w for w in run.warnings)
    out = tmp_path / "r.json"
    assert report([str(late), "--run", "slurm42.0-bbbb33334444", "--json", str(out)], console=_console()) == 0
    doc = json.loads(out.read_text())
    assert doc["before"]["run_id"] == "slurm42.0-bbbb33334444"
    assert doc["before"]["ranks_present"] == [0, 1, 2, 3, 4, 6, 7]
    assert any("only 3 of 4 language DP replicas have data" in w for w in doc["warnings"])
    assert calibrate.main([str(late), "--run", "slurm42.0-aaaa"], console=_console()) == 0  # the other run: rank 5
    with pytest.raises(UnknownRun, match=r"--run slurm42 names several runs here; its runs: run slurm42.0-bbbb"):
        read_run(late, run="slurm42")
    assert report([str(late), "--run", "cccc"], console=_console()) == 2
    assert "--run cccc names none of them" in capsys.readouterr().err


def test_run_applies_to_the_directory_it_names_a_run_of(tmp_path):
    early, late = _two_runs(tmp_path)
    (early / "rank5.jsonl").unlink()  # early: one run (7 ranks); late: two
    out = tmp_path / "r.json"
    assert report([str(early), str(late), "--run", "slurm42.0-bbbb", "--json", str(out)], console=_console()) == 0
    doc = json.loads(out.read_text())
    assert doc["before"]["run_id"] == "slurm42.0-aaaa11112222" and doc["after"]["run_id"] == "slurm42.0-bbbb33334444"


def _old(directory, offsets: dict[int, float], steps=6, step_s=1.0):
    """Files without a run id (written before the recorder had one): 4 ranks whose step ``s`` ended
    at ``1000 + s·step_s + offsets[rank]`` seconds on their clock."""
    ranks = {r: {"module": "vision" if r < 2 else "language", "dp_rank": r % 2, "dp_size": 2,
                 "steps": [{"t": 1000.0 + s * step_s + offsets.get(r, 0.0) + 0.01 * r, "step_time_s": step_s,
                            "samples": 2} for s in range(steps)]}
             for r in range(4)}
    return write_run(directory, ranks, run_id=None)


def test_old_files_of_one_run_are_read_with_one_warning(tmp_path, capsys):
    run = read_run(_old(tmp_path / "old", {}))
    assert run.run_id is None and run.warnings.count(NO_RUN_ID) == 1
    assert report([str(tmp_path / "old")], console=_console()) == 0
    assert capsys.readouterr().err.count("carry no run id") == 1


def test_old_files_whose_clocks_cannot_be_one_run_are_refused(tmp_path):
    # rank 3's steps ended 77 s before the others' same steps: a copy from a run started earlier
    with pytest.raises(MixedRuns, match=r"the same steps ended on rank3\.jsonl, and on rank0\.jsonl to rank2\.jsonl "
                                        r"77 s later"):
        read_run(_old(tmp_path / "old", {3: -77.0}))
    # a rank a step behind the others is one run
    assert read_run(_old(tmp_path / "behind", {3: 1.0})).warnings.count(NO_RUN_ID) == 1


def test_an_old_file_among_files_with_a_run_id_is_refused(tmp_path):
    new = write_module_run(tmp_path / "new", dps={"vision": 2}, steps=4, run_id="r1")
    old = write_module_run(tmp_path / "old", dps={"vision": 2}, steps=4)
    shutil.copy(old / "rank1.jsonl", new / "rank1.jsonl")
    with pytest.raises(MixedRuns, match=r"run r1 \(rank0\.jsonl\), files without a run id \(rank1\.jsonl\)"):
        read_run(new)


# ------------------------------------------------------------------------- the id at run time


def test_the_launchers_name_for_a_run():
    assert launcher_name({"SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0", "TORCHELASTIC_RUN_ID": "x"}) == "slurm4242.0"
    assert launcher_name({"TORCHELASTIC_RUN_ID": "job7"}) == "job7"
    assert launcher_name({"TORCHELASTIC_RUN_ID": "none"}) is None  # torchrun's default: no name
    assert launcher_name({}) is None


def test_a_process_without_a_process_group_is_a_run_of_its_own():
    first, second = run_identity("p", {}), run_identity("p", {})
    assert first[1] == second[1] == "process" and first[0] != second[0]
    assert run_identity("p", {"TORCHELASTIC_RUN_ID": "job7"})[0].startswith("job7-")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(rank: int, world: int, port: int, out_dir: str) -> None:
    """One rank of a profiled run: the runtime's profiler makes its recorder (and so its header)."""
    import os

    import torch.distributed as dist

    from mimo_accel.config import AccelConfig
    from mimo_accel.runtime.measuring.profiling import Profiling
    from mimo_accel.runtime.state import Runtime

    os.environ["TORCHELASTIC_RUN_ID"] = "job7"  # a fixed --rdzv-id: the same for both runs
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    profiling = Profiling(Runtime(AccelConfig(profile=out_dir)))
    try:
        rec = profiling.recorder()
        for _ in range(2):
            rec.add(samples=1)
            rec.end_step()
        dist.barrier()
    finally:
        profiling.close()
        dist.destroy_process_group()


@pytest.mark.distributed  # four gloo ranks, twice
def test_every_rank_of_a_run_writes_one_id_and_two_runs_started_alike_get_two(tmp_path):
    import torch.multiprocessing as mp

    port, world = _free_port(), 4
    for name in ("first", "second"):  # back to back, the same port and environment
        mp.start_processes(_rank, args=(world, port, str(tmp_path / name)), nprocs=world, join=True,
                           start_method="forkserver")
    ids = {}
    for name in ("first", "second"):
        run = read_run(tmp_path / name)
        headers = [log.header for log in run.ranks.values()]
        assert len(headers) == world and {h["run_id"] for h in headers} == {run.run_id}
        assert {h["run_id_from"] for h in headers} == {"launcher+store"} and run.run_id.startswith("job7-")
        assert NO_RUN_ID not in run.warnings
        ids[name] = run.run_id
    assert ids["first"] != ids["second"]
    shutil.copy(tmp_path / "first" / "rank2.jsonl", tmp_path / "second" / "rank2.jsonl")
    with pytest.raises(MixedRuns, match=rf"run {ids['first']} \(rank2\.jsonl\)"):
        read_run(tmp_path / "second")


_TORCHRUN_RANK = """
import sys
import torch.distributed as dist
dist.init_process_group("gloo")
from mimo_accel.config import AccelConfig
from mimo_accel.runtime.measuring.profiling import Profiling
from mimo_accel.runtime.state import Runtime
profiling = Profiling(Runtime(AccelConfig(profile=sys.argv[1])))
rec = profiling.recorder()
rec.add(samples=1)
rec.end_step()
dist.barrier()
profiling.close()
dist.destroy_process_group()
"""


@pytest.mark.distributed  # torchrun, two ranks, twice
def test_under_torchrun_two_runs_of_one_command_get_two_ids(tmp_path):
    """torchrun's static rendezvous with the same port and no --rdzv-id (TORCHELASTIC_RUN_ID "none"):
    the workers share the agent's store, whose token tells the two runs apart."""
    import os
    import subprocess
    import sys

    script = tmp_path / "rank.py"
    script.write_text(_TORCHRUN_RANK)
    port = str(_free_port())
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "TORCHELASTIC_"))}
    ids = []
    for name in ("first", "second"):
        subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", port,
                        str(script), str(tmp_path / name)], check=True, env=env, timeout=180,
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        run = read_run(tmp_path / name, run=None)
        assert {(log.header["run_id"], log.header["run_id_from"]) for log in run.ranks.values()} == {
            (run.run_id, "store")} and len(run.ranks) == 2
        ids.append(run.run_id)
    assert ids[0] != ids[1]
