"""The slice replacement runs once per batch: nested dicts reach upstream's slice.

Upstream's ``slice_batch_for_megatron_mimo`` recurses into nested dicts (``modality_inputs``) by
its module-global name, which mimo_accel also patches in ``dp_utils``; the recursion must not run
the step's work (profiling, packing) again per nested dict.
"""

from __future__ import annotations

import torch

import mimo_accel
from mimo_accel import instrument, step
from mimo_accel.patching import engine


def test_nested_dicts_reach_upstream_and_the_step_work_runs_once(tmp_path, monkeypatch):
    from megatron.bridge.data.megatron_mimo import dp_utils

    packed, recorded = [], []
    monkeypatch.setattr(step, "pack_for_language_model", lambda b, role, pm: packed.append(b) or b)
    monkeypatch.setattr(instrument, "record_batch", lambda b, **kw: recorded.append(kw))
    mimo_accel.enable(packing=True, profile=str(tmp_path))
    # Where upstream's step packs itself (the "main" shape), mimo_accel packs in upstream's
    # pack_language_shard, not in the slice: the slice must then not pack at all.
    native_packing = engine._state.shape.native_packing
    try:
        monkeypatch.setattr(step._step, "role", step.StepRole(True, True, True, 1), raising=False)
        batch = {"input_ids": torch.arange(32).view(4, 8), "attention_mask": torch.ones(4, 8),
                 "modality_inputs": {"vision": {"clip": {"x": torch.zeros(4, 3)}}}}
        out = dp_utils.slice_batch_for_megatron_mimo(batch, 1, 2)
    finally:
        mimo_accel.disable()
    assert len(packed) == (0 if native_packing else 1) and len(recorded) == 1
    assert out["input_ids"].tolist() == torch.arange(16, 32).view(2, 8).tolist()
    assert out["modality_inputs"]["vision"]["clip"]["x"].shape == (2, 3)
    # bytes counted once, over the whole batch as it arrived
    assert recorded[0]["read_bytes"] == (32 * 8) + (32 * 4) + (12 * 4)
