"""What a checkpoint carries to another layout (mimo_accel.carry_over), held against megatron-core's
and Bridge's own behaviour where it can run here: the sample order against Bridge's real samplers
(``MegatronPretrainingRandomSampler``: the flat one Bridge's MIMO loaders build with dp 1, and one per
canonical group as #5525's ``build_canonical_group_batch_sampler`` builds them, which 0.6.2 lacks)."""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from mimo_accel.carry_over import (FULLY_RESHARDABLE, RunSettings, batch_barrier, carried, load_barriers,
                                   optimizer_sharding, order_barriers)
from tests._hypothesis import examples

SHAPES = {"the language model": {"num_layers": 8, "hidden_size": 64}, "images's encoder vit": {"num_layers": 2,
                                                                                               "hidden_size": 32}}
# upstream's validated layout (images dp1 -> language tp4 pp2 dp2), its launcher's checkpoint settings
REF = RunSettings({"images": (1, 1, 1), "language": (4, 2, 2)}, 32, 2, "torch_dist",
                  optimizer_sharding(True, "torch_dist", True), "cyclic", shapes=SHAPES, save="/ckpt", save_rng=False)


def on(layout: dict, **changes) -> RunSettings:
    return dataclasses.replace(REF, parallelism=layout, **changes)


def test_torch_dist_and_a_fully_reshardable_optimizer_carry_everything_to_another_layout():
    now = on({"images": (1, 1, 2), "language": (2, 4, 1)}, micro_batch=4)
    assert REF.optimizer_sharding == "fully_reshardable" and load_barriers(REF, now) == []
    lines = carried(REF, now)
    assert len(lines) == 3 and "reshards across TP, PP and DP" in lines[0] and "fully_reshardable" in lines[1]
    assert "G=2" in lines[2]


def test_the_legacy_format_loads_only_on_the_tp_and_pp_that_saved_it():
    saved = dataclasses.replace(REF, format="torch", optimizer_sharding=None)
    assert load_barriers(saved, on({"images": (1, 1, 2), "language": (4, 2, 1)}, format="torch")) == []  # DP only
    (b,) = load_barriers(saved, on({"images": (1, 1, 1), "language": (2, 2, 2)}, format="torch"))
    assert b.what == "format" and "language tp4 pp2 -> tp2 pp2" in b.why and "torch_dist" in b.fix
    assert "weights" not in " ".join(carried(saved, on({"images": (1, 1, 1), "language": (2, 2, 2)}), (b,)))


def test_a_checkpoint_loaded_in_another_format_than_it_was_saved_in_is_refused_unless_detected():
    (b,) = load_barriers(REF, dataclasses.replace(REF, format="fsdp_dtensor"))
    assert b.what == "format" and "ckpt_format='torch_dist'" in b.fix
    assert load_barriers(REF, dataclasses.replace(REF, format="fsdp_dtensor"), auto_format=True) == []


@pytest.mark.parametrize("sharding", ["dp_reshardable", "dp_zero_gather_scatter"])
def test_an_optimizer_sharded_by_dp_only_does_not_follow_a_tp_or_pp_change(sharding):
    saved = dataclasses.replace(REF, optimizer_sharding=sharding)
    assert load_barriers(saved, on({"images": (1, 1, 2), "language": (4, 2, 4)})) == []  # DP changes: it reshards
    moved = on({"images": (1, 1, 1), "language": (4, 4, 1)})
    (b,) = load_barriers(saved, moved)
    assert b.what == "optimizer" and "dist_ckpt_optim_fully_reshardable=True" in b.fix and "load_optim=False" in b.fix
    assert load_barriers(saved, moved, load_optim=False) == []
    assert optimizer_sharding(True, "torch_dist", False) == "dp_reshardable"
    assert optimizer_sharding(True, "fsdp_dtensor", False) in FULLY_RESHARDABLE
    assert optimizer_sharding(False, "torch_dist", True) is None


def test_rng_states_kept_per_tp_and_pp_rank_do_not_follow_a_tp_or_pp_change():
    saved = dataclasses.replace(REF, save_rng=True)
    assert load_barriers(saved, on({"images": (1, 1, 2), "language": (4, 2, 1)})) == []  # kept per TP/PP rank
    moved = on({"images": (1, 1, 1), "language": (2, 2, 2)})
    (b,) = load_barriers(saved, moved)
    assert b.what == "rng" and "missing rng_state key" in b.why and "checkpoint.load_rng=False" in b.fix
    assert load_barriers(saved, moved, load_rng=False) == []
    per_dp = dataclasses.replace(saved, rng_per_dp=True)
    (b,) = load_barriers(per_dp, on({"images": (1, 1, 2), "language": (4, 2, 1)}))
    assert b.what == "rng" and "TP/PP/DP rank" in b.why


def test_a_checkpoint_of_another_model_is_named_as_such():
    (b,) = load_barriers(REF, on({"vision": (1, 1, 1), "language": (4, 2, 2)}))
    assert b.what == "model" and "images + language there, vision + language here" in b.why
    wider = dataclasses.replace(REF, shapes={**SHAPES, "the language model": {"num_layers": 8, "hidden_size": 96}})
    (b,) = load_barriers(REF, wider)
    assert b.what == "model" and "the language model hidden_size 64 there, 96 here" in b.why


