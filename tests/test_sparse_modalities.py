"""Sparse modality DP ownership (Megatron-Bridge PR #4986, head fdf31e415) with mimo_accel on top,
through Bridge's own loop (``examples/train_mimo.py --sparse``: ``pretrain_megatron_mimo`` with
evaluation) on CPU gloo ranks.

Where some samples of a batch have no image, #4986's ``megatron_mimo_collate_fn`` stacks the image
inputs of the others and records their positions (``_mimo_sample_indices``); its
``slice_batch_for_megatron_mimo`` hands each DP shard the rows of its own samples, at DP 1 too (it
takes the key off there; ``MimoModel.forward`` has no such parameter). mimo_accel's sharded reads
collate each replica's share alone and pass it through upstream's slice as one replica's whole
batch: one path, said at enable(). Per iteration, each module trains the samples upstream trains
and the global loss is upstream's on one vision and one language replica; fan-in, which upstream
refuses with uneven encoder rows per sample (0 or 4 here), included.

These tests need a megatron-bridge whose collate records sparse modalities (#4986): they run under
``make test-upstream`` on that branch and are skipped elsewhere.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mimo_accel_dev.rehearse.ranks import run_ranks

from ._example import bridge_source, run_example, steps_from_trace

SPARSE_KEY = "_mimo_sample_indices"


pytestmark = pytest.mark.skipif(SPARSE_KEY not in bridge_source("data/megatron_mimo/collate.py"),
                                reason="this megatron-bridge's MIMO collate records no sparse modalities (PR #4986)")

MBS, GBS, ITERS = 4, 8, 4
ALL = dict(sharded_reads=True, reorder=True, packing=True, calibrate_online=False)
DEADLINE_S = 150.0
RTOL = 1e-4  # reordering and packing change summation order


def _train(rank, world, argv, features):
    """One rank of the example; counts the batches Bridge's collate marked sparse on this rank."""
    from megatron.bridge.data.megatron_mimo import collate

    real, sparse = collate.megatron_mimo_collate_fn, []

    def counting_collate(batch, modality_names):
        out = real(batch, modality_names)
        sparse.append(SPARSE_KEY in out)
        return out

    collate.megatron_mimo_collate_fn = counting_collate
    try:
        status = run_example(argv, features, {})
    finally:
        collate.megatron_mimo_collate_fn = real
    return dict(active=status["active"], notes=status["notes"], sparse=sum(sparse), batches=len(sparse))


def _run(workdir: Path, name: str, vdp: int, ldp: int, features: dict) -> dict:
    trace = workdir / f"{name}.jsonl"
    argv = ["--cpu", "--sparse", "--vision-dp", str(vdp), "--language-dp", str(ldp), "--mbs", str(MBS),
            "--gbs", str(GBS), "--train-iters", str(ITERS), "--eval-interval", "2", "--eval-iters", "1",
            "--trace", str(trace)]
    ranks = run_ranks(_train, vdp + ldp, argv, features, deadline_s=DEADLINE_S)
    records = [json.loads(line) for line in trace.read_text().splitlines()]
    return dict(ranks=ranks, steps=steps_from_trace(records), records=records)


def _assert_same_training(got: dict, want: dict) -> None:
    for it in range(1, ITERS + 1):
        for module in ("vision", "language"):
            # nothing lost, nothing duplicated: every sample of the iteration once per module
            assert got[it][module] == want[it][module] == list(range((it - 1) * GBS, it * GBS)), \
                f"iteration {it}: {module} trained other samples"
        # pairing: an image's rows spliced into another sample would change the loss
        assert got[it]["loss"] == pytest.approx(want[it]["loss"], rel=RTOL), f"iteration {it}: loss differs"


