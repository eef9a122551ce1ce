"""mimo_accel.cpu: the CPU/gloo layer is opt-in, refuses CUDA machines unless forced, and undoes
itself exactly. (Its real use — the MIMO stack on gloo ranks — is exercised by every
distributed test, whose ranks activate it.)"""

from __future__ import annotations

import sys

import pytest
import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from mimo_accel import cpu


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
        "c10d.new_group": c10d.new_group, "dist.new_group": dist.new_group,
        "current_device": torch.cuda.current_device, "current_stream": torch.cuda.current_stream,
        "Stream": torch.cuda.Stream, "synchronize": torch.cuda.synchronize,
    }
    from megatron.bridge.models.megatron_mimo import build_model
    seeds = build_model._set_per_module_random_seeds

    cpu.activate()
    assert cpu.is_active()
    assert torch.empty(2, device="cuda").device.type == "cpu"  # device="cuda" literals land on CPU
    assert torch.ones(2).cuda().device.type == "cpu"  # Tensor.cuda() is a no-op
    assert torch.zeros(1, device=torch.cuda.current_device()).device.type == "cpu"
    torch.cuda.current_stream().wait_stream(torch.cuda.Stream())  # streams are no-ops
    assert dist.new_group is not originals["dist.new_group"]
    assert build_model._set_per_module_random_seeds is not seeds

    cpu.deactivate()
    assert not cpu.is_active()
    assert c10d.new_group is originals["c10d.new_group"] and dist.new_group is originals["dist.new_group"]
    assert torch.cuda.current_device is originals["current_device"]
    assert torch.cuda.current_stream is originals["current_stream"] and torch.cuda.Stream is originals["Stream"]
    assert torch.cuda.synchronize is originals["synchronize"]
    assert build_model._set_per_module_random_seeds is seeds
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
