"""Upstream's own in-batch packing (Megatron-Bridge main: ``dataset.enable_in_batch_packing`` with
``defer_in_batch_packing_to_step``; its step packs the language shard with
``sequence_pack.pack_language_shard``) with mimo_accel's packing *off* and its sharded reads,
reorder, fan-in and profiler on, through Bridge's own loop (``examples/train_mimo.py
--upstream-packing``).

Upstream packs; mimo_accel's other features work on its packed batches: per iteration the samples
each module trained and the global loss equal upstream's own packing run on one vision and one
language replica (where its slicing is a no-op and uneven encoder rows are fine).

Needs a megatron-bridge whose MIMO step packs (main, and #5525 built on it): 0.6.2 has no step
packing, so there these tests are skipped; mimo_accel's own packing is tested everywhere
(tests/test_packing*.py, tests/test_pretrain_loop.py).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from mimo_accel_dev.rehearse.ranks import run_ranks

from ._example import run_example, steps_from_trace

HAS_STEP_PACKING = importlib.util.find_spec("megatron.bridge.data.megatron_mimo.sequence_pack") is not None
pytestmark = [pytest.mark.distributed,
              pytest.mark.skipif(not HAS_STEP_PACKING,
                                 reason="this megatron-bridge's MIMO step does not pack (Megatron-Bridge main does)")]

MBS, GBS = 4, 8
DEADLINE_S = 150.0
RTOL = 1e-4


def _train(rank, world, argv, features, env):
    """One rank of the example, counting upstream's packer calls (a spy on the real function, which
    the step looks up in its module globals at call time)."""
    from megatron.bridge.training import megatron_mimo_step as step

    real, calls = step.pack_language_shard, []

    def counting_pack_language_shard(data_batch, *, lengths=None):
        packed, kwargs = real(data_batch, lengths=lengths)
        calls.append(kwargs is not None and packed["input_ids" if packed.get("input_ids") is not None
                                                    else "labels"].size(0) == 1)
        return packed, kwargs

    step.pack_language_shard = counting_pack_language_shard
    try:
        status = run_example(argv, features, env)
    finally:
        step.pack_language_shard = real
    return dict(active=status["active"], packed=calls)


def _run(workdir: Path, name: str, vdp: int, ldp: int, features: dict) -> dict:
    trace = workdir / f"{name}.jsonl"
    argv = ["--cpu", "--upstream-packing", "--varied", "--vision-dp", str(vdp), "--language-dp", str(ldp),
            "--mbs", str(MBS), "--gbs", str(GBS), "--train-iters", "4", "--eval-interval", "2",
            "--eval-iters", "1", "--trace", str(trace)]
    ranks = run_ranks(_train, vdp + ldp, argv, features, {}, deadline_s=DEADLINE_S)
    records = [json.loads(line) for line in trace.read_text().splitlines()]
    return dict(ranks=ranks, steps=steps_from_trace(records), records=records)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("upstream-step-packing")


def test_upstream_packs_and_mimo_accel_reads_reorders_and_fans_in_on_its_packed_batches(workdir):
    reference = _run(workdir, "upstream-v1-l1", 1, 1, {})
    accel = _run(workdir, "accel-v2-l1", 2, 1, dict(sharded_reads=True, reorder=True,
                                                    profile=str(workdir / "profile")))
    # upstream packed every language micro-batch (training and evaluation) into one [1, T] row
    lang = accel["ranks"][2]
    assert lang["active"] == ["sharded_reads", "reorder", "profile"]
    assert len(lang["packed"]) >= 4 * (GBS // MBS) and all(lang["packed"])
    assert all(not r["packed"] for r in accel["ranks"][:2])  # vision ranks never pack
    assert reference["ranks"][1]["packed"] and all(reference["ranks"][1]["packed"])
    # the same training as upstream's own packing run
    for it in range(1, 5):
        for module in ("vision", "language"):
            assert accel["steps"][it][module] == reference["steps"][it][module]
        assert accel["steps"][it]["loss"] == pytest.approx(reference["steps"][it]["loss"], rel=RTOL)
    # reorder moved samples away from the contiguous halves on the vision replicas
    vision0 = [r["ids"] for r in accel["records"] if r["module"] == "vision" and r["dp_rank"] == 0]
    contiguous = [[list(range((it * GBS) + m * MBS, (it * GBS) + m * MBS + MBS // 2)) for m in range(GBS // MBS)]
                  for it in range(4)]
    assert any(sorted(a) != b for got, want in zip(vision0, contiguous) for a, b in zip(got, want))
    # the profiler saw sharded reads on the vision replicas
    from mimo_accel.profiler.run import read_run

    run = read_run(workdir / "profile")
    assert [s["samples_read"] for s in run.ranks[0].steps] == [GBS // 2] * 4
