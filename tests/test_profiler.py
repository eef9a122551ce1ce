"""The per-rank recorder: timers on a real tiny encoder, the JSONL file, the loader, multi-rank."""

from __future__ import annotations

import datetime
import json
import multiprocessing
import socket
import threading

import pytest
import torch
import torch.multiprocessing as mp
from torch.utils.checkpoint import checkpoint

from mimo_accel import profiler
from mimo_accel.profiler import COUNTERS, FORMAT, NoProfileData, Recorder, attach_module_timer, read_run


def _encoder(width: int = 128, depth: int = 4) -> torch.nn.Module:
    torch.manual_seed(0)
    layers = [torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.GELU()) for _ in range(depth)]
    return torch.nn.Sequential(*layers)


def _recorder(tmp_path, **kw) -> Recorder:
    args = dict(
        rank=0,
        world_size=1,
        module="vision",
        dp_rank=0,
        dp_size=1,
        layout={"vision": {"tp": 1, "pp": 1, "dp": 1}},
        config={"balance": True},
        versions={"megatron_core": "0.19.2"},
        label="baseline",
        device="cpu",
    )
    args.update(kw)
    return Recorder(tmp_path, **args)


def _lines(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_records_encoder_forward_and_backward_and_flushes_each_step(tmp_path):
    enc, head = _encoder(), torch.nn.Linear(128, 1)
    rec = _recorder(tmp_path)
    timer = attach_module_timer(enc, rec, name="vision")
    for step in range(3):
        rec.begin_step()
        x = torch.randn(64, 128)
        out = enc(x)
        head(out).sum().backward()
        rec.add(samples=4, images=6, patches=64, tokens=300, samples_read=4, bytes_read=1000, bytes_exchanged=256)
        rec.add(samples=4)
        rec.set(predicted_spread=0.05, note="x")
        rec.end_step(step=10 + step)
        # flushed per step: readable while the recorder is still open
        lines = _lines(tmp_path / "rank0.jsonl")
        assert len(lines) == 2 + step
    timer.remove()

    header, *steps = _lines(tmp_path / "rank0.jsonl")
    assert header["kind"] == "header" and header["format"] == FORMAT
    for key, value in {
        "rank": 0, "world_size": 1, "module": "vision", "dp_rank": 0, "dp_size": 1,
        "layout": {"vision": {"tp": 1, "pp": 1, "dp": 1}}, "config": {"balance": True},
        "device": "cpu", "label": "baseline",
    }.items():
        assert header[key] == value, key
    assert header["versions"]["megatron_core"] == "0.19.2" and "torch" in header["versions"]
    assert header["clock"]["step"] == "wall" and header["clock"]["regions"] == rec._clock.name

    assert [s["step"] for s in steps] == [10, 11, 12]
    for s in steps:
        assert s["kind"] == "step"
        assert s["vision_fwd_s"] > 0 and s["vision_bwd_s"] > 0
        assert s["step_cpu_s"] >= s["vision_fwd_s"] + s["vision_bwd_s"]  # same clock, nested regions
        assert s["step_cpu_s"] is not None and s["step_cpu_s"] > 0
        assert s["timed_calls"] == {"vision_fwd": 1, "vision_bwd": 1}
        assert (s["samples"], s["images"], s["patches"], s["tokens"]) == (8, 6, 64, 300)
        assert (s["samples_read"], s["bytes_read"], s["bytes_exchanged"]) == (4, 1000, 256)
        assert s["predicted_spread"] == 0.05 and s["note"] == "x"
    rec.close()
    run = read_run(tmp_path)
    assert run.warnings == [] and len(run.ranks[0].steps) == 3


def test_backward_is_timed_when_the_gradient_arrives_from_outside(tmp_path):
    """The vision-rank shape: backward starts from the encoder output with a received gradient;
    no input requires grad (so register_full_backward_hook would fire immediately)."""
    enc = _encoder(256, 6)
    rec = _recorder(tmp_path, clock="thread_cpu")  # CPU time: immune to a busy machine's preemption
    clock = profiler.recorder.time.thread_time
    attach_module_timer(enc, rec)
    for _ in range(3):
        out = enc(torch.randn(256, 256))
        arrived: list[float] = []
        out.register_hook(lambda g, arrived=arrived: arrived.append(clock()))
        t0 = clock()
        torch.autograd.backward(out, grad_tensors=torch.ones_like(out))
        t1 = clock()
        step = rec.end_step()
        # the region runs from the output gradient's arrival to the end of the backward pass, not
        # just to the first hook (the first backward also pays the engine's start-up before that)
        assert 0.8 * (t1 - arrived[0]) - 2e-4 < step["vision_bwd_s"] <= (t1 - t0) + 1e-6


def test_untimed_step_writes_nulls_and_zero_counters(tmp_path):
    with _recorder(tmp_path) as rec:
        s = rec.end_step()
    assert s["vision_fwd_s"] is None and s["vision_bwd_s"] is None and s["predicted_spread"] is None
    assert all(s[c] == 0 for c in COUNTERS)
    assert s["step"] == 0


@pytest.mark.parametrize("mode", ["non_reentrant", "reentrant"])
def test_activation_checkpointing_counts_forward_once(tmp_path, mode):
    enc, head = _encoder(), torch.nn.Linear(128, 1)
    rec = _recorder(tmp_path)
    attach_module_timer(enc, rec)
    x = torch.randn(32, 128, requires_grad=True)
    out = checkpoint(enc, x, use_reentrant=(mode == "reentrant"))
    head(out).sum().backward()
    s = rec.end_step()
    assert s["timed_calls"] == {"vision_fwd": 1, "vision_bwd": 1}
    assert s["vision_fwd_s"] > 0 and s["vision_bwd_s"] > 0


def test_microbatches_sum_and_dict_outputs(tmp_path):
    class DictEnc(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(16, 16)

        def forward(self, x):
            return {"embeddings": self.lin(x), "aux": [x.sum()]}

    enc = DictEnc()
    rec = _recorder(tmp_path)
    timer = attach_module_timer(enc, rec)
    for _ in range(3):  # three micro-batches, three backward passes, one step
        enc(torch.randn(4, 16))["embeddings"].sum().backward()
    s = rec.end_step()
    assert s["timed_calls"] == {"vision_fwd": 3, "vision_bwd": 3}
    with torch.no_grad():
        enc(torch.randn(4, 16))
    assert rec.end_step()["timed_calls"] == {"vision_fwd": 1}
    timer.remove()
    enc(torch.randn(4, 16))["embeddings"].sum().backward()
    assert rec.end_step()["timed_calls"] == {}


def test_forward_exception_closes_the_region(tmp_path):
    class Boom(torch.nn.Module):
        def forward(self, x):
            raise RuntimeError("boom")

    rec = _recorder(tmp_path)
    attach_module_timer(Boom_ := Boom(), rec)
    with pytest.raises(RuntimeError, match="boom"):
        Boom_(torch.zeros(1))
    assert rec._open == {}
    assert rec.end_step()["timed_calls"] == {"vision_fwd": 1}


def test_regions_nest_carry_over_and_ignore_stray_stops(tmp_path):
    rec = _recorder(tmp_path, clock="wall")
    rec.stop("vision_fwd")  # stray: ignored
    with rec.time("vision_fwd"), rec.time("vision_fwd"):  # nested: counted once
        pass
    rec.start("data")  # left open across the step boundary
    s1 = rec.end_step()
    assert s1["timed_calls"] == {"vision_fwd": 1} and "data_s" not in s1
    rec.stop("data")
    s2 = rec.end_step()
    assert s2["data_s"] > 0 and s2["timed_calls"] == {"data": 1}


def test_non_finite_and_odd_values_stay_strict_json(tmp_path):
    import numpy as np

    rec = _recorder(tmp_path, config={"lr": float("inf"), "path": tmp_path, "ids": (1, 2)})
    rec.set(predicted_spread=float("nan"), extra={"x": np.float32(0.5), "y": np.float32("nan")})
    rec.end_step()
    rec.close()
    header, step = [json.loads(line, parse_constant=pytest.fail) for line in rec.path.read_text().splitlines()]
    assert header["config"] == {"lr": None, "path": str(tmp_path), "ids": [1, 2]}
    assert step["predicted_spread"] is None and step["extra"] == {"x": 0.5, "y": None}


def test_bad_arguments_are_refused(tmp_path):
    rec = _recorder(tmp_path)
    with pytest.raises(TypeError, match="unknown counter 'sample'"):
        rec.add(sample=1)
    with pytest.raises(ValueError, match="written by the recorder"):
        rec.set(step_time_s=1.0)
    with pytest.raises(ValueError, match="rank must be in"):
        _recorder(tmp_path, rank=2, world_size=2)
    with pytest.raises(ValueError, match="clock must be one of"):
        _recorder(tmp_path, clock="tsc")
    with pytest.raises(ValueError, match="needs device='cuda'"):
        _recorder(tmp_path, clock="cuda_event")


def test_stop_on_another_thread_falls_back_to_wall_time(tmp_path):
    rec = _recorder(tmp_path, clock="thread_cpu")
    rec.start("vision_bwd")
    t = threading.Thread(target=rec.stop, args=("vision_bwd",))
    t.start()
    t.join()
    s = rec.end_step()
    assert s["clock_fallbacks"] == 1 and s["vision_bwd_s"] > 0


def test_cpu_clock_choice_follows_intra_op_threads(tmp_path, monkeypatch):
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    assert _recorder(tmp_path)._clock.name == "thread_cpu"
    monkeypatch.setattr(torch, "get_num_threads", lambda: 4)
    assert _recorder(tmp_path)._clock.name == "process_cpu"


class _FakeEvent:
    syncs = 0

    def __init__(self, enable_timing=False):
        self.t = None

    def record(self):
        _FakeEvent.clock += 2.0
        self.t = _FakeEvent.clock

    def synchronize(self):
        _FakeEvent.syncs += 1

    def query(self):
        return True

    def elapsed_time(self, end):
        return end.t - self.t  # ms


def test_cuda_clock_resolves_lazily_with_one_sync_per_step(tmp_path, monkeypatch):
    _FakeEvent.clock, _FakeEvent.syncs = 0.0, 0
    monkeypatch.setattr(torch.cuda, "Event", _FakeEvent)
    rec = _recorder(tmp_path, device="cuda")
    assert rec.header["device"] == "cuda" and rec.header["clock"]["regions"] == "cuda_event"
    for _ in range(2):
        for _ in range(3):  # micro-batches
            rec.start("vision_fwd")
            rec.stop("vision_fwd")
            rec.start("vision_bwd")
            rec.stop("vision_bwd")
        before = _FakeEvent.syncs  # nothing synchronises before end_step
        s = rec.end_step()
        assert _FakeEvent.syncs == before + 1
        assert s["vision_fwd_s"] == pytest.approx(3 * 2.0 / 1e3)
        assert s["vision_bwd_s"] == pytest.approx(3 * 2.0 / 1e3)
        assert s["step_cpu_s"] >= 0
    assert len(rec._clock._pool) == 12  # events are reused


# ------------------------------------------------------------------------------------- loader


def _write_steps(tmp_path, rank=0, world_size=1, steps=3, **kw):
    rec = _recorder(tmp_path, rank=rank, world_size=world_size, clock="wall", **kw)
    for _ in range(steps):
        rec.add(samples=2)
        rec.end_step()
    rec.close()
    return rec.path


def test_partial_last_line_is_tolerated(tmp_path):
    path = _write_steps(tmp_path, steps=3)
    with open(path, "a") as f:
        f.write('{"kind": "step", "step": 3, "step_ti')  # killed mid-write
    run = read_run(tmp_path)
    assert len(run.ranks[0].steps) == 3
    assert len(run.warnings) == 1 and "incomplete" in run.warnings[0]


def test_corrupt_line_empty_file_missing_rank_and_restart(tmp_path):
    path = _write_steps(tmp_path, rank=0, world_size=4, steps=3)
    lines = path.read_text().splitlines()
    lines.insert(2, "not json")
    path.write_text("\n".join(lines) + "\n")
    (tmp_path / "rank1.jsonl").write_text("")
    # rank 2 restarted into the same file: steps 1-2 repeated
    rec = _recorder(tmp_path, rank=2, world_size=4, clock="wall")
    for _ in range(3):
        rec.end_step()
    rec.close()
    rec = _recorder(tmp_path, rank=2, world_size=4, clock="wall", append=True)
    rec.end_step(step=1)
    rec.end_step(step=2)
    rec.close()
    (tmp_path / "notes.txt").write_text("ignored")

    run = read_run(tmp_path)
    w = "\n".join(run.warnings)
    assert "rank 0: 1 unreadable line(s) in rank0.jsonl (line 3)" in w
    assert "rank 1: rank1.jsonl is empty" in w
    assert "rank 2: rank2.jsonl holds 2 headers" in w
    assert "ranks 1, 3 of world 4 missing" in w
    assert sorted(run.ranks) == [0, 2]
    assert [s["step"] for s in run.ranks[2].steps] == [0, 1, 2]
    assert run.world_size == 4


@pytest.mark.parametrize("setup", ["missing", "nofiles", "empty", "header_only"])
def test_no_data_at_all_is_an_error(tmp_path, setup):
    d = tmp_path / "run"
    if setup != "missing":
        d.mkdir()
    if setup == "empty":
        (d / "rank0.jsonl").write_text("")
    if setup == "header_only":
        _recorder(d).close()
    with pytest.raises(NoProfileData, match=str(d)):
        read_run(d)


# --------------------------------------------------------------------------------- multi-rank


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world_size: int, port: int, out_dir: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size,
        timeout=datetime.timedelta(seconds=60),
    )
    try:
        vision = rank < world_size // 2
        dp_size = world_size // 2
        rec = Recorder(
            out_dir, rank=rank, world_size=world_size, module="vision" if vision else "language",
            dp_rank=rank % dp_size, dp_size=dp_size,
            layout={"vision": {"tp": 1, "pp": 1, "dp": dp_size}, "language": {"tp": 1, "pp": 1, "dp": dp_size}},
            label="multi", device="cpu",
        )
        enc = _encoder(64, 2)
        if vision:
            attach_module_timer(enc, rec)
        for step in range(4):
            rec.begin_step()
            out = enc(torch.randn(8 * (1 + rank), 64))
            out.sum().backward()
            t = torch.ones(1)
            dist.all_reduce(t)  # the step ends together
            rec.add(samples=2, samples_read=2)
            rec.end_step(step)
        rec.close()
    finally:
        dist.destroy_process_group()


def test_multi_rank_processes_write_one_file_each(tmp_path):
    world = 4
    # forkserver with torch preloaded: torch is imported once, not once per rank (spawn), and no
    # rank inherits the test process's OpenMP state (fork).
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "mimo_accel.profiler"])
    mp.start_processes(
        _worker, args=(world, _free_port(), str(tmp_path)), nprocs=world, join=True, start_method="forkserver"
    )
    run = read_run(tmp_path)
    assert run.warnings == []
    assert sorted(run.ranks) == list(range(world)) and run.world_size == world
    for rank, log in run.ranks.items():
        assert [s["step"] for s in log.steps] == [0, 1, 2, 3]
        assert log.module == ("vision" if rank < 2 else "language")
        timed = log.steps[-1]["vision_fwd_s"]
        assert (timed is not None and timed > 0) if rank < 2 else timed is None
