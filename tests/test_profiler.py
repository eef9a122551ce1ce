"""The per-rank recorder: timers on a real tiny encoder, the JSONL file, the loader, multi-rank."""

from __future__ import annotations

import datetime
import json
import socket
import threading

import pytest
import torch
import torch.multiprocessing as mp
from torch.utils.checkpoint import checkpoint

from mimo_accel import profiler
from mimo_accel.profiler import COUNTERS, FORMAT, Recorder, attach_module_timer
from mimo_accel.profiler.run import NoProfileData, ProfileError, read_run


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
        rec.add(samples=4, vision_items=6, vision_rows=64, tokens=300, samples_read=4, bytes_read=1000,
                bytes_exchanged=256)
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
        assert (s["samples"], s["vision_items"], s["vision_rows"], s["tokens"]) == (8, 6, 64, 300)
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
    with _recorder(tmp_path, regions=("vision_fwd", "vision_bwd"), counters=("vision_items",)) as rec:
        s = rec.end_step()
    assert rec.header["regions"] == ["vision_fwd", "vision_bwd"] and "vision_items" in rec.header["counters"]
    assert s["vision_fwd_s"] is None and s["vision_bwd_s"] is None and s["predicted_spread"] is None
    assert all(s[c] == 0 for c in COUNTERS) and s["vision_items"] == 0
    assert s["step"] == 0
    # a region nobody declared is in no line
    with _recorder(tmp_path) as rec:
        s = rec.end_step()
    assert "vision_fwd_s" not in s and rec.header["regions"] == []


def test_regions_and_module_counters_are_dynamic(tmp_path):
    """Any module's regions and an encoder's counters: a timer declares its regions when it is
    attached, a module counter is written from the step it was first added in (0 after)."""
    rec = _recorder(tmp_path, module="language", clock="wall")
    rec.end_step()  # before anything was attached
    lm = torch.nn.Linear(8, 8)
    attach_module_timer(lm, rec, name="language")
    lm(torch.randn(2, 8)).sum().backward()
    rec.add(audios_items=3, audios_rows=4500, audios_sq_rows=3 * 1500**2, sq_tokens=25)
    timed = rec.end_step()
    idle = rec.end_step()
    rec.close()
    assert timed["language_fwd_s"] > 0 and timed["language_bwd_s"] > 0
    assert (timed["audios_items"], timed["audios_rows"], timed["audios_sq_rows"], timed["sq_tokens"]) == \
        (3, 4500, 3 * 1500**2, 25)
    assert idle["language_fwd_s"] is None and idle["audios_items"] == 0 and idle["timed_calls"] == {}
    with pytest.raises(ValueError, match="written by the recorder"):
        rec.set(audios_rows=1)
    with pytest.raises(ValueError, match="written by the recorder"):
        rec.set(language_bwd_s=1.0)
    first, *_ = read_run(tmp_path).ranks[0].steps
    assert "language_fwd_s" not in first and "audios_items" not in first
    assert read_run(tmp_path).ranks[0].regions == ("language_fwd", "language_bwd")


def test_a_timer_skips_the_forwards_its_predicate_refuses(tmp_path):
    rec = _recorder(tmp_path)
    enc = _encoder(16, 1)
    attach_module_timer(enc, rec, name="language", skip=lambda: not torch.is_grad_enabled())
    with torch.no_grad():
        enc(torch.randn(2, 16))
    assert rec.end_step()["timed_calls"] == {}
    enc(torch.randn(2, 16)).sum().backward()
    assert rec.end_step()["timed_calls"] == {"language_fwd": 1, "language_bwd": 1}


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
    # each micro-batch's time, in the line, summing to the region's total
    assert [len(s["micro"][r]) for r in ("vision_fwd", "vision_bwd")] == [3, 3]
    for r in ("vision_fwd", "vision_bwd"):
        assert all(t > 0 for t in s["micro"][r]) and sum(s["micro"][r]) == pytest.approx(s[f"{r}_s"], rel=1e-12)
    assert _lines(rec.path)[-1]["micro"] == s["micro"]  # written to the file as returned
    with torch.no_grad():
        enc(torch.randn(4, 16))
    assert rec.end_step()["timed_calls"] == {"vision_fwd": 1}
    timer.remove()
    enc(torch.randn(4, 16))["embeddings"].sum().backward()
    last = rec.end_step()
    assert last["timed_calls"] == {} and "micro" not in last


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


