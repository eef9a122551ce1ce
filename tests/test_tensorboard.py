"""``examples/train_mimo.py --tensorboard-dir DIR`` on CPU gloo ranks: Bridge's own logger writes
the event files (on the last rank), and with the profiler on mimo_accel's per-step figures are in
them under ``mimo_accel/``, read back here with tensorboard's own reader."""

from __future__ import annotations

from pathlib import Path

import pytest

from mimo_accel_dev.rehearse.ranks import run_ranks

from ._example import train_rank

pytestmark = pytest.mark.distributed

VDP, LDP, MBS, GBS, ITERS = 2, 2, 4, 8, 3


def _scalars(directory: Path) -> dict:
    """tag -> [(step, value)] of every scalar in the event files under ``directory``, and
    ``histogram:<tag>`` -> [(step, number of values)] of every histogram."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    files = list(directory.glob("events.out.tfevents.*"))
    assert len(files) == 1, files  # one writer: Bridge's, on the last rank
    acc = EventAccumulator(str(directory), size_guidance={"histograms": 0})  # 0: every step (default: the last)
    acc.Reload()
    out = {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
    out.update({f"histogram:{tag}": [(e.step, e.histogram_value.num) for e in acc.Histograms(tag)]
                for tag in acc.Tags()["histograms"]})
    return out


def _train(tmp_path: Path, name: str, features: dict, *extra: str) -> dict:
    tb = tmp_path / name / "tb"
    argv = ["--cpu", "--vision-dp", str(VDP), "--language-dp", str(LDP), "--mbs", str(MBS), "--gbs", str(GBS),
            "--train-iters", str(ITERS), "--eval-interval", "0", "--tensorboard-dir", str(tb), *extra]
    run_ranks(train_rank, VDP + LDP, argv, features, {}, deadline_s=150)
    return _scalars(tb)


def test_the_example_logs_mimo_accel_figures_through_bridges_tensorboard_writer(tmp_path):
    features = dict(sharded_reads=True, reorder=True, packing=True, profile=str(tmp_path / "profile"))
    got = _train(tmp_path, "accel", features, "--varied")  # 0-3 images of varied sizes: something to balance
    steps = list(range(1, ITERS + 1))
    assert [s for s, _ in got["lm loss"]] == steps  # Bridge's own scalars, in the same file
    for module in ("vision", "language"):
        straggler = got[f"mimo_accel/{module}/straggler"]
        assert [s for s, _ in straggler] == steps
        assert all(1.0 <= v < 3.0 for _, v in straggler), straggler
        assert all(v > 0 for _, v in got[f"mimo_accel/{module}/slowest_replica_s"])
        assert {v for _, v in got[f"mimo_accel/{module}/slowest_replica"]} <= {0.0, 1.0}
        # the plan priced every module (reorder is on)
        assert all(v >= 1.0 for _, v in got[f"mimo_accel/{module}/straggler_planned"])
    # sharded reads: each replica reads its share of the global batch, nothing more
    assert [v for _, v in got["mimo_accel/vision/samples_read_per_rank"]] == [GBS / VDP] * ITERS
    assert [v for _, v in got["mimo_accel/language/samples_read_per_rank"]] == [GBS / LDP] * ITERS
    assert [v for _, v in got["mimo_accel/reads/samples"]] == [2 * GBS] * ITERS
    assert all(v > 0 for _, v in got["mimo_accel/reads/bytes"])
    # packed: the real tokens each language replica computed, one histogram of the replicas a step
    assert all(0 < v <= GBS / LDP * 64 for _, v in got["mimo_accel/language/tokens_max"])
    assert [s for s, _ in got["histogram:mimo_accel/language/tokens"]] == steps
    assert all(count == LDP for _, count in got["histogram:mimo_accel/language/tokens"])
    assert all(v >= 1.0 for _, v in got["mimo_accel/language/tokens_straggler"])
    # each module's throughput, from the FLOPs shapes of its TransformerConfig; no MFU on CPU (no peak)
    for module in ("vision", "language"):
        for figure in ("samples_per_s", "tokens_per_s_per_gpu", "tflops_per_gpu"):
            values = got[f"mimo_accel/{module}/{figure}"]
            assert [s for s, _ in values] == steps and all(v > 0 for _, v in values), (module, figure, values)
    assert got["mimo_accel/vision/samples_per_s"] == got["mimo_accel/language/samples_per_s"]  # GBS per step each
    # each module's busy share of the step replayed from every rank's micro-batch times: a share of it
    for module in ("vision", "language"):
        shares = got[f"mimo_accel/{module}/busy_share"]
        assert [s for s, _ in shares] == steps and all(0 < v <= 1 for _, v in shares), (module, shares)
    assert not [tag for tag in got if tag.endswith("/mfu")]


@pytest.mark.parametrize("features, written", [
    # reorder alone learns its cost model online from the profiler's timers: the figures are written
    (dict(reorder=True), True),
    # nothing measured (no profiler, the cost model pinned): Bridge's scalars alone
    (dict(reorder=True, packing=True, calibrate_online=False), False),
], ids=["reorder-alone", "pinned"])
def test_without_the_profiler_the_figures_come_with_online_calibration_only(tmp_path, features, written):
    """What docs/usage.md ("TensorBoard and W&B") says of a run without ``profile``."""
    got = _train(tmp_path, "no-profiler", features, "--varied")
    assert [s for s, _ in got["lm loss"]] == list(range(1, ITERS + 1))
    ours = sorted(tag for tag in got if tag.startswith("mimo_accel/"))
    if written:
        assert "mimo_accel/vision/straggler" in ours and "mimo_accel/vision/cost_model/a" in ours, ours
        assert [v for _, v in got["mimo_accel/vision/samples_read_per_rank"]] == [GBS / VDP] * ITERS
    else:
        assert ours == []


def test_without_the_profiler_bridge_logs_alone(tmp_path):
    got = _train(tmp_path, "upstream", {})  # upstream as shipped (it cannot slice --varied's uneven rows)
    assert [s for s, _ in got["lm loss"]] == list(range(1, ITERS + 1))
    assert not [tag for tag in got if tag.startswith("mimo_accel/")]
