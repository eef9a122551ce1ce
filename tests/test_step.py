"""The forward step's replacements: the slice runs once per batch, and under upstream's scalable
reads the tag is taken off, checked and recorded where the batch arrives.

Upstream's ``slice_batch_for_megatron_mimo`` recurses into nested dicts (``modality_inputs``) by
its module-global name, which mimo_accel also patches in ``dp_utils``; the recursion must not run
the step's work (profiling, packing) again per nested dict.
"""

from __future__ import annotations

import pytest
import torch

import mimo_accel
from mimo_accel.config import AccelConfig
from mimo_accel.patching import engine
from mimo_accel.runtime.patches import step
from mimo_accel.runtime.measuring.profiling import Profiling
from mimo_accel.runtime.context import ShardContext, StepRole
from mimo_accel.runtime.reading.shard import SHARD_TAG_KEY, ShardTag
from mimo_accel.runtime.state import Runtime


def test_nested_dicts_reach_upstream_and_the_step_work_runs_once(tmp_path, monkeypatch):
    from megatron.bridge.data.megatron_mimo import dp_utils

    packed, recorded, tokens = [], [], []
    monkeypatch.setattr(step, "pack_for_language_model", lambda b, role, pm, say: packed.append(b) or dict(b, packing_kwargs={}))
    monkeypatch.setattr(Profiling, "record_batch", lambda self, b, **kw: recorded.append(kw))
    monkeypatch.setattr(Profiling, "record_packed", lambda self, kwargs: tokens.append(kwargs))
    mimo_accel.enable(packing=True, profile=str(tmp_path))
    # Where upstream's step packs itself (the "main" shape), mimo_accel packs in upstream's
    # pack_language_shard, not in the slice: the slice must then not pack at all.
    native_packing = engine._state.shape.native_packing
    try:
        engine._state.runtime.step_role = StepRole(True, True, True, 1)  # what _get_module_dp_info learnt
        # its attention_mask marks the padding: the length source where main's step packs next
        batch = {"input_ids": torch.arange(32).view(4, 8), "attention_mask": (torch.arange(8) < 6).float().repeat(4, 1),
                 "modality_inputs": {"vision": {"clip": {"x": torch.zeros(4, 3)}}}}
        out = dp_utils.slice_batch_for_megatron_mimo(batch, 1, 2)
    finally:
        mimo_accel.disable()
    assert len(packed) == len(tokens) == (0 if native_packing else 1) and len(recorded) == 1
    assert recorded[0]["count_tokens"] is False  # the packed shard's real tokens are counted instead
    assert out["input_ids"].tolist() == torch.arange(16, 32).view(2, 8).tolist()
    assert out["modality_inputs"]["vision"]["clip"]["x"].shape == (2, 3)
    # bytes counted once, over the whole batch as it arrived
    assert recorded[0]["read_bytes"] == (32 * 8) + (32 * 4) + (12 * 4)


def test_the_module_dp_info_answers_upstreams_values_and_the_step_learns_the_models_role():
    role = StepRole(True, False, True, 2)
    runtime = Runtime(AccelConfig(packing=True))
    model = type("Model", (), {"role": None})()
    dp_info = step.wrap_module_dp_info(lambda megatron_mimo_model: (3, 4), runtime)
    assert dp_info(model) == (3, 4) and type(dp_info(model)[0]) is int  # upstream's, unchanged
    assert runtime.step_role is None  # a model without a MIMO role
    other = type("Model", (), {"role": None})()
    runtime.roles[other] = role  # worked out once per model, then kept
    dp_info(other)
    assert runtime.step_role is role
    dp_info(model)  # each step's call names the model whose step runs
    assert runtime.step_role is None