def test_per_forward_counts_ride_beside_per_forward_times(tmp_path):
    with Recorder(tmp_path, rank=0, world_size=1, module="vision") as rec:
        for rows in (10, 30):
            with rec.time("vision_fwd"):
                pass
            rec.add_micro(vision_rows=rows, vision_items=1)
        line = rec.end_step()
        assert line["micro"]["vision_rows"] == [10, 30] and line["micro"]["vision_items"] == [1, 1]
        assert len(line["micro"]["vision_fwd"]) == 2
        assert "vision_rows" not in rec.end_step().get("micro", {})  # per step, not carried over
        for bad in ({"samples": 1}, {"vision_bytes": 1}):  # a step counter, or not a counter at all
            with pytest.raises(TypeError, match="add_micro takes"):
                rec.add_micro(**bad)


def test_bad_arguments_are_refused(tmp_path):
    rec = _recorder(tmp_path)
    with pytest.raises(TypeError, match="unknown counter 'sample'"):
        rec.add(sample=1)
    with pytest.raises(TypeError, match="unknown counter '_rows'"):
        rec.add(_rows=1)
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
        # resolved at end_step, each micro-batch's event pair kept in call order
        assert s["micro"] == {"vision_fwd": [pytest.approx(2e-3)] * 3, "vision_bwd": [pytest.approx(2e-3)] * 3}
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
        from mimo_accel.runtime.measuring.run_id import run_identity

        vision = rank < world_size // 2
        dp_size = world_size // 2
        run_id, run_id_from = run_identity(out_dir)
        rec = Recorder(
            out_dir, rank=rank, world_size=world_size, module="vision" if vision else "language",
            dp_rank=rank % dp_size, dp_size=dp_size,
            layout={"vision": {"tp": 1, "pp": 1, "dp": dp_size}, "language": {"tp": 1, "pp": 1, "dp": dp_size}},
            label="multi", device="cpu", run_id=run_id, run_id_from=run_id_from,
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


@pytest.mark.distributed  # four gloo ranks in processes of their own
def test_multi_rank_processes_write_one_file_each(tmp_path):
    world = 4
    # the suite's forkserver (its preload, torch and megatron, set in conftest): torch is imported
    # once, not once per rank (spawn), and no rank inherits the test process's OpenMP state (fork)
    mp.start_processes(
        _worker, args=(world, _free_port(), str(tmp_path)), nprocs=world, join=True, start_method="forkserver"
    )
    run = read_run(tmp_path)
    assert run.warnings == [] and run.run_id is not None  # one run id on every rank
    assert sorted(run.ranks) == list(range(world)) and run.world_size == world
    for rank, log in run.ranks.items():
        assert [s["step"] for s in log.steps] == [0, 1, 2, 3]
        assert log.module == ("vision" if rank < 2 else "language")
        timed = log.steps[-1].get("vision_fwd_s")
        assert (timed is not None and timed > 0) if rank < 2 else timed is None


# ------------------------------------------------------------------------------------ formats


def _v1_file(path, rank, module, steps, world_size=2, dp_rank=0, dp_size=1):
    """A rank file of format 1 (before per-module timing), which the reader refuses."""
    header = {"kind": "header", "format": profiler.FORMAT_V1, "rank": rank, "world_size": world_size,
              "module": module, "dp_rank": dp_rank, "dp_size": dp_size, "layout": {}, "versions": {},
              "config": {}, "device": "cpu", "label": "old", "clock": {"step": "wall", "regions": "thread_cpu"}}
    lines = [header]
    for i, (fwd, bwd) in enumerate(steps):
        lines.append({"kind": "step", "step": i, "step_time_s": 1.0, "step_cpu_s": None, "vision_fwd_s": fwd,
                      "vision_bwd_s": bwd, "samples": 2, "images": 2, "patches": 64, "sq_patches": 2048,
                      "tokens": 40, "samples_read": 2, "bytes_read": 0, "bytes_exchanged": 0,
                      "predicted_spread": None,
                      "timed_calls": {"vision_fwd": 1, "vision_bwd": 1} if fwd is not None else {}})
    path.mkdir(parents=True, exist_ok=True)
    (path / f"rank{rank}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))


def test_a_format_1_file_is_refused_naming_the_rerun(tmp_path):
    _v1_file(tmp_path, 0, "images", [(0.1, 0.2)] * 3)
    with pytest.raises(ProfileError) as err:
        read_run(tmp_path)
    assert str(err.value) == (f"{tmp_path / 'rank0.jsonl'}: profile format 'mimo-accel-profile/1' is no longer read; "
                              "rerun the job with --profile to record format 'mimo-accel-profile/2'")


def test_a_format_2_encoder_is_read_under_its_own_name(tmp_path):
    rec = _recorder(tmp_path, module="audios", regions=profiler.module_regions("audios"), clock="wall")
    with rec.time("audios_fwd"):
        pass
    rec.end_step()
    rec.close()
    log = read_run(tmp_path).ranks[0]
    assert log.format == FORMAT and log.module_regions == ("audios_fwd", "audios_bwd")
    assert profiler.module_seconds(log.steps[0], log.module_regions) >= 0


# ---------------------------------------------- the profiler's hooks on real MIMO submodules


class _Patches(torch.nn.Module):
    """A patch-packed encoder (Qwen-VL's call shape): rows of patches and one (t, h, w) per image."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(6, 4)

    def forward(self, hidden_states, grid_thw):
        return self.lin(hidden_states)


class _Clips(torch.nn.Module):
    """An audio-like encoder: (clips, mel bins, frames) in, (clips, frames // 2, hidden) out."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 4)

    def forward(self, input_features):
        return self.lin(input_features.transpose(1, 2)[:, ::2])


def _profiling(tmp_path, module: str, dp_sizes: dict, dp_rank: int = 0):
    from mimo_accel.config import AccelConfig
    from mimo_accel.runtime.measuring.profiling import Profiling
    from mimo_accel.runtime.context import ShardContext
    from mimo_accel.runtime.state import Runtime

    runtime = Runtime(AccelConfig(profile=str(tmp_path)))
    runtime.context = ShardContext(module, dp_rank, dp_sizes[module], 1, dp_sizes=dp_sizes)
    runtime.profiling = Profiling(runtime)
    return runtime


def test_each_module_is_timed_and_counted_under_its_own_name(tmp_path):
    """Real megatron-core ModalitySubmodules (vision and audio) under the real encode hook, a
    language model timed through saw_model, a no_grad evaluation pass between the steps: one
    process plays the three roles (one Recorder file: the unit under test is the hooks)."""
    import warnings
    from types import SimpleNamespace

    from megatron.core.models.mimo.submodules.audio import AudioModalitySubmodules
    from megatron.core.models.mimo.submodules.base import ModalitySubmodules
    from megatron.core.models.mimo.submodules.vision import VisionModalitySubmodules

    from mimo_accel.runtime.patches.profiler import wrap_encode

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "ModalitySubmodules is experimental"
        images = VisionModalitySubmodules(encoders={"vit": _Patches()})
        audios = AudioModalitySubmodules(encoders={"whisper": _Clips()})
    runtime = _profiling(tmp_path, "images", {"images": 1, "audios": 1, "language": 1})
    lm = torch.nn.Linear(4, 1)
    model = SimpleNamespace(modality_submodules={"images": images, "audios": audios}, language_model=lm)
    runtime.profiling.saw_model(model)
    runtime.profiling.saw_model(model)  # once per model: the second look changes nothing
    encode = wrap_encode(ModalitySubmodules.encode, runtime)
    grid = torch.tensor([[1, 2, 4], [1, 4, 4]])  # 8 and 16 patches
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1], [1, 0, 0, 0]])
    for _ in range(2):
        for _ in range(2):  # two micro-batches per step
            vis = encode(images, {"vit": {"hidden_states": torch.randn(24, 6), "grid_thw": grid}})
            aud = encode(audios, {"whisper": {"input_features": torch.randn(3, 8, 10)}})
            lm(torch.cat([vis[0], aud[0]])).sum().backward()
            runtime.profiling.record_batch({"input_ids": torch.zeros(3, 4, dtype=torch.long),
                                            "attention_mask": mask}, read_samples=3)
        with torch.no_grad():  # evaluation: in no step line
            encode(images, {"vit": {"hidden_states": torch.randn(24, 6), "grid_thw": grid}})
            encode(audios, {"whisper": {"input_features": torch.randn(5, 8, 10)}})
            lm(torch.randn(3, 4))
            runtime.profiling.record_batch({"input_ids": torch.zeros(3, 4, dtype=torch.long),
                                            "attention_mask": mask}, read_samples=3)
        runtime.profiling.end_step()
    runtime.close()

    log = read_run(tmp_path).ranks[0]
    assert log.header["regions"] == ["images_fwd", "images_bwd"]  # this rank's own module, declared
    for s in log.steps:
        assert s["timed_calls"] == {f"{m}_{p}": 2 for m in ("images", "audios", "language") for p in ("fwd", "bwd")}
        assert all(s[f"{m}_{p}_s"] > 0 for m in ("images", "audios", "language") for p in ("fwd", "bwd"))
        # images: 2 per micro-batch, 8 + 16 patches; no counter of another name beside them
        assert (s["images_items"], s["images_rows"], s["images_sq_rows"]) == (4, 48, 2 * (64 + 256))
        assert not {"images", "patches", "sq_patches"} & set(s)
        # audios: 3 clips per micro-batch, 5 output rows each (10 frames, every second one)
        assert (s["audios_items"], s["audios_rows"], s["audios_sq_rows"]) == (6, 30, 6 * 25)
        # language: real tokens L = 3, 4, 1 per micro-batch
        assert (s["tokens"], s["sq_tokens"], s["samples_read"]) == (16, 2 * (9 + 16 + 1), 6)
        # each forward's counts beside its time, one a micro-batch, in call order
        assert s["micro"]["images_rows"] == [24, 24] and s["micro"]["images_sq_rows"] == [320, 320]
        assert s["micro"]["audios_items"] == [3, 3] and len(s["micro"]["audios_fwd"]) == 2