def test_a_sparse_share_goes_through_upstreams_slice_as_one_replicas_batch():
    import torch
    from megatron.bridge.data.megatron_mimo import dp_utils

    import mimo_accel
    from mimo_accel.runtime.reading.shard import SHARD_TAG_KEY, ShardTag
    from mimo_accel_dev.rehearse import stack as st

    data = st.SyntheticVLMDataset(8, st.VariedSpec(max_images=1, sides=(4,)), seq_length=32, patch_dim=8,
                                  vocab_size=2048)
    batch = st.collate_bridge([data[i] for i in range(4, 8)])  # replica 1's share of samples 0-7
    ids = batch.pop(st.SAMPLE_ID_KEY)
    images = batch["modality_inputs"]["vision"][st.ENCODER_NAME]
    present = batch[SPARSE_KEY]["vision"].tolist()
    assert 0 < len(present) < len(ids) and images["grid_thw"].size(0) == len(present)  # sparse: some have none
    text = batch["input_ids"].clone()
    batch[SHARD_TAG_KEY] = ShardTag("vision", 1, 2, 2, 4, sliced_in_step=True)
    mimo_accel.enable(sharded_reads=True)
    try:
        out = dp_utils.slice_batch_for_megatron_mimo(batch, 1, 2)
        notes = mimo_accel.status()["notes"]
    finally:
        mimo_accel.disable()
    # the indices are upstream's slice's to take off (MimoModel.forward has no such parameter);
    # every sample and image row of the share stays, in order
    assert SPARSE_KEY not in out and SHARD_TAG_KEY not in out
    assert torch.equal(out["input_ids"], text)
    got = out["modality_inputs"]["vision"][st.ENCODER_NAME]
    assert torch.equal(got["hidden_states"], images["hidden_states"]) and torch.equal(got["grid_thw"], images["grid_thw"])
    assert sum("PR #4986" in n for n in notes) == 1


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("sparse-modalities")


@pytest.fixture(scope="module")
def reference(workdir):
    """Upstream alone on one vision and one language replica: its DP-1 slice of the sparse batch."""
    return _run(workdir, "upstream-v1-l1", 1, 1, {})


@pytest.mark.distributed
def test_the_data_is_sparse_and_upstreams_own_slices_train_what_one_replica_trains(workdir, reference):
    # every rank's loader marked some batches sparse (0 or 1 image per sample), not all
    assert all(0 < r["sparse"] < r["batches"] for r in reference["ranks"])
    for layout in ((2, 2), (1, 2)):  # upstream's sparse slicing on its own (fan-in it refuses: uneven rows)
        _assert_same_training(_run(workdir, f"upstream-v{layout[0]}-l{layout[1]}", *layout, {})["steps"],
                              reference["steps"])


@pytest.mark.distributed
@pytest.mark.parametrize("layout,features", [((2, 1), ALL), ((1, 2), ALL), ((2, 2), ALL),
                                             ((2, 1), dict(ALL, reorder_mode="exchange"))],
                         ids=["fan-in", "fan-out", "one-to-one", "exchange-fan-in"])
def test_mimo_accel_on_sparse_modalities_trains_what_upstream_trains(workdir, reference, layout, features):
    name = f"accel-{'-'.join(map(str, layout))}-{features.get('reorder_mode', 'plan')}"
    accel = _run(workdir, name, *layout, features)
    _assert_same_training(accel["steps"], reference["steps"])
    for r in accel["ranks"]:
        assert r["active"] == ["sharded_reads", "reorder", "packing"]
        assert sum("PR #4986" in n for n in r["notes"]) == 1  # the one path, said once at enable()
    # the replicas' own shares were sparse too, and went through upstream's slice
    assert all(r["sparse"] > 0 for r in accel["ranks"])
    if layout[0] > 1:  # the plan moved samples away from the contiguous halves on the vision replicas
        vision0 = [r["ids"] for r in accel["records"] if r["module"] == "vision" and r["dp_rank"] == 0]
        assert any(sorted(ids) != list(range(lo, lo + MBS // 2))
                   for it, step in enumerate(vision0) for m, ids in enumerate(step)
                   for lo in [it * GBS + m * MBS])
