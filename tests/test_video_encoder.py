"""A "video" encoder declared through the public API only, end to end: its costs (a cost index of
videos, saved and loaded), the plan, the profiler (real recorders and module timers), calibration
and the report, and the simulation of a workload with a ``[video]`` encoder.

The CPU rehearsal does not apply: its stack trains an image and an audio encoder, and megatron-core
has no video submodule class to build one on.
"""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from rich.console import Console

from mimo_accel.costs import CostIndex, CostModel, ModuleCost, ResizeRule
from mimo_accel.modules import LANGUAGE, Modules
from mimo_accel.planner import CostIndexPlanner

VIDEO = "video"
RULE = ResizeRule(patch_size=16, merge_size=2, min_pixels=200704, max_pixels=1003520)
LAYOUT = Modules.from_dp_sizes({VIDEO: 4, LANGUAGE: 2})


def _videos(n: int, seed: int) -> CostIndex:
    """``n`` samples, each with 0 or 1 video of a drawn length and frame size, and its text."""
    rng = np.random.default_rng(seed)
    items = (rng.random(n) < 0.6).astype(np.int64)
    rows, sq_rows = np.zeros(n, np.int64), np.zeros(n, np.int64)
    for i in np.flatnonzero(items):
        frames = int(rng.integers(2, 64))
        height, width = int(rng.choice([360, 720, 1080])), int(rng.choice([640, 1280]))
        rows[i], sq_rows[i] = RULE.video_rows(frames, height, width)
    tokens = rows // RULE.merge_size**2 + rng.integers(20, 400, n)
    return CostIndex(tokens, {VIDEO: (items, rows, sq_rows, RULE)})


def test_a_video_layout_costs_and_plans(tmp_path):
    assert [(m.name, m.kind) for m in LAYOUT] == [(VIDEO, "video"), (LANGUAGE, "text")] and LAYOUT.grid == 4
    index = _videos(256, seed=1)
    index.save(tmp_path / "videos.npz")
    loaded = CostIndex.load(tmp_path / "videos.npz")
    assert loaded.encoders == (VIDEO,) and loaded.digest() == index.digest()

    model = CostModel(modules={VIDEO: ModuleCost(a=2e-5, b=3e-9, k=1e-3), LANGUAGE: ModuleCost(a=1e-5, b=1e-9)})
    planner = CostIndexPlanner(loaded, model, LAYOUT)
    every = np.arange(len(index))
    costs = planner.costs(every)
    col = index.encoder(VIDEO)
    np.testing.assert_allclose(costs[VIDEO], 2e-5 * col.rows + 3e-9 * col.sq_rows + 1e-3 * col.items)
    np.testing.assert_allclose(costs[LANGUAGE], 1e-5 * index.tokens(every) + 1e-9 * index.tokens(every) ** 2.0)

    from mimo_accel.balance import module_spreads

    for batch in np.split(every, 4):  # global micro-batches of 64 samples
        order, predicted = planner(batch.tolist())
        spreads = predicted.spreads
        assert sorted(order) == sorted(batch.tolist()) and set(spreads) == {VIDEO, LANGUAGE}
        upstream = module_spreads(planner.costs(batch), LAYOUT.dp_sizes, np.arange(batch.size))
        assert max(spreads.values()) < max(upstream.values())  # the plan beats the contiguous split


def _profile_run(directory, work: dict[int, list[int]]):
    """Real recorders of a video dp4 -> language dp2 job, each rank timing its module with a real
    module timer over ``work[rank][step]`` rows (the language ranks: as many tokens)."""
    from mimo_accel.profiler import Recorder, attach_module_timer, module_counters, module_regions

    for rank, steps in work.items():
        module, dp_rank = (VIDEO, rank) if rank < 4 else (LANGUAGE, rank - 4)
        rec = Recorder(directory, rank=rank, world_size=6, module=module, dp_rank=dp_rank,
                       dp_size=LAYOUT[module].dp, layout={"dp": LAYOUT.dp_sizes}, label="video", device="cpu",
                       regions=module_regions(module), counters=module_counters(module) if module != LANGUAGE else (),
                       run_id="video-run")  # one run, as the runtime names it on every rank
        torch.manual_seed(rank)
        net = torch.nn.Sequential(torch.nn.Linear(32, 256), torch.nn.Tanh(), torch.nn.Linear(256, 1))
        net(torch.randn(max(steps), 32)).sum().backward()  # warm, untimed
        timer = attach_module_timer(net, rec, name=module)
        for rows in steps:
            net(torch.randn(rows, 32)).sum().backward()
            if module == VIDEO:
                rec.add(samples=4, **{f"{VIDEO}_items": 1, f"{VIDEO}_rows": rows, f"{VIDEO}_sq_rows": rows * rows})
            else:
                rec.add(samples=8, tokens=rows, sq_tokens=rows * rows)
            rec.end_step()
        timer.remove()
        rec.close()