def test_what_an_encoder_counts():
    from mimo_accel.runtime.measuring.profiling import encoder_counts

    def ints(c):
        return tuple(int(v) for v in c)

    grid = torch.tensor([[2, 4, 6]])
    assert ints(encoder_counts({"x": torch.zeros(48, 3), "grid_thw": grid})) == (1, 48, 48 * 48)
    assert ints(encoder_counts({"x": torch.zeros(0, 3), "grid_thw": torch.zeros(0, 3, dtype=torch.long)})) == (0, 0, 0)
    clips = {"input_features": torch.zeros(2, 80, 3000)}
    assert ints(encoder_counts(clips, torch.zeros(2, 1500, 16))) == (2, 3000, 2 * 1500**2)  # output rows
    assert ints(encoder_counts(clips, (torch.zeros(2, 1500, 16), None))) == (2, 3000, 2 * 1500**2)
    assert ints(encoder_counts({"x": torch.zeros(1, 80, 3000)}, torch.zeros(700, 16))) == (1, 700, 700**2)
    # a flat output of several clips: the input's time length, from a mask where there is one
    masked = {"input_features": torch.zeros(2, 80, 6), "feature_attention_mask": torch.tensor([[1] * 6, [1] * 2 + [0] * 4])}
    assert ints(encoder_counts(masked, torch.zeros(8, 16))) == (2, 8, 36 + 4)
    assert ints(encoder_counts(clips, torch.zeros(3000, 16))) == (2, 6000, 2 * 3000**2)  # longest dim
    assert encoder_counts({"n": 3}) is None


