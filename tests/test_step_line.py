"""Rank 0's line at the first step and every log interval (mimo_accel/runtime/measuring/activity.py):
the samples the plan gave another replica (pure, against a brute-force count), what a plan's shares
carry of it, the line from every rank's counts, and each rank's counts from real batches. The line
in a real Bridge loop's rank-0 log: tests/test_pretrain_loop.py."""

from __future__ import annotations

import types

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mimo_accel.config import AccelConfig
from mimo_accel.grid import moved_between_replicas
from mimo_accel.runtime.context import ShardContext
from mimo_accel.runtime.measuring.activity import Activity, StepCounts, step_line
from mimo_accel.runtime.reading.sampler import ShareRules
from mimo_accel.runtime.reading.shard import ReplicaShare
from mimo_accel.runtime.state import Runtime
from tests._hypothesis import examples


def _brute(before, after, dp) -> int:
    per = len(before) // dp
    replica = {s: p // per for p, s in enumerate(before)}
    return sum(replica[s] != p // per for p, s in enumerate(after))


@settings(max_examples=examples(200))
@given(st.integers(1, 4), st.integers(1, 4), st.randoms(use_true_random=False))
def test_moved_between_replicas_counts_each_sample_given_another_replica(dp, per, rng):
    before = rng.sample(range(1000), dp * per)
    after = list(before)
    rng.shuffle(after)
    assert moved_between_replicas(before, after, dp) == _brute(before, after, dp)


def test_moved_between_replicas_by_hand():
    assert moved_between_replicas([1, 2, 3, 4], [2, 1, 4, 3], 2) == 0  # within each replica: nothing moved
    assert moved_between_replicas([1, 2, 3, 4], [3, 2, 1, 4], 2) == 2  # 1 and 3 changed replica
    assert moved_between_replicas([1, 2, 3, 4], [4, 3, 2, 1], 1) == 0  # one replica: nowhere to go


def test_a_plans_shares_carry_what_it_moved():
    ctx = ShardContext("vision", 0, 2, 2, {"vision": 2, "language": 1})
    rules = ShareRules(ctx)

    def swap_halves(window, micro_batches):  # the second half of each micro-batch first
        parts = np.asarray(window).reshape(micro_batches, -1)
        half = parts.shape[1] // 2
        return np.concatenate([parts[:, half:], parts[:, :half]], axis=1).reshape(-1), 1.0

    shares, _, _ = ShareRules(ctx, window=2).plan(swap_halves, [[0, 1, 2, 3], [4, 5, 6, 7]])
    assert [s.indices for s in shares] == [(2, 3), (6, 7)] and [s.moved for s in shares] == [4, 4]
    same, _, _ = rules.plan(lambda w, m: (np.asarray(w), 1.0), [[0, 1, 2, 3]])
    assert same[0].moved == 0


FIGURES = [  # vision dp2 on ranks 0-1, language dp1 (tp2) on ranks 2-3: 2 micro-batches of 4
    dict(rank=0, module="vision", dp_rank=0, read=4, whole=8, moved=3, planned=2, padded=0, packed=0),
    dict(rank=1, module="vision", dp_rank=1, read=4, whole=8, moved=3, planned=2, padded=0, packed=0),
    dict(rank=2, module="language", dp_rank=0, read=8, whole=8, moved=0, planned=2, padded=512, packed=300),
    dict(rank=3, module="language", dp_rank=0, read=8, whole=8, moved=0, planned=2, padded=512, packed=300),
]


def test_the_line_names_reads_moves_and_packing_of_the_whole_job():
    line = step_line(1, ["sharded_reads", "reorder", "packing"], FIGURES)
    assert line == ("step 1: on: sharded_reads, reorder, packing; read per rank: vision 4, language 8 of 8 samples "
                    "(upstream: all 8); the plan gave another replica 3 of 8 vision, 0 of 8 language samples; "
                    "packing removed 212 of 512 language tokens (41%), all padding")  # a TP pair packs one shard
    upstream = [dict(f, read=8, moved=0, planned=0, padded=0, packed=0) for f in FIGURES]
    assert step_line(10, ["profile"], upstream) == ("step 10: on: profile; read per rank: vision 8, language 8 of 8 "
                                                    "samples (upstream: all 8)")
    nothing = step_line(2, ["packing"], [dict(f, padded=0, packed=0, planned=0) for f in FIGURES])
    assert nothing.endswith("packing packed no language shard this step")  # said, not silent


def test_each_rank_counts_its_training_batches_and_packs(monkeypatch):
    runtime = Runtime(AccelConfig(sharded_reads=True, reorder=True, packing=True))
    runtime.context = ShardContext("language", 0, 1, 2, {"vision": 2, "language": 1})
    activity = Activity(runtime)
    activity.saw_batch(4, 4)  # before the run started (a test's step, a warm-up): nothing counted
    activity.state = types.SimpleNamespace(train_state=types.SimpleNamespace(step=0))
    activity.saw_batch(4, 4, ReplicaShare(indices=(0, 1, 2, 3), spread=1.0, moved=2))
    activity.saw_pack({"labels": torch.zeros(4, 64)}, {"labels": torch.zeros(1, 150)})
    with torch.no_grad():  # an evaluation pass: counts for nothing
        activity.saw_batch(4, 4, ReplicaShare(indices=(0, 1, 2, 3), spread=1.0, moved=2))
        activity.saw_pack({"labels": torch.zeros(4, 64)}, {"labels": torch.zeros(1, 150)})
    assert activity.counts == StepCounts(read=4, whole=4, moved=2, planned=1, padded=256, packed=150)
    sent = {}

    class Store:
        def set(self, key, value):
            sent[key] = value

    monkeypatch.setattr("mimo_accel.runtime.measuring.activity.default_store", Store)
    activity.rank = 1  # not rank 0: it sends, and gathers nothing
    activity.end_step()  # step 1: logged
    assert len(sent) == 1 and '"padded": 256' in next(iter(sent.values())) and activity.counts == StepCounts()
    activity.state.train_state.step, activity.interval = 1, 5
    activity.end_step()  # step 2, interval 5: not logged
    assert len(sent) == 1
    activity.state.train_state.step = 4
    activity.end_step()  # step 5
    assert len(sent) == 2
