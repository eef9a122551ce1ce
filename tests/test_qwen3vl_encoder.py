"""Bridge's own Qwen3-VL vision model (``Qwen3VLVisionModel``, megatron-core local specs) as the
MIMO vision encoder: ``StackConfig(encoder="qwen3vl")`` / ``examples/train_mimo.py --encoder
qwen3vl``.

- Alone on one gloo rank: forward and backward over two images of different sizes packed in one
  input, every parameter gets a gradient, ``t·h·w / 4`` rows per image, no attention across
  images; a replica with no image in its share gets ``[0, H]`` rows that still backpropagate.
- Through Bridge's ``pretrain_megatron_mimo`` on real JPEG/PNG files (Bridge's
  ``MegatronMIMODataset`` with placeholders per image following its grid), upstream on vision
  dp1 → language dp1 against mimo_accel (sharded reads, reorder, packing) on vision dp2 →
  language dp1 (fan-in): per iteration, the same samples trained by each module and the same
  global per-token loss.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mimo_accel_dev.rehearse.ranks import run_ranks

from ._example import load_example, run_example, steps_from_trace

pytestmark = pytest.mark.distributed

MBS, GBS, ITERS, SEQ, MAX_ROWS = 4, 8, 3, 64, 16
ALL = dict(sharded_reads=True, reorder=True, packing=True)
RTOL = 1e-4  # as tests/test_pretrain_loop.py: reordering and packing change summation order
DEADLINE_S = 150.0


# One rank, the encoder alone ----------------------------------------------------------------

def _encoder_alone(rank, world):
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state
    from megatron.core.process_groups_config import ProcessGroupCollection

    from mimo_accel_dev.rehearse import cpu, qwen3vl

    # What build_megatron_mimo_model provides inside MIMO (bridge/models/megatron_mimo/build_model.py).
    parallel_state._set_global_memory_buffer()
    cpu.seed_cpu_rng_tracker(1)
    torch.manual_seed(0)
    g = dist.group.WORLD
    spec = qwen3vl.encoder_spec(hidden=32, layers=1, heads=4, out_hidden=24)
    model = spec.module(**spec.params, pg_collection=ProcessGroupCollection(tp=g, cp=g, pp=g, dp=g, dp_cp=g))

    grid = torch.tensor([[1, 4, 6], [1, 8, 2]])  # 24 and 16 patches
    x = torch.randn(int(grid.prod(-1).sum()), qwen3vl.PATCH_DIM)
    out, deepstack = model(x, grid)
    (out * torch.randn_like(out)).sum().backward()
    no_grad = [n for n, p in model.named_parameters()
               if p.grad is None or not bool(torch.isfinite(p.grad).all()) or float(p.grad.abs().sum()) == 0]

    with torch.no_grad():  # images do not see each other: changing image 0 leaves image 1's rows alone
        x2 = x.clone()
        x2[:24] += 1.0
        out2, _ = model(x2, grid)
    empty, _ = model(torch.zeros(0, qwen3vl.PATCH_DIM), torch.zeros(0, 3, dtype=torch.long))
    empty.sum().backward()
    try:
        model(x[:-1], grid)
        bad_input = None
    except ValueError as exc:
        bad_input = str(exc)
    return {"shape": tuple(out.shape), "deepstack": len(deepstack), "no_grad": no_grad,
            "params": sum(1 for _ in model.parameters()),
            "image0_changed": float((out2[:6] - out[:6]).abs().max()),
            "image1_changed": float((out2[6:] - out[6:]).abs().max()),
            "empty": tuple(empty.shape), "empty_requires_grad": empty.requires_grad, "bad_input": bad_input,
            "attention": type(model.decoder.layers[0].self_attention.core_attention).__name__}


def test_encoder_forward_backward_on_two_images_of_different_sizes():
    r = run_ranks(_encoder_alone, 1, deadline_s=DEADLINE_S)[0]
    assert r["shape"] == ((4 * 6 + 8 * 2) // 4, 24)  # Σ h·w / 4 rows of out_hidden
    assert r["deepstack"] == 0
    assert r["params"] > 10 and r["no_grad"] == []
    assert r["attention"] == "SegmentedCoreAttention"
    assert r["image0_changed"] > 0 and r["image1_changed"] == 0
    assert r["empty"] == (0, 24) and r["empty_requires_grad"]
    assert r["bad_input"] is not None and "grid_thw" in r["bad_input"]


def test_stack_config_refuses_what_qwen3vl_cannot_take():
    from mimo_accel_dev.rehearse.stack import StackConfig
    from mimo_accel_dev.rehearse.ranks import layout_of

    layout = layout_of(1, 1)
    assert StackConfig(layout=layout, encoder="qwen3vl").patch_dim == 3 * 2 * 16 * 16
    assert StackConfig(layout=layout).patch_dim == 24  # the default encoder is unchanged
    with pytest.raises(ValueError, match="patch_dim 1536"):
        StackConfig(layout=layout, encoder="qwen3vl", patch_dim=1176)
    with pytest.raises(ValueError, match="no resampler"):
        StackConfig(layout=layout, encoder="qwen3vl", resample_rows=4)
    with pytest.raises(ValueError, match="unknown encoder"):
        StackConfig(layout=layout, encoder="clip")


def test_example_refuses_image_rows_with_qwen3vl(capsys):
    with pytest.raises(SystemExit):
        load_example().parse_args(["--cpu", "--encoder", "qwen3vl", "--dataset", "images", "--image-rows", "4"])
    assert "--max-image-rows" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        load_example().parse_args(["--cpu", "--dataset", "images", "--max-image-rows", "4"])
    assert "applies to --encoder qwen3vl" in capsys.readouterr().err


def test_equal_work_gives_every_replica_the_same_samples(capsys):
    """``--equal-work`` (the rehearsal's floor run): each global micro-batch is one block repeated on
    every canonical group, so with sharded reads every replica of vision dp4 and language dp2
    computes the same samples."""
    from mimo_accel_dev.rehearse.bridge_script import EqualWork

    data = EqualWork(list(range(100, 132)), micro_batch=16, groups=4)
    batches = [[data[i] for i in range(mb * 16, (mb + 1) * 16)] for mb in range(2)]
    for batch, first in zip(batches, (100, 116)):
        assert [batch[g * 4:(g + 1) * 4] for g in range(4)] == [list(range(first, first + 4))] * 4  # vision dp4
        assert batch[:8] == batch[8:]  # language dp2: two groups each
    with pytest.raises(ValueError, match="must split evenly over the 3 canonical groups"):
        EqualWork([], micro_batch=16, groups=3)
    with pytest.raises(SystemExit):
        load_example().parse_args(["--cpu", "--equal-work"])
    assert "--equal-work applies to --dataset images" in capsys.readouterr().err


def test_grid_placeholders_follow_each_image(tmp_path):
    from mimo_accel_dev.rehearse import qwen3vl, stack

    ds = stack.images_dataset(tmp_path, 12, seq_length=SEQ, image_rows=MAX_ROWS, placeholders="grid",
                              processor=qwen3vl.image_processor(max_rows=MAX_ROWS), merge=qwen3vl.MERGE)
    items = [ds[i] for i in range(len(ds))]
    rows = []
    for item in items:
        vision = item["modality_inputs"].get("vision")
        want = sum(qwen3vl.rows_per_image(vision["image_grid_thw"])) if vision else 0
        assert int((item["input_ids"] == stack.IMAGE_TOKEN_ID).sum()) == want
        assert (item["input_ids"][:want] == stack.IMAGE_TOKEN_ID).all()  # Bridge's placement: first
        if vision:
            assert vision["pixel_values"].shape == (4 * want, qwen3vl.PATCH_DIM)
        rows.append(want)
    assert 0 in rows and len(set(rows) - {0}) > 1 and max(rows) <= MAX_ROWS  # no image, and varied sizes
    batch = stack.collate_mimo_images(items, patch_dim=qwen3vl.PATCH_DIM)["modality_inputs"]["vision"]["vit"]
    assert batch["hidden_states"].shape == (4 * sum(rows), qwen3vl.PATCH_DIM)

    # a processor allowing larger images than the dataset's cap: refused, naming the cause
    small = stack.images_dataset(tmp_path, 12, seq_length=SEQ, image_rows=2, placeholders="grid",
                                 processor=qwen3vl.image_processor(max_rows=MAX_ROWS), merge=qwen3vl.MERGE)
    big = next(i for i, r in enumerate(rows) if r > 2)
    with pytest.raises(ValueError, match=r"at most encoder_seq_lengths\['vision'\] = 2 .*max_pixels"):
        small[big]


def test_receipts_mix_one_tall_image_per_sample_as_the_bridge_rehearsal_reads_it(tmp_path):
    """``--image-mix receipts`` (what ``rehearse --loop bridge`` trains on): one image per sample
    (upstream can then split any micro-batch by image count), narrow, heights lognormal with a
    tall tail; Qwen3-VL's processor keeps every image within the rehearsal's row cap and its
    sequence, and a few images carry a large share of the patches."""
    from mimo_accel_dev.rehearse import qwen3vl, rehearsal, stack

    mix = stack.IMAGE_MIXES["receipts"]
    examples = stack.image_examples(tmp_path, 96, mix=mix)
    assert all(e["image"] for e in examples)
    assert examples == stack.image_examples(tmp_path, 96, mix=mix)  # deterministic: every rank agrees
    cap = int(rehearsal.BRIDGE_MODEL[rehearsal.BRIDGE_MODEL.index("--max-image-rows") + 1])
    ds = stack.images_dataset(tmp_path, 96, seq_length=rehearsal.BRIDGE_SEQ, image_rows=cap, placeholders="grid",
                              processor=qwen3vl.image_processor(max_rows=cap), merge=qwen3vl.MERGE, mix=mix)
    patches = []
    for i in range(len(ds)):
        grid = ds[i]["modality_inputs"]["vision"]["image_grid_thw"].reshape(-1, 3)
        assert grid.size(0) == 1 and int(grid[0, 2]) in (6, 8)  # narrow: 96-128 px
        patches.append(int(grid.prod()))
    patches.sort()
    assert max(patches) // 4 <= cap and patches[len(patches) // 2] <= 160
    assert max(patches) >= 5 * patches[len(patches) // 2]  # the tall tail
    # ~10% of the images carry ~half the attention work (Σp²): a contiguous split is uneven
    assert sum(p * p for p in patches[-10:]) > 0.4 * sum(p * p for p in patches)


# Bridge's training loop, real image files ---------------------------------------------------

def _train(rank, world, argv, features, env):
    """One rank: the example's own main(), with mimo_accel enabled first when asked; also records
    which encoder class the example registered."""
    from mimo_accel_dev.rehearse import stack

    encoders = []
    build_provider = stack.build_provider

    def recording_build_provider(cfg):
        provider = build_provider(cfg)
        spec = provider.modality_submodules_spec["vision"].submodules["encoders"][stack.ENCODER_NAME]
        encoders.append([c.__name__ for c in spec.module.__mro__[:2]])
        return provider

    stack.build_provider = recording_build_provider
    try:
        return {"active": run_example(argv, features, env)["active"], "encoders": encoders}
    finally:
        stack.build_provider = build_provider


def _run(workdir: Path, name: str, vdp: int, ldp: int, features: dict) -> dict:
    trace = workdir / f"{name}.jsonl"
    argv = ["--cpu", "--encoder", "qwen3vl", "--dataset", "images", "--image-dir", str(workdir / "images"),
            "--max-image-rows", str(MAX_ROWS), "--vision-dp", str(vdp), "--language-dp", str(ldp),
            "--mbs", str(MBS), "--gbs", str(GBS), "--seq-length", str(SEQ), "--train-iters", str(ITERS),
            "--eval-interval", "0", "--trace", str(trace)]
    env = {"MIMO_ACCEL_CACHE_DIR": str(workdir / f"cache-{name}")}
    ranks = run_ranks(_train, vdp + ldp, argv, features, env, deadline_s=DEADLINE_S,
                      log_file=workdir / f"{name}.log")
    return {"ranks": ranks, "records": [json.loads(line) for line in trace.read_text().splitlines()]}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("qwen3vl-images")
    return _run(workdir, "upstream-v1-l1", 1, 1, {}), _run(workdir, "accel-v2-l1", 2, 1, ALL)


def test_bridge_loop_with_qwen3vl_matches_upstream_under_fan_in(runs):
    upstream, accel = runs
    assert all(r["active"] == [] for r in upstream["ranks"])
    assert all(r["active"] == ["sharded_reads", "reorder", "packing"] for r in accel["ranks"])
    for r in upstream["ranks"] + accel["ranks"]:
        assert r["encoders"] == [["Qwen3VLEncoder", "Qwen3VLVisionModel"]]

    want, got = steps_from_trace(upstream["records"]), steps_from_trace(accel["records"])
    assert list(want) == list(got) == list(range(1, ITERS + 1))
    for it in want:
        contiguous = list(range((it - 1) * GBS, it * GBS))
        assert want[it]["vision"] == want[it]["language"] == contiguous
        assert got[it]["vision"] == got[it]["language"] == contiguous, f"iteration {it}"
        assert 0 < want[it]["loss"] < 20
        assert got[it]["loss"] == pytest.approx(want[it]["loss"], rel=RTOL), f"iteration {it}: loss differs"
    # the model learned something: the loss moved between the first and the last iteration
    assert want[ITERS]["loss"] != want[1]["loss"]

    # Both vision replicas trained (fan-in), every global micro-batch split between them in full,
    # and the plan (costs derived from the image files through Qwen3-VL's 16 px resize rule) moved
    # samples off the contiguous halves.
    vision = {(r["dp_rank"], r["iteration"]): r["ids"] for r in accel["records"] if r["module"] == "vision"}
    assert {d for d, _ in vision} == {0, 1}
    moved = 0
    for it in range(1, ITERS + 1):
        for m in range(GBS // MBS):
            first = (it - 1) * GBS + m * MBS
            assert sorted(vision[(0, it)][m] + vision[(1, it)][m]) == list(range(first, first + MBS))
            moved += sorted(vision[(0, it)][m]) != list(range(first, first + MBS // 2))
    assert moved > 0, vision


# `mimo-accel rehearse --loop bridge` --------------------------------------------------------

def test_rehearse_bridge_loop_runs_the_example_with_qwen3vl_and_reports(tmp_path):
    from rich.console import Console

    from mimo_accel_dev.commands import rehearse as rehearsing
    from mimo_accel.tools.report import REPORT_FORMAT, STABLE_KEYS

    console = Console(file=open(tmp_path / "out.txt", "w"), width=120)
    # small (the demo's sizes are rehearsal.BRIDGE_DEFAULTS: 8 ranks, 48 samples a step, ~2 min)
    # with the demo's peer, #4608's reorder_buffer, as the third run (its table and JSON shape checked here),
    # named by its old name, which is still taken and said once
    result = rehearsing.rehearse_bridge(steps=2, vision_dp=2, language_dp=2, micro_batch=8, peer="upstream",
                                        out_dir=str(tmp_path / "runs"), json_path=str(tmp_path / "r.json"),
                                        console=console)
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["format"] == REPORT_FORMAT and doc["loop"] == "bridge" and set(doc) == set(result)
    for side in ("before", "after"):
        assert all(key in doc[side] for key in STABLE_KEYS)
    assert doc["before"]["label"] == result["before_label"] and doc["after"]["label"] == "accelerated"
    # both runs trained both iterations with the same loss tokens (checked against the losses in rehearse)
    before, after = result["losses"]["before"], result["losses"]["after"]
    assert len(before) == len(after) == 2 and [b[1] for b in before] == [a[1] for a in after]
    assert all(b[0] / b[1] == pytest.approx(a[0] / a[1], rel=RTOL) for b, a in zip(before, after))
    if result["before_label"] == "sharded":
        # upstream 0.6.2 slices patch-packed images by image count: 0/1-image samples cannot be
        # split over 2 vision replicas. The report says so.
        assert "upstream cannot run" in result["before_note"]
    assert "peer_name" not in doc and doc["peer"]["name"] == "#4608's reorder_buffer (ce55b79f)"
    # the machine's floor: every replica given the same samples, beside each module's straggler
    assert set(doc["floor"]["modules"]) == {"vision", "language"} and doc["floor"]["steps"] == 7
    assert all(v >= 1.0 for v in doc["floor"]["modules"].values())
    assert doc["after"]["per_module"]["vision"]["floor"] == doc["floor"]["modules"]["vision"]
    assert doc["peer"]["label"] == "peer-reorder-buffer" and "per_module" in doc["peer"]
    assert doc["peer"]["language_worse"] in (True, False)
    console.file.close()
    text = (tmp_path / "out.txt").read_text()
    assert "Per-iteration global loss" in text and "vision straggler" in text and "the machine's floor" in text
    assert "Upstream as shipped, #4608's reorder_buffer (ce55b79f) and mimo_accel" in text
    assert text.count("--peer upstream is the old name of --peer reorder-buffer") == 1
    assert "the language model worse than mimo_accel's plan" in text
    # the profiler timed the encoder's forward and backward on both vision replicas, in both runs
    for side in ("before", "after"):
        vision = doc[side]["per_module"]["vision"]
        assert vision["replicas"] == 2
        assert all(r["fwd_mean"] > 0 and r["bwd_mean"] > 0 for r in vision["per_rank"].values())


def test_rehearse_refuses_options_of_the_other_loop(capsys):
    from mimo_accel_dev.rehearse import rehearsal
    from mimo_accel_dev.commands import rehearse as rehearsing

    assert rehearsing.main(["--loop", "bridge", "--workload", "receipts"]) == 2
    assert "mimo-accel rehearse: error: --workload applies to --loop stack" in capsys.readouterr().err
    assert rehearsing.main(["--example", "x.py"]) == 2
    assert "mimo-accel rehearse: error: --example applies to --loop bridge" in capsys.readouterr().err
    with pytest.raises(FileNotFoundError, match="--example"):
        rehearsal.example_script("/nonexistent/train_mimo.py")