def test_the_wait_for_plans_is_summed_per_step_from_the_batches_tags(tmp_path):
    from mimo_accel.runtime.context import ShardContext
    from mimo_accel.runtime.reading.shard import ReplicaShare, tag_for

    runtime = _profiling(tmp_path, "vision", {"vision": 2, "language": 2})
    ctx = ShardContext("vision", 0, 2, 2, {"vision": 2, "language": 2})
    batch = {"input_ids": torch.zeros(2, 4, dtype=torch.long)}

    def planned(wait):
        return ReplicaShare((0, 1), spread=1.02, spreads={"vision": 1.01, "language": 1.02}, plan_wait_s=wait)

    for wait in (0.25, 0.0):  # a window's first micro-batch carries its wait, the others none
        runtime.profiling.record_batch(batch, read_samples=2, tag=tag_for(ctx, 2, planned(wait)))
    with torch.no_grad():  # an evaluation batch: in no step line
        runtime.profiling.record_batch(batch, read_samples=2, tag=tag_for(ctx, 2, planned(9.0)))
    runtime.profiling.end_step()
    # sharded, not planned
    runtime.profiling.record_batch(batch, read_samples=2, tag=tag_for(ctx, 2, ReplicaShare((0, 1))))
    runtime.profiling.end_step()
    runtime.close()
    steps = read_run(tmp_path).ranks[0].steps
    assert steps[0]["plan_wait_s"] == 0.25
    assert "plan_wait_s" not in steps[1]


