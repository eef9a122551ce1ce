"""Packing on Bridge's own MegatronMIMODataset: its attention_mask is all ones after padding, so
sample lengths come from loss_mask and the placeholder tokens — exact, or a clear refusal.

Built offline with a real HF fast tokenizer and Qwen2-VL image processor over real image files.
"""

from __future__ import annotations

import pytest
import torch

from mimo_accel.config import AccelConfig
from mimo_accel.sample_lengths import lengths_from_loss_mask
from mimo_accel.runtime.state import Runtime
from mimo_accel.runtime.local_batch import pack_for_language_model
from mimo_accel.runtime.context import StepRole
from tests.test_derive import VISION_TOKEN, all_kinds_of_examples, ground_truth, mimo_dataset, qwen_processor


def _bridge_batch(ds):
    from megatron.bridge.data.megatron_mimo.collate import megatron_mimo_collate_fn

    return megatron_mimo_collate_fn([ds[i] for i in range(len(ds))], modality_names=["vision"])


def test_megatron_mimo_dataset_lengths_from_loss_mask_are_exact(tmp_path):
    ds = mimo_dataset(all_kinds_of_examples(tmp_path), qwen_processor(), seq_length=48)
    batch = _bridge_batch(ds)
    assert bool((batch["attention_mask"] != 0).all())  # upstream marks no padding
    _, _, real_tokens = ground_truth(ds)
    assert lengths_from_loss_mask(batch, [VISION_TOKEN]) == real_tokens
    assert len(set(real_tokens)) > 2  # the data does have padding to remove


def test_the_step_packs_that_data_and_says_which_source_it_used(tmp_path):
    runtime = Runtime(AccelConfig(packing=True))
    ds = mimo_dataset(all_kinds_of_examples(tmp_path), qwen_processor(), seq_length=48)
    batch = _bridge_batch(ds)
    _, _, real_tokens = ground_truth(ds)
    packed = pack_for_language_model(batch, StepRole(True, True, True, 1, (VISION_TOKEN,)), 1, runtime.say_once)
    assert packed["input_ids"].shape == (1, sum(real_tokens))
    # every placeholder survived, in order: the encoder rows still pair with their tokens
    assert int((packed["input_ids"] == VISION_TOKEN).sum()) == int((batch["input_ids"] == VISION_TOKEN).sum())
    assert "loss_mask" in runtime.notices()["packing:length-source"]


def test_placeholders_at_the_end_and_pad_equal_to_eos():
    # sample 0: text, then an image's 3 placeholders last; sample 1: ends with eos (= pad id 9)
    ph, pad = 5, 9
    ids = torch.tensor([[1, 2, ph, ph, ph, pad, pad, pad],
                        [1, 2, 3, pad, pad, pad, pad, pad]])
    lm = torch.tensor([[1, 0, 0, 0, 0, 0, 0, 0],   # target 2 is real; then placeholder targets; then padding
                       [1, 1, 1, 0, 0, 0, 0, 0]])  # real length 4: 1 2 3 eos, eos = pad
    # trailing pad ids alone would say 3 for sample 1; trailing loss zeros alone would say 2 for sample 0
    assert lengths_from_loss_mask({"input_ids": ids, "loss_mask": lm}, [ph]) == [5, 4]


def test_no_length_source_is_an_error_not_a_silent_no_op():
    ids = torch.tensor([[1, 2, 3, 0]])
    with pytest.raises(ValueError, match="no length source"):
        lengths_from_loss_mask({"input_ids": ids}, [5])
    # a loss_mask that stops early (prompt-only loss) leaves real text after it: refused
    lm = torch.tensor([[1, 0, 0, 0]])
    with pytest.raises(ValueError, match="cannot be known"):
        lengths_from_loss_mask({"input_ids": torch.tensor([[1, 2, 3, 4]]), "loss_mask": lm}, [5])
