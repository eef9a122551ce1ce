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


def _scalable_tag(dp_rank: int, samples: int = 2):
    from mimo_accel.sampler import ShardTag

    return ShardTag("vision", dp_rank, 2, 2, samples, sliced_in_step=False)


def _dp_info_of(dp_rank: int):
    return lambda model: (dp_rank, 2)


def test_under_scalable_reads_get_batch_takes_the_tag_and_dp_info_checks_and_records_it(monkeypatch):
    """Upstream's scalable reads (#5525): the step calls get_batch, then _get_module_dp_info, and
    never the slice; the tag must not reach the model, and the replica check and the profiler's
    counts happen where the replica is known."""
    from mimo_accel.sampler import SHARD_TAG_KEY, ShardTag

    recorded = []
    monkeypatch.setattr(instrument, "record_batch", lambda b, **kw: recorded.append((b, kw)))
    model = type("Model", (), {"role": None})()
    batches = iter([{"input_ids": torch.zeros(2, 4), SHARD_TAG_KEY: _scalable_tag(1)},
                    {"input_ids": torch.zeros(2, 4), SHARD_TAG_KEY: _scalable_tag(0)},
                    {"input_ids": torch.zeros(4, 4), SHARD_TAG_KEY: ShardTag("vision", 1, 2, 2, 2)}])
    get_batch = step.make_get_batch_fn(lambda it: next(it))
    dp_info = step.capture_role(_dp_info_of(1), profile=True)

    batch = get_batch(batches)
    assert SHARD_TAG_KEY not in batch  # the model never sees it
    assert dp_info(model) == (1, 2)
    assert len(recorded) == 1 and recorded[0][0] is batch and recorded[0][1]["read_samples"] == 2

    get_batch(batches)  # read for replica 0, but this step runs as replica 1
    try:
        dp_info(model)
    except RuntimeError as exc:
        assert "read for vision replica 0/2" in str(exc) and "runs as replica 1/2" in str(exc)
    else:
        raise AssertionError("a batch read for another replica was accepted")

    batch = get_batch(batches)  # a batch for the slice (not scalable): left for the slice to take
    assert SHARD_TAG_KEY in batch
    assert dp_info(model) == (1, 2) and len(recorded) == 1