def test_each_forwards_counts_read_back_in_order_whatever_holds_them():
    from mimo_accel.runtime.measuring.profiling import _host_ints

    rows = [[2, torch.tensor(48), torch.tensor([320])], [1, 7, torch.tensor(49, dtype=torch.int32)]]
    assert _host_ints(rows) == [[2, 48, 320], [1, 7, 49]]
    assert _host_ints([[1, 2, 3]]) == [[1, 2, 3]] and _host_ints([]) == []


def test_the_real_tokens_of_batches_that_are_not_packed(tmp_path):
    """Upstream's padded batches (no packing) count each sample's real length as packing would take
    it: Bridge 0.6.2's all-ones attention_mask (or none, as the example drops it) -> loss_mask and
    the placeholders; a mask that marks padding -> its rows. No source, or samples the loss_mask
    cannot describe: said once."""
    from mimo_accel.runtime.measuring.profiling import NO_TOKEN_SOURCE, UNKNOWN_LENGTHS
    from mimo_accel.runtime.context import StepRole

    ph, pad = 5, 9
    ids = torch.tensor([[1, 2, ph, ph, ph, pad, pad, pad], [1, 2, 3, pad, pad, pad, pad, pad]])
    loss = torch.tensor([[1, 0, 0, 0, 0, 0, 0, 0], [1, 1, 1, 0, 0, 0, 0, 0]])  # real lengths 5 and 4
    runtime = _profiling(tmp_path, "language", {"images": 1, "language": 1})
    runtime.step_role = StepRole(True, True, True, 1, (ph,))
    prof = runtime.profiling

    def step(*batches):
        for b in batches:
            prof.record_batch({"input_ids": ids, **b}, read_samples=2)
        prof.end_step()

    step({"loss_mask": loss, "attention_mask": torch.ones_like(ids)}, {"loss_mask": loss})  # 5 + 4, twice
    marked = torch.tensor([[1, 1, 1, 0, 0, 0, 0, 0], [1] * 6 + [0, 0]])
    step({"loss_mask": loss, "attention_mask": marked})  # the mask marks padding: it is the source, 3 + 6
    step({})  # no source: said once, nothing counted
    step({})
    stops_early = torch.tensor([[1, 0, 0, 0, 0, 0, 0, 0], [1, 0, 0, 0, 0, 0, 0, 0]])  # real text after: unknown
    step({"loss_mask": stops_early, "attention_mask": torch.ones_like(ids)})
    runtime.step_role = StepRole(False, True, True, 1)  # an encoder's batch: no language tokens
    step({"loss_mask": loss})
    runtime.close()
    steps = read_run(tmp_path).ranks[0].steps
    assert [(s["tokens"], s["sq_tokens"]) for s in steps] == [
        (18, 2 * (25 + 16)), (9, 9 + 36), (0, 0), (0, 0), (5 + 8, 25 + 64), (0, 0)]
    assert [s.get("notes") for s in steps] == [None, None, [NO_TOKEN_SOURCE], None, [UNKNOWN_LENGTHS], None]
    # each micro-batch's own, in call order: how a language forward's time grows with its tokens
    assert (steps[0]["micro"]["tokens"], steps[0]["micro"]["sq_tokens"]) == ([9, 9], [41, 41])
    assert "micro" not in steps[2] or "tokens" not in steps[2]["micro"]
