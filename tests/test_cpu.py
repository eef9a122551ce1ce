"""mimo_accel_dev.rehearse.cpu: the CPU/gloo layer is opt-in, refuses CUDA machines unless forced, and undoes
itself exactly. (Its real use — the MIMO stack on gloo ranks — is exercised by every
distributed test, whose ranks activate it.)"""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from mimo_accel_dev.rehearse import cpu


@pytest.fixture
def inactive():
    cpu.deactivate()
    yield
    cpu.deactivate()
    cpu.prepare_imports()  # leave the import-time compatibility the rest of the suite relies on


def test_not_active_unless_asked_for(inactive):
    assert not cpu.is_active()
    assert torch.empty(1).device.type == "cpu"
    with pytest.raises(Exception):
        torch.empty(1, device="cuda")  # no redirect without activate()


def test_refuses_when_cuda_is_available_unless_forced(inactive, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(RuntimeError, match="CUDA is available.*force=True"):
        cpu.activate()
    assert not cpu.is_active()
    cpu.activate(force=True)
    assert cpu.is_active()


def test_activate_redirects_and_deactivate_restores_the_identical_objects(inactive):
    originals = {
        "c10d.new_group": c10d.new_group, "dist.new_group": dist.new_group, "gloo": c10d.ProcessGroupGloo,
        "current_device": torch.cuda.current_device, "current_stream": torch.cuda.current_stream,
        "Stream": torch.cuda.Stream, "synchronize": torch.cuda.synchronize,
    }
    from megatron.bridge.models.megatron_mimo import build_model
    from megatron.bridge.training import megatron_mimo_parallel_utils as mimo_utils
    from megatron.bridge.training import train_megatron_mimo
    from megatron.core.models.mimo import optimizer as mimo_optimizer

    seeds = build_model._set_per_module_random_seeds
    loop = {"get_rng_state": torch.cuda.get_rng_state, "set_rng_state": torch.cuda.set_rng_state,
            "empty_cache": torch.cuda.empty_cache, "zero": mimo_utils.zero_grad_buffer_for_multimodule,
            "extract": mimo_optimizer._extract_param_groups, "restore": mimo_optimizer._restore_param_groups}
    assert train_megatron_mimo.zero_grad_buffer_for_multimodule is loop["zero"]

    cpu.activate()
    assert cpu.is_active()
    assert torch.empty(2, device="cuda").device.type == "cpu"  # device="cuda" literals land on CPU
    assert torch.ones(2).cuda().device.type == "cpu"  # Tensor.cuda() is a no-op
    assert torch.zeros(1, device=torch.cuda.current_device()).device.type == "cpu"
    torch.cuda.current_stream().wait_stream(torch.cuda.Stream())  # streams are no-ops
    assert dist.new_group is not originals["dist.new_group"]
    assert c10d.ProcessGroupGloo.__wrapped__ is originals["gloo"]
    assert build_model._set_per_module_random_seeds is not seeds
    # Bridge's loop: checkpoints save the CPU generator as the "CUDA" RNG state
    assert torch.equal(torch.cuda.get_rng_state(), torch.get_rng_state())
    torch.cuda.set_rng_state(torch.get_rng_state())
    torch.cuda.empty_cache()
    assert mimo_optimizer._extract_param_groups.__wrapped__ is loop["extract"]
    assert mimo_optimizer._restore_param_groups.__wrapped__ is loop["restore"]
    assert train_megatron_mimo.zero_grad_buffer_for_multimodule is mimo_utils.zero_grad_buffer_for_multimodule
    assert mimo_utils.zero_grad_buffer_for_multimodule.__wrapped__ is loop["zero"]

    cpu.deactivate()
    assert not cpu.is_active()
    assert c10d.new_group is originals["c10d.new_group"] and dist.new_group is originals["dist.new_group"]
    assert c10d.ProcessGroupGloo is originals["gloo"]
    assert torch.cuda.current_device is originals["current_device"]
    assert torch.cuda.current_stream is originals["current_stream"] and torch.cuda.Stream is originals["Stream"]
    assert torch.cuda.synchronize is originals["synchronize"]
    assert build_model._set_per_module_random_seeds is seeds
    assert (torch.cuda.get_rng_state, torch.cuda.set_rng_state, torch.cuda.empty_cache) == \
        (loop["get_rng_state"], loop["set_rng_state"], loop["empty_cache"])
    assert mimo_utils.zero_grad_buffer_for_multimodule is loop["zero"]
    assert train_megatron_mimo.zero_grad_buffer_for_multimodule is loop["zero"]
    assert mimo_optimizer._extract_param_groups is loop["extract"]
    assert mimo_optimizer._restore_param_groups is loop["restore"]
    with pytest.raises(Exception):
        torch.empty(1, device="cuda")


def test_stand_ins_only_where_the_real_package_is_absent_and_they_refuse_use(inactive):
    cpu.prepare_imports()
    te = sys.modules["transformer_engine"]
    assert getattr(te, cpu.STAND_IN_MARKER)
    import transformer_engine.pytorch as te_pytorch

    with pytest.raises(RuntimeError, match="not installed.*local layer specs"):
        te_pytorch.Linear(4, 4)
    cpu.deactivate()
    assert "transformer_engine" not in sys.modules


def test_mimo_train_step_drops_the_param_grad_alias(inactive, monkeypatch):
    # FP32Optimizer.prepare_grads leaves param.grad = param.main_grad; Bridge's MIMO step only
    # zeroes the grad buffers, so the next backward would add each gradient twice.
    from megatron.bridge.training import megatron_mimo_parallel_utils as mimo_utils
    from megatron.bridge.training import train_megatron_mimo

    monkeypatch.setattr(mimo_utils, "is_current_rank_in_grid", lambda grid: True)  # no process group here
    cpu.activate()
    module = torch.nn.Linear(2, 2)
    zeroed = []
    module.zero_grad_buffer = lambda: zeroed.append(True)
    for p in module.parameters():
        p.main_grad = torch.zeros_like(p)
        p.grad = p.main_grad
    train_megatron_mimo.zero_grad_buffer_for_multimodule([(module, None), (None, None)])
    assert zeroed == [True]  # upstream's zeroing still runs
    assert all(p.grad is None for p in module.parameters())


def test_fp32_optimizer_checkpoint_layout_is_routed_per_module_and_restored(inactive):
    # FP32Optimizer keeps torch's layout (state, param_groups at the top level). Upstream's MIMO
    # routing only moves sub_sd["optimizer"]["param_groups"] out of the rank-0-only common state.
    from megatron.core.dist_checkpointing.mapping import ShardedObject
    from megatron.core.models.mimo import optimizer as mimo_optimizer

    cpu.activate()
    sd = {"state": {0: {"exp_avg": "tensor"}, "common_step": 7}, "param_groups": [{"lr": 0.1, "params": [0]}]}
    mimo_optimizer._extract_param_groups(sd, "language", "", (0, 0, 0))
    routed = {k: v for k, v in sd.items() if isinstance(v, ShardedObject)}
    assert sorted(o.key for o in routed.values()) == ["optimizer.mimo.language.common_step",
                                                       "optimizer.mimo.language.param_groups"]
    assert set(sd) == {"state", *routed} and "common_step" not in sd["state"]

    loaded = {"state": sd["state"], **{k: o.data for k, o in routed.items()}}
    inner = SimpleNamespace(optimizer=SimpleNamespace(state_dict=lambda: {"param_groups": [{"params": [5]}]}))
    mimo_optimizer._restore_param_groups(loaded, inner, "language")
    assert loaded == {"state": {0: {"exp_avg": "tensor"}, "common_step": 7},
                      "param_groups": [{"lr": 0.1, "params": [5]}]}


def _groups_rank(rank, world):
    """Several groups (asked for as NCCL, as megatron does), a collective and a send/recv on each;
    returns the sums and how many gloo event-loop threads this process runs."""
    import os

    groups = [dist.new_group(list(range(world)), backend="nccl") for _ in range(5)]
    groups.append(dist.new_group(list(range(world)), backend="gloo"))
    sums = []
    for g in groups:
        t = torch.full((3,), float(rank + 1))
        dist.all_reduce(t, group=g)
        sums.append(float(t[0]))
        if rank in (0, 1):
            peer = 1 - rank
            buf = torch.full((2,), float(rank))
            if rank == 0:
                dist.send(buf, peer, group=g)
            else:
                dist.recv(buf, 0, group=g)
                assert buf.tolist() == [0.0, 0.0]
    isinstance_ok = all(isinstance(g._get_backend(torch.device("cpu")), c10d.ProcessGroupGloo) for g in groups)
    loops = 0
    for tid in os.listdir(f"/proc/{os.getpid()}/task"):
        with open(f"/proc/{os.getpid()}/task/{tid}/comm") as f:
            loops += f.read().strip().startswith("gloo_tcp_loop")
    return sums, loops, isinstance_ok


@pytest.mark.distributed
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="counts threads through /proc")
def test_gloo_groups_share_one_device_and_its_event_loop_thread():
    from mimo_accel_dev.rehearse.ranks import run_ranks

    for sums, loops, isinstance_ok in run_ranks(_groups_rank, 3, deadline_s=120):
        assert sums == [6.0] * 6  # 1 + 2 + 3 on every group
        assert isinstance_ok
        assert loops == 1  # torch alone: one per group (7 here with the default group)
