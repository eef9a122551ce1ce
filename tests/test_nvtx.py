"""NVTX ranges (mimo_accel.nvtx) around the plan, the sharded read, the packer and the profiler's
module regions: none at all on CPU (and nothing breaks), balanced and named where CUDA is."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, SequentialSampler

from mimo_accel import nvtx
from mimo_accel.costs import CostIndex, CostModel
from mimo_accel.costs.resize import ResizeRule
from mimo_accel.grid import canonical_grid
from mimo_accel.planner import CostIndexPlanner
from mimo_accel.profiler import Recorder, attach_module_timer
from mimo_accel.runtime.reading.sampler import shard_loader
from mimo_accel.runtime.context import ShardContext, StepRole
from mimo_accel.runtime.reading.shard import SHARD_TAG_KEY
from mimo_accel.runtime.local_batch import pack_for_language_model

N, MBS = 16, 4


class _Calls:
    """torch.cuda.nvtx's functions, recording what is called."""

    def __init__(self):
        self.calls: list = []
        self._next = 0

    def range_push(self, name):
        self.calls.append(("push", name))

    def range_pop(self):
        self.calls.append(("pop", None))

    def range_start(self, name):
        self._next += 1
        self.calls.append(("start", name, self._next))
        return self._next

    def range_end(self, handle):
        self.calls.append(("end", handle))

    def mark(self, name):
        self.calls.append(("mark", name))


class _Event:
    """torch.cuda.Event stand-in (the recorder's CUDA clock) on a CPU machine."""

    def __init__(self, enable_timing=True):
        self.t = 0.0

    def record(self):
        pass

    def synchronize(self):
        pass

    def query(self):
        return True

    def elapsed_time(self, end):
        return 1.0


class _Samples(torch.utils.data.Dataset):
    def __len__(self):
        return N

    def __getitem__(self, i):
        length = 2 + i % 5
        return {"input_ids": torch.arange(8) + i, "attention_mask": (torch.arange(8) < length).long()}


def _collate(samples):
    return {k: torch.stack([s[k] for s in samples]) for k in samples[0]}


def _exercise(tmp_path, device: str) -> dict:
    """The plan, the sharded read, the packer and a timed module forward + backward, once each."""
    rng = np.random.default_rng(0)
    p = rng.integers(1, 50, N)
    index = CostIndex(rng.integers(1, 9, N), {"vision": (np.ones(N, int), p, p * p, ResizeRule())})
    sizes = {"vision": 2, "language": 1}
    ctx = ShardContext("vision", 0, 2, canonical_grid(list(sizes.values())), sizes)
    upstream = DataLoader(_Samples(), batch_sampler=BatchSampler(SequentialSampler(range(N)), MBS, False),
                          collate_fn=_collate)
    loader = shard_loader(upstream, ctx, MBS, planner=CostIndexPlanner(index, CostModel(), ctx.modules))
    batch = list(loader)[0]  # the whole pass: its planner thread has ended, every range it opened closed
    batch.pop(SHARD_TAG_KEY)
    packed = pack_for_language_model(batch, StepRole(True, True, True, 1), 1, lambda key, message: None)

    rec = Recorder(tmp_path, rank=0, world_size=1, module="vision", device=device)
    encoder = torch.nn.Linear(8, 8)
    timer = attach_module_timer(encoder, rec, name="vision")
    encoder(torch.randn(3, 8)).sum().backward()
    line = rec.end_step()
    timer.remove()
    rec.close()
    return {"read": int(batch["input_ids"].size(0)), "packed": tuple(packed["input_ids"].shape), "line": line}


def test_on_cpu_no_nvtx_function_is_called_and_everything_runs(tmp_path, monkeypatch):
    calls = _Calls()
    for name in ("range_push", "range_pop", "range_start", "range_end", "mark"):
        monkeypatch.setattr(torch.cuda.nvtx, name, getattr(calls, name))
    monkeypatch.setattr(nvtx, "_ops", None)  # decide afresh, on this CPU machine
    assert not torch.cuda.is_available()
    got = _exercise(tmp_path, "cpu")
    assert not nvtx.enabled() and calls.calls == []
    assert got["read"] == MBS // 2 and got["packed"][0] == 1
    assert got["line"]["vision_fwd_s"] > 0 and got["line"]["vision_bwd_s"] > 0


def test_where_cuda_is_every_region_is_a_balanced_named_range(tmp_path, monkeypatch):
    calls = _Calls()
    monkeypatch.setattr(nvtx, "_ops", calls)  # as on a CUDA machine
    monkeypatch.setattr(torch.cuda, "Event", _Event)
    got = _exercise(tmp_path, "cuda")
    assert got["line"]["timed_calls"] == {"vision_fwd": 1, "vision_bwd": 1}
    pushed = [c[1] for c in calls.calls if c[0] == "push"]
    # one plan per micro-batch (on the planner thread, around the planner process's work), one read
    # per micro-batch, one pack
    assert sorted(set(pushed)) == ["mimo_accel/pack", "mimo_accel/plan", "mimo_accel/read"]
    assert pushed.count("mimo_accel/plan") == pushed.count("mimo_accel/read") == N // MBS
    assert sum(c[0] == "pop" for c in calls.calls) == len(pushed)
    started = {c[2]: c[1] for c in calls.calls if c[0] == "start"}
    assert sorted(started.values()) == ["mimo_accel/vision_bwd", "mimo_accel/vision_fwd"]
    assert sorted(c[1] for c in calls.calls if c[0] == "end") == sorted(started)  # every range closed


def test_nested_starts_of_one_region_are_one_range(tmp_path, monkeypatch):
    calls = _Calls()
    monkeypatch.setattr(nvtx, "_ops", calls)
    monkeypatch.setattr(torch.cuda, "Event", _Event)
    rec = Recorder(tmp_path, rank=0, world_size=1, module="vision", device="cuda")
    rec.start("vision_fwd")
    rec.start("vision_fwd")
    rec.stop("vision_fwd")
    rec.stop("vision_fwd")
    rec.stop("vision_fwd")  # a stray stop: ignored, no range ends twice
    rec.close()
    assert [c[0] for c in calls.calls] == ["start", "end"]


def test_the_decision_waits_for_torch_and_is_made_once(monkeypatch):
    import sys

    monkeypatch.setattr(nvtx, "_ops", None)
    monkeypatch.delitem(sys.modules, "torch")
    assert nvtx._nvtx() is None and nvtx._ops is None  # undecided: torch not imported
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert nvtx._nvtx() is torch.cuda.nvtx
    monkeypatch.setattr(torch.cuda, "is_available", lambda: pytest.fail("asked twice"))
    assert nvtx.enabled()
