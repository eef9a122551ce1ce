"""``examples/train_mimo.py --dataset images``: Bridge's own ``MegatronMIMODataset`` over real
JPEG/PNG files, trained by Bridge's ``pretrain_megatron_mimo`` on CPU gloo ranks, with NO cost
index and no extra flag — mimo_accel derives the per-sample costs from the examples, balances the
vision replicas, and packs the language shard with lengths from loss_mask (the dataset's
attention_mask is all ones).

Upstream runs one vision and one language replica (its image-count slicing cannot pair samples
with 0/1 images across vision replicas); mimo_accel runs fan-in, vision DP 2 -> language DP 1.
With the per-token loss the global loss of an iteration does not depend on who computed which
sample, so per iteration: the same samples, the same loss.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from mimo_accel_dev.rehearse.ranks import run_ranks

from ._example import run_example, steps_from_trace

pytestmark = pytest.mark.distributed

MBS, GBS, ITERS, SEQ, ROWS = 4, 8, 4, 64, 4
ALL = dict(sharded_reads=True, reorder=True, packing=True)
RTOL = 1e-4
DEADLINE_S = 150.0


def _train(rank, world, argv, features, env):
    """One rank: the example's own main(), with mimo_accel enabled first when asked."""
    status = run_example(argv, features, env)
    return {"active": status["active"], "notes": status.get("notes", [])}


def _run(workdir: Path, name: str, vdp: int, ldp: int, features: dict) -> dict:
    trace, log = workdir / f"{name}.jsonl", workdir / f"{name}.log"
    argv = ["--cpu", "--dataset", "images", "--image-dir", str(workdir / "images"), "--image-rows", str(ROWS),
            "--vision-dp", str(vdp), "--language-dp", str(ldp), "--mbs", str(MBS), "--gbs", str(GBS),
            "--seq-length", str(SEQ), "--train-iters", str(ITERS), "--eval-interval", "2", "--eval-iters", "1",
            "--save", str(workdir / f"ckpt-{name}"), "--trace", str(trace)]
    env = {"MIMO_ACCEL_CACHE_DIR": str(workdir / f"cache-{name}")}
    ranks = run_ranks(_train, vdp + ldp, argv, features, env, deadline_s=DEADLINE_S, log_file=log)
    records = [json.loads(line) for line in trace.read_text().splitlines()]
    return {"ranks": ranks, "records": records, "log": log.read_text(), "cache": workdir / f"cache-{name}"}


def _validation_losses(log: str) -> list[float]:
    return [float(x) for x in re.findall(r"validation loss at .*?lm loss value: ([0-9.eE+-]+)", log)]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("example-images")
    return _run(workdir, "upstream-v1-l1", 1, 1, {}), _run(workdir, "accel-v2-l1", 2, 1, ALL)


def test_images_dataset_trains_balanced_and_packed_without_an_index(runs):
    upstream, accel = runs
    assert all(r["active"] == [] for r in upstream["ranks"])
    assert all(r["active"] == ["sharded_reads", "reorder", "packing"] for r in accel["ranks"])

    # Trained with evaluation, every sample once, the same losses as upstream.
    want, got = steps_from_trace(upstream["records"]), steps_from_trace(accel["records"])
    assert list(want) == list(got) == list(range(1, ITERS + 1))
    for it in want:
        contiguous = list(range((it - 1) * GBS, it * GBS))
        assert want[it]["vision"] == want[it]["language"] == contiguous
        assert got[it]["vision"] == got[it]["language"] == contiguous, f"iteration {it}"
        assert 0 < want[it]["loss"] < 20
        assert got[it]["loss"] == pytest.approx(want[it]["loss"], rel=RTOL), f"iteration {it}: loss differs"
    evals = _validation_losses(upstream["log"])
    assert len(evals) == ITERS // 2 and _validation_losses(accel["log"]) == pytest.approx(evals, rel=RTOL)

    # Packing took its lengths from loss_mask (the language rank is the one that packs).
    language = accel["ranks"][-1]
    assert any("loss_mask" in note for note in language["notes"]), language["notes"]

    # The cost index was derived (no index configured) and cached: train and validation splits.
    from mimo_accel.costs import CostIndex

    cached = sorted(accel["cache"].glob("cost-index-*.npz"))
    assert len(cached) == 2, cached
    about = [json.loads(p.with_suffix(".json").read_text()) for p in cached]
    assert sorted(a["dataset"] for a in about) == ["MegatronMIMODataset of 16 samples",
                                                  "MegatronMIMODataset of 32 samples"]
    train = CostIndex.load(next(p for p, a in zip(cached, about) if a["samples"] == 32))
    patches = train.rows("vision", np.arange(32))
    assert (patches == 0).any() and patches.max() >= 8 * patches[patches > 0].min()  # a real spread

    # The plan moved samples between the vision replicas, and lowered the straggler's load.
    vision = {(r["dp_rank"], r["iteration"]): r["ids"] for r in accel["records"] if r["module"] == "vision"}

    def cost(indices):
        return train.sq_rows("vision", indices)

    moved, planned, contiguous = 0, 0, 0
    for it in range(1, ITERS + 1):
        for m in range(GBS // MBS):
            first = (it - 1) * GBS + m * MBS
            halves = [vision[(d, it)][m] for d in (0, 1)]
            assert sorted(halves[0] + halves[1]) == list(range(first, first + MBS))
            moved += sorted(halves[0]) != list(range(first, first + MBS // 2))
            planned += max(int(cost(np.array(h)).sum()) for h in halves)
            contiguous += max(int(cost(np.arange(first + d * MBS // 2, first + (d + 1) * MBS // 2)).sum())
                              for d in (0, 1))
    assert moved > 0
    assert planned < contiguous