def test_a_global_batch_of_another_size_is_no_continuation():
    assert batch_barrier(REF, REF) is None
    b = batch_barrier(REF, dataclasses.replace(REF, global_batch=64))
    assert b.what == "global batch" and "--gbs 32" in b.fix


def test_a_step_window_must_start_at_a_step_of_the_new_global_batch():
    single = dataclasses.replace(REF, dataloader_type="single")
    now = dataclasses.replace(single, global_batch=24)
    # 2 steps of 32 = 64 samples = 32 micro-batches of 2: not a multiple of the 12 of a 24-sample step
    (b,) = order_barriers(single, now, samples=1000, consumed=64, window=12)
    assert "global batches of 32 and this run 24" in b.why and "reorder_window=1" in b.fix
    assert order_barriers(single, now, samples=1000, consumed=96, window=12) == []  # 48 micro-batches: a step
    assert order_barriers(single, now, samples=1000, consumed=64, window=1) == []


# ------------------------------------------------------------------ the order, against Bridge's samplers

def _flat(n: int, mbs: int, consumed: int) -> list[int]:
    """What Bridge's MIMO loader reads from ``consumed`` on, to its epoch's end (cyclic, dp 1)."""
    from megatron.bridge.data.samplers import MegatronPretrainingRandomSampler

    sampler = MegatronPretrainingRandomSampler(dataset=range(n), total_samples=n, consumed_samples=consumed,
                                               micro_batch_size=mbs, data_parallel_rank=0, data_parallel_size=1,
                                               data_sharding=True)
    return [i for batch in sampler for i in batch]


def _canonical(n: int, mbs: int, grid: int, consumed: int) -> list[int]:
    """The same under #5525's scalable reads: one sampler per canonical group (dp size G, mbs / G),
    over whole global micro-batches, each micro-batch the groups' windows in group order."""
    from megatron.bridge.data.samplers import MegatronPretrainingRandomSampler

    total = n // mbs * mbs
    groups = [iter(MegatronPretrainingRandomSampler(dataset=range(n), total_samples=total, consumed_samples=consumed,
                                                    micro_batch_size=mbs // grid, data_parallel_rank=g,
                                                    data_parallel_size=grid, data_sharding=True))
              for g in range(grid)]
    out = []
    for windows in zip(*groups):
        out += [i for w in windows for i in w]
    return out


@settings(max_examples=examples(60))
@given(n=st.integers(12, 300), a=st.sampled_from([1, 2, 3, 4, 6, 8]), b=st.sampled_from([1, 2, 3, 4, 6, 8]),
       steps=st.integers(0, 6))
def test_the_cyclic_order_reads_on_as_the_checkpoints_run_would_where_no_barrier_stands(n, a, b, steps):
    gbs = 2 * math.lcm(a, b)
    consumed = steps * gbs
    assume(consumed < min(n - n % a, n - n % b))
    saved = RunSettings({"images": (1, 1, 1), "language": (1, 1, 1)}, gbs, a, dataloader_type="cyclic")
    now = dataclasses.replace(saved, micro_batch=b)
    if not order_barriers(saved, now, samples=n, consumed=consumed):
        assert _flat(n, b, consumed) == _flat(n, a, consumed)


def test_a_micro_batch_that_changes_the_cyclic_permutation_is_refused_and_would_have_repeated_samples():
    saved = RunSettings({"images": (1, 1, 1), "language": (1, 1, 2)}, 4, 2, dataloader_type="cyclic")
    now = dataclasses.replace(saved, micro_batch=4)
    (b,) = order_barriers(saved, now, samples=10, consumed=4)
    assert "10 % 2 = 0" in b.why and "10 % 4 = 2" in b.why and "dataloader_type='single'" in b.fix
    before, after = _flat(10, 2, 4), _flat(10, 4, 4)
    seen = set(_flat(10, 2, 0)[:4])  # what the checkpoint's run read before it
    assert seen & set(after), "the new order would not repeat a sample: the barrier would stop nothing"
    assert set(before) != set(after)
    single = dataclasses.replace(saved, dataloader_type="single")
    assert order_barriers(single, dataclasses.replace(single, micro_batch=4), samples=10, consumed=4) == []


def test_under_scalable_reads_the_cyclic_order_follows_the_canonical_grid():
    saved = RunSettings({"images": (1, 1, 1), "language": (1, 1, 2)}, 8, 4, dataloader_type="cyclic",
                        canonical_reads=True)
    same_grid = dataclasses.replace(saved, parallelism={"images": (1, 1, 2), "language": (2, 1, 1)})
    assert order_barriers(saved, same_grid, samples=40, consumed=8) == []
    assert _canonical(40, 4, 2, 8) == _canonical(40, 4, same_grid.grid, 8)
    other = dataclasses.replace(saved, parallelism={"images": (1, 1, 4), "language": (1, 1, 4)})
    (b,) = order_barriers(saved, other, samples=40, consumed=8)
    assert "G=2" in b.why and "G=4" in b.why
    assert _canonical(40, 4, 2, 8) != _canonical(40, 4, 4, 8)
    assert order_barriers(saved, dataclasses.replace(saved, dataloader_type="single"), samples=40, consumed=8)