def test_a_video_encoder_is_profiled_calibrated_and_reported(tmp_path):
    from mimo_accel.profiler.run import read_run
    from mimo_accel.tools import report
    from mimo_accel.profiler.observations import modules_in

    base = np.random.default_rng(3).integers(1000, 3000, 6).tolist()  # a step's rows per replica
    # replica 3 of the video encoder draws four times the others' rows in every step
    work = {r: [b * (4 if r == 3 else 1) for b in base] for r in range(6)}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the regions' clock is the calling thread's CPU time: all the work on it
    try:
        _profile_run(tmp_path, work)
    finally:
        torch.set_num_threads(threads)
    run = read_run(tmp_path)
    assert [run.ranks[r].module for r in range(6)] == [VIDEO] * 4 + [LANGUAGE] * 2 and not run.warnings
    assert run.ranks[0].module_regions == ("video_fwd", "video_bwd")
    assert modules_in(run) == [VIDEO, LANGUAGE]  # calibration fits the video encoder by its own counters

    s = report.summarize(run)
    assert s["module_order"] == [VIDEO, LANGUAGE] and s["per_module"][VIDEO]["replicas"] == 4
    assert s["video_max_over_mean_p50"] > 1.5 and s["per_module"][VIDEO]["slowest"]["dp_rank"] == 3
    assert s["video_time_mean"] == s["per_module"][VIDEO]["time_mean"] > 0
    assert not any(k.startswith("vision") for k in s)  # the encoder's figures under its own name only
    out = io.StringIO()
    report.render(s, console=Console(file=out, width=160))
    text = out.getvalue()
    assert "video straggler max/mean p50" in text and "Video encoder time per rank" in text
    assert "slowest video: DP replica 3 (rank 3)" in text
    assert "vision straggler" not in text  # nothing is shown twice under the old name


def _video_profile() -> str:
    """The shipped receipts workload with a video encoder of its own (dp 4 beside vision dp 8)."""
    from mimo_accel.workloads import load_profile

    return (load_profile("receipts").path.read_text()
            .replace("[layout]", """[video]
count = { 0 = 0.6, 1 = 0.4 }
frames = { dist = "uniform", min = 2, max = 32 }
height = { dist = "choice", values = [360, 720], p = [0.5, 0.5] }
width = 640

[layout]""", 1)
            .replace("seq_length = 8192", "seq_length = 32768", 1)
            .replace("language = { tp = 4, pp = 1, dp = 4 }", "language = { tp = 4, pp = 1, dp = 4 }\nvideo = { dp = 4 }", 1))


def test_a_workload_with_a_video_encoder_is_priced_and_balanced(tmp_path):
    from mimo_accel.balance import balance_modules, module_bounds, module_spreads
    from mimo_accel.workloads import load_profile

    path = tmp_path / "clips.toml"
    path.write_text(_video_profile())
    prof = load_profile(path)
    assert [(m.name, m.kind) for m in prof.modules] == [("vision", "image"), (VIDEO, "video"), (LANGUAGE, "text")]
    t = prof.sample_table(500, seed=2)
    video = t.encoders[VIDEO]
    assert set(np.unique(video.items)) == {0, 1} and (video.rows[video.items == 0] == 0).all()
    assert np.array_equal(t.tokens, t.placeholders["vision"] + t.placeholders[VIDEO] + t.text_tokens)
    assert np.array_equal(t.placeholders[VIDEO], video.rows // 4) and (t.tokens <= prof.seq_length).all()
    # the planner prices the video encoder by its own column, and every module is balanced at once
    model = CostModel(modules={VIDEO: ModuleCost(3.0, 1e-4)})
    dps = prof.modules.dp_sizes
    n = 12 * prof.modules.grid
    costs = CostIndexPlanner(t.cost_index(), model, prof.modules).costs(np.arange(n))
    assert np.array_equal(costs[VIDEO], 3.0 * video.rows[:n] + 1e-4 * video.sq_rows[:n])
    joint = module_spreads(costs, dps, balance_modules(costs, dps))
    contiguous = module_spreads(costs, dps, list(range(n)))
    assert max(joint.values()) < max(contiguous.values())
    assert all(module_bounds(costs, dps)[m] <= joint[m] + 1e-9 for m in dps)


def test_the_profiler_places_an_encoder_it_was_not_shown_by_its_kind():
    """On a language rank of a vision + video layout, an encoder submodule the step did not name is
    the layout's encoder of its kind. megatron-core has no video submodule class: a stand-in."""
    from mimo_accel.config import AccelConfig
    from mimo_accel.runtime.measuring.profiling import Profiling
    from mimo_accel.runtime.context import ShardContext
    from mimo_accel.runtime.state import Runtime

    class VideoModalitySubmodules(torch.nn.Module):
        pass

    runtime = Runtime(AccelConfig(profile="unused"))
    runtime.context = ShardContext(module=LANGUAGE, dp_rank=0, dp_size=2, grid=4,
                                   dp_sizes={"vision": 4, VIDEO: 2, LANGUAGE: 2})
    profiling = Profiling(runtime)
    try:
        assert profiling.module_of(VideoModalitySubmodules()) == VIDEO
        assert runtime.notices() == {}
    finally:
        profiling.close()


@pytest.mark.parametrize("bad, where", [
    (("video = { dp = 4 }\n", ""), "layout.video: missing (the profile has a [video] encoder)"),
    (("width = 640\n", "width = 1\n"), "video: a frame could have an aspect ratio above 200"),
    (("seq_length = 32768", "seq_length = 8192"), "video tokens"),
])
def test_a_bad_video_section_names_the_key(tmp_path, bad, where):
    from mimo_accel.workloads import ProfileError, load_profile

    path = tmp_path / "clips.toml"
    path.write_text(_video_profile().replace(*bad, 1))
    with pytest.raises(ProfileError) as info:
        load_profile(path)
    assert where in str(info.value)