def test_where_upstream_packs_the_slice_returns_upstreams_batch_and_the_packer_reads_the_steps_role():
    # main's step packs (native packing): the slice hands back exactly what upstream's slice returned
    # (upstream's own dp_size-1 test: the same object, no copy), and main's packer, next in the same
    # step, finds the role _get_module_dp_info learnt
    from mimo_accel.runtime.patches import native_packing

    runtime = Runtime(AccelConfig(packing=True))
    runtime.native_packing = True
    local_batch = step.wrap_slice(lambda batch, dp_rank, dp_size: batch, runtime)
    pack = native_packing.wrap_pack_language_shard(lambda data_batch, lengths=None: None, runtime)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    batch = {"input_ids": torch.arange(6).view(2, 3), "labels": torch.arange(6).view(2, 3),
             "loss_mask": mask.float(), "attention_mask": mask, "position_ids": None}
    runtime.step_role = StepRole(False, True, True, 1)  # an encoder rank
    assert local_batch(batch, 0, 1) is batch
    runtime.step_role = StepRole(True, True, True, 1)
    assert local_batch(batch, 0, 1) is batch and type(batch) is dict
    packed, kwargs = pack(batch)
    assert kwargs["cu_seqlens_q"].tolist() == [0, 2, 5] and packed["input_ids"].tolist() == [[0, 1, 3, 4, 5]]


def test_under_pp_the_slice_works_out_the_lengths_main_s_step_drops_the_fields_for():
    # main's step drops input_ids off the first language stage and labels / loss_mask off the last
    # before it packs; with an attention_mask of all ones (Bridge's MegatronMIMODataset) the lengths
    # come from loss_mask + input_ids, which only the slice still has on every stage
    from mimo_accel.runtime.patches import native_packing

    runtime = Runtime(AccelConfig(packing=True))
    runtime.native_packing = True
    local_batch = step.wrap_slice(lambda batch, dp_rank, dp_size: batch, runtime)
    pack = native_packing.wrap_pack_language_shard(lambda data_batch, lengths=None: None, runtime)
    pad = 9  # sample 0: 3 real tokens, sample 1: 5 (loss where the next token is real)
    ids = torch.tensor([[1, 2, 3, pad, pad], [4, 5, 6, 7, 8]])
    loss_mask = torch.tensor([[1.0, 1, 0, 0, 0], [1, 1, 1, 1, 0]])
    packed_by_stage = {}
    for first, last in ((True, False), (False, True)):
        batch = {"input_ids": ids.clone(), "labels": ids.clone(), "loss_mask": loss_mask.clone(),
                 "attention_mask": torch.ones_like(ids), "position_ids": None}
        runtime.step_role = StepRole(True, first, last, 1)
        local = local_batch(batch, 0, 1)
        if not first:
            local["input_ids"] = None
        if not last:
            local["labels"] = local["loss_mask"] = None
        packed_by_stage[first], kwargs = pack(local)
        assert kwargs["cu_seqlens_q"].tolist() == [0, 3, 8], (first, last)
        assert runtime.step_lengths is None  # taken by this step's packer, not left for the next
    assert packed_by_stage[True]["input_ids"].tolist() == [[1, 2, 3, 4, 5, 6, 7, 8]]
    assert packed_by_stage[False]["labels"].tolist() == [[1, 2, 3, 4, 5, 6, 7, 8]]
    # without the slice's lengths (the fields already gone) there is no length source: said, not guessed
    with pytest.raises(ValueError, match="no length source"):
        pack({"input_ids": None, "labels": ids.clone(), "loss_mask": loss_mask.clone(),
              "attention_mask": torch.ones_like(ids), "position_ids": None})


