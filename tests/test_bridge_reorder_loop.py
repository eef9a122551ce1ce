"""PR #4608's reorder_buffer and mimo_accel's reorder on Bridge's own loop: never two reorders.

``examples/train_mimo.py --bridge-reorder`` puts #4608's settings on ``cfg.dataset``
(``megatron_mimo_scalable_dp``, ``megatron_mimo_intra_microbatch_reorder``) and wires them as
upstream's Qwen3.5-VL example does: when it builds its iterators it reads the flags and wraps the
train iterator in a reorder buffer. The buffer is a stand-in (``mimo_accel_dev.rehearse.reorder_buffer``:
no release and no Bridge main has #4608's reorder buffer), written from upstream's code: costs all-gathered over
the module's DP group, each micro-batch planned alone by equal-size LPT over lcm(DPs) groups. On a
Bridge without scalable reads every rank reads the whole micro-batch, so its exchange is the
micro-batch laid out in the plan, which the step then slices; on one with them (#5525, which reads
the same flag) every rank reads its share, and the stand-in exchanges the shares.

Upstream alone (1:1, one image of one size per sample: upstream 0.6.2's slice cannot cut uneven
images; the plan still moves samples, since equal costs go round-robin over the groups): the
stand-in reorders, and each iteration's vision samples are its language
samples. With mimo_accel's reorder on (1:1 and fan-in): mimo_accel's plan replaces it, said once,
the script builds no buffer, and the traced samples pair, iteration by iteration, as upstream's.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mimo_accel_dev.rehearse.ranks import run_ranks

from ._example import run_example, steps_from_trace

pytestmark = pytest.mark.distributed

MBS, GBS, ITERS = 4, 8, 2
ALL = dict(sharded_reads=True, reorder=True, packing=True)
DEADLINE_S = 150.0
RTOL = 1e-4  # reordering and packing change summation order


def _status(rank, world, argv, features, env):
    return run_example(argv, features, env)


def _run(workdir: Path, name: str, vdp: int, ldp: int, features: dict, *extra: str):
    trace = workdir / f"{name}.jsonl"
    argv = ["--cpu", "--bridge-reorder", *extra, "--vision-dp", str(vdp), "--language-dp", str(ldp),
            "--mbs", str(MBS), "--gbs", str(GBS), "--train-iters", str(ITERS), "--eval-interval", "0",
            "--trace", str(trace)]
    statuses = run_ranks(_status, vdp + ldp, argv, features, {}, deadline_s=DEADLINE_S)
    records = [json.loads(line) for line in trace.read_text().splitlines()]
    return records, statuses


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("bridge-reorder")


@pytest.fixture(scope="module")
def bridge_alone(workdir):
    return _run(workdir, "bridge-1to1", 2, 2, {})


def _assert_paired(records) -> dict:
    steps = steps_from_trace(records)
    assert sorted(steps) == list(range(1, ITERS + 1))
    for it, step in steps.items():
        # the single sampler's global order: iteration it trains samples [(it-1)·GBS, it·GBS)
        assert step["vision"] == step["language"] == list(range((it - 1) * GBS, it * GBS)), f"iteration {it}"
    return steps


def test_bridge_reorder_alone_moves_samples_and_keeps_pairing(bridge_alone):
    records, _ = bridge_alone
    assert all(r["bridge_reorder"] for r in records)  # the stand-in wrapped every rank's iterator
    _assert_paired(records)
    # without a plan, replica r of micro-batch k holds the r-th contiguous slice of it
    contiguous = {(r["iteration"], k, r["dp_rank"]):
                  list(range((r["iteration"] - 1) * GBS + k * MBS + r["dp_rank"] * (MBS // r["dp_size"]),
                             (r["iteration"] - 1) * GBS + k * MBS + (r["dp_rank"] + 1) * (MBS // r["dp_size"])))
                  for r in records if r["module"] == "vision" for k in range(len(r["ids"]))}
    planned = {(r["iteration"], k, r["dp_rank"]): sorted(micro)
               for r in records if r["module"] == "vision" for k, micro in enumerate(r["ids"])}
    assert planned != contiguous, "the stand-in planned no micro-batch away from the contiguous split"


@pytest.mark.parametrize("vdp, ldp", [(2, 2), (2, 1)], ids=["one-to-one", "fan-in"])
def test_mimo_accel_reorder_replaces_bridges(workdir, bridge_alone, vdp, ldp):
    # 1:1 on upstream's data (one image of one size per sample: upstream 0.6.2's slice cannot cut
    # uneven images); fan-in on 0-3 images of varied sizes, which only mimo_accel's reads can cut
    extra = () if (vdp, ldp) == (2, 2) else ("--varied",)
    records, statuses = _run(workdir, f"accel-{vdp}to{ldp}", vdp, ldp, ALL, *extra)
    assert not any(r["bridge_reorder"] for r in records)  # the script read the flag off: no buffer
    steps = _assert_paired(records)
    for st in statuses:
        assert "reorder" in st["active"]
        said = [n for n in st["notes"] if "replaces PR #4608's reorder buffer" in n]
        assert len(said) == 1 and "megatron_mimo_intra_microbatch_reorder" in said[0]
    if (vdp, ldp) == (2, 2):  # the same training as upstream's reorder, by the per-token loss
        want = steps_from_trace(bridge_alone[0])
        for it in steps:
            assert steps[it]["loss"] == pytest.approx(want[it]["loss"], rel=RTOL), f"iteration {it}"