def test_under_scalable_reads_and_pp_the_step_s_role_works_out_the_lengths_before_the_fields_go():
    # upstream's scalable reads (#5525) run no slice: the shard arrives by get_batch, the role by
    # _get_module_dp_info, and then the step drops input_ids / loss_mask per stage before it packs;
    # with an all-ones attention_mask the lengths must be worked out between those two calls
    from mimo_accel.runtime.patches import native_packing

    runtime = Runtime(AccelConfig(packing=True, sharded_reads=True))
    runtime.native_packing = True
    runtime.context = ShardContext("language", 0, 1, 1, sliced_in_step=False)
    get_batch = step.wrap_get_batch(lambda data_iterator: next(data_iterator), runtime)
    dp_info = step.wrap_module_dp_info(lambda megatron_mimo_model: (0, 1), runtime)
    pack = native_packing.wrap_pack_language_shard(lambda data_batch, lengths=None: None, runtime)
    pad = 9  # sample 0: 3 real tokens, sample 1: 5 (loss where the next token is real)
    ids = torch.tensor([[1, 2, 3, pad, pad], [4, 5, 6, 7, 8]])
    loss_mask = torch.tensor([[1.0, 1, 0, 0, 0], [1, 1, 1, 1, 0]])
    for first, last in ((True, False), (False, True)):
        model = type("Model", (), {"role": None})()
        runtime.roles[model] = StepRole(True, first, last, 1)
        batches = iter([{"input_ids": ids.clone(), "labels": ids.clone(), "loss_mask": loss_mask.clone(),
                         "attention_mask": torch.ones_like(ids), "position_ids": None,
                         SHARD_TAG_KEY: ShardTag("language", 0, 1, 1, 2, sliced_in_step=False)}])
        batch = get_batch(batches)
        assert dp_info(model) == (0, 1)
        if not first:
            batch["input_ids"] = None
        if not last:
            batch["labels"] = batch["loss_mask"] = None
        _, kwargs = pack(batch)
        assert kwargs["cu_seqlens_q"].tolist() == [0, 3, 8], (first, last)
        assert runtime.step_lengths is None and runtime.step_batch is None  # nothing left for the next step
    # upstream's own reorder in place of mimo_accel's leaves the batch untagged: the same lengths
    model = type("Model", (), {"role": None})()
    runtime.roles[model] = StepRole(True, False, True, 1)
    batch = get_batch(iter([{"input_ids": ids.clone(), "labels": ids.clone(), "loss_mask": loss_mask.clone(),
                             "attention_mask": torch.ones_like(ids), "position_ids": None}]))
    dp_info(model)
    batch["input_ids"] = None
    assert pack(batch)[1]["cu_seqlens_q"].tolist() == [0, 3, 8]


def test_a_mask_of_another_width_than_the_batch_is_refused_as_such_before_it_gives_lengths():
    # all ones, it would send the lengths to loss_mask (absent here): the malformed mask is what to name
    from mimo_accel.runtime.local_batch import shard_lengths

    batch = {"input_ids": torch.tensor([[1, 2, 3, 0]]), "attention_mask": torch.ones(1, 3, dtype=torch.long),
             "labels": None, "loss_mask": None}
    with pytest.raises(ValueError, match="attention_mask width 3 does not match .* width 4"):
        shard_lengths(batch, StepRole(True, True, True, 1), lambda key, message: None)


def _scalable_tag(dp_rank: int, samples: int = 2):
    return ShardTag("vision", dp_rank, 2, 2, samples, sliced_in_step=False)


class _Recording:
    def __init__(self):
        self.calls = []

    def record_batch(self, batch, **kw):
        self.calls.append((batch, kw))


def test_under_scalable_reads_get_batch_takes_the_tag_checks_and_records_it():
    """Upstream's scalable reads (#5525): the step calls get_batch, then _get_module_dp_info, and
    never the slice; the tag must not reach the model, and the replica check and the profiler's
    counts happen where the batch arrives."""
    runtime = Runtime(AccelConfig(sharded_reads=True))
    runtime.context = ShardContext("vision", 1, 2, 2)  # what the loader scope resolved
    runtime.profiling = recording = _Recording()
    batches = iter([{"input_ids": torch.zeros(2, 4), SHARD_TAG_KEY: _scalable_tag(1)},
                    {"input_ids": torch.zeros(2, 4), SHARD_TAG_KEY: _scalable_tag(0)},
                    {"input_ids": torch.zeros(4, 4), SHARD_TAG_KEY: ShardTag("vision", 1, 2, 2, 2)}])
    get_batch = step.wrap_get_batch(lambda data_iterator: next(data_iterator), runtime)

    batch = get_batch(batches)
    assert SHARD_TAG_KEY not in batch  # the model never sees it
    assert len(recording.calls) == 1 and recording.calls[0][0] is batch
    assert recording.calls[0][1]["read_samples"] == 2

    try:
        get_batch(batches)  # read for replica 0, but this rank is replica 1
    except RuntimeError as exc:
        assert "read for vision replica 0/2" in str(exc) and "runs as replica 1/2" in str(exc)
    else:
        raise AssertionError("a batch read for another replica was accepted")

    batch = get_batch(batches)  # a batch for the slice (not scalable): left for the slice to take
    assert SHARD_TAG_KEY in batch and len(recording.calls) == 1
