"""Online calibration in the runtime (mimo_accel.runtime.measuring.calibration), without ranks: the schedule
of models by iteration, announcements through a real TCPStore from the fitting rank to a planner
(one store value per refit, a step ahead of every plan made), the step's observations from every
rank's figures, the schedule beside the checkpoints and what a resume replays from it, and the
refusal of an announcement that comes after its iteration was planned."""

from __future__ import annotations

import datetime
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
import torch.distributed as dist

from mimo_accel.costs import CostModel, ModuleCost
from mimo_accel.costs.share_error import replica_share_error
from mimo_accel.runtime.measuring.calibration import (FILE, Announcement, Calibration, Schedule, first_refit, lead_steps,
                                            read_saved, step_observations)
from tests._hypothesis import examples

START = CostModel()
LEARNT = CostModel(modules={"vision": ModuleCost(2e-5, 1e-7, 3e-3)})
LATER = CostModel(modules={"vision": ModuleCost(3e-5, 1e-7, 1e-3), "language": ModuleCost(1e-5, 1e-9)})


@pytest.fixture()
def store():
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                           timeout=datetime.timedelta(seconds=10))
    yield lambda: dist.TCPStore("127.0.0.1", server.port, is_master=False, timeout=datetime.timedelta(seconds=10))


def test_the_schedule_plans_each_iteration_with_the_last_model_announced_for_it():
    s = Schedule(START)
    s.add(Announcement(1, 10, 7, LEARNT, {"vision": 0.01}))
    s.add(Announcement(2, 14, 11, LATER, {"language": 0.002}))
    assert [s.model_for(t) for t in (1, 9, 10, 13, 14, 99)] == [START, START, LEARNT, LEARNT, LATER, LATER]
    assert s.overheads_for(9) == {} and s.overheads_for(10) == {"vision": 0.01}
    with pytest.raises(ValueError, match="starts at iteration 14, not after the last one's 14"):
        s.add(Announcement(3, 14, 12, START))


def test_an_announcement_reaches_every_planner_before_its_iteration(store, tmp_path):
    fitter = Calibration(START, 1, save_dir=str(tmp_path))
    planner = Calibration(START, 1)
    planner_store, fitter_store = store(), store()
    assert planner.model_for(5, planner_store) == START  # a planner thread plans iteration 5 with the start
    a = fitter.announce(fitter_store, learnt_through=4, step=5 + 3, model=LEARNT, overheads={"vision": 0.01},
                        refits=[{"module": "vision", "step": 5}])
    assert (a.number, a.step, a.learnt_through) == (1, 8, 4)
    assert [planner.model_for(t, planner_store) for t in (6, 7, 8, 9)] == [START, START, LEARNT, LEARNT]
    assert planner.schedule.overheads_for(8) == {"vision": 0.01}
    # one store value per refit (the model and its iteration), besides the count every planner reads
    assert fitter_store.num_keys() == 2  # the count and announcement 1
    assert fitter.take_refits() == [{"module": "vision", "step": 5, "announced_for": 8}] and not fitter.take_refits()
    saved = json.loads((tmp_path / FILE).read_text())
    assert [x["step"] for x in saved["announcements"]] == [8]


def test_an_announcement_after_its_iteration_was_planned_stops_the_planner(store):
    fitter, planner = Calibration(START, 1), Calibration(START, 1)
    planner_store = store()
    planner.model_for(12, planner_store)  # this rank has planned up to iteration 12
    fitter.announce(store(), learnt_through=4, step=10, model=LEARNT, overheads={}, refits=[])
    with pytest.raises(RuntimeError, match="announced for iteration 10 reached this rank after it had planned "
                                           "iteration 12"):
        planner.model_for(13, planner_store)


def test_the_fitting_rank_announces_past_what_it_has_planned_itself(store):
    fitter = Calibration(START, 1)
    s = store()
    fitter.model_for(20, s)  # the fitting rank's own planner is at iteration 20
    assert fitter.announce(s, learnt_through=6, step=9, model=LEARNT, overheads={}, refits=[]).step == 22


def test_a_resume_replays_the_models_learnt_before_its_checkpoint(tmp_path):
    s = Schedule(START, (Announcement(1, 10, 7, LEARNT), Announcement(2, 16, 12, LATER)))
    (tmp_path / FILE).parent.mkdir(parents=True)
    (tmp_path / FILE).write_text(json.dumps(s.to_doc()))
    assert read_saved(str(tmp_path), 0) == []  # a fresh start: the configured model
    assert [a.number for a in read_saved(str(tmp_path), 8)] == [1]  # learnt through 7: the run had it
    assert [a.number for a in read_saved(str(tmp_path), 12)] == [1, 2]
    resumed = Calibration(START, 2, load_dir=str(tmp_path))
    resumed.restore(9)
    assert resumed.schedule.model_for(10) == LEARNT and resumed.schedule.model_for(16) == LEARNT
    assert read_saved(str(tmp_path / "nothing-here"), 9) == []  # a checkpoint without one: as before
    (tmp_path / FILE).write_text("{not json")
    with pytest.raises(ValueError, match="is not a cost-model schedule this version reads"):
        read_saved(str(tmp_path), 9)


def test_a_resumed_run_numbers_its_own_announcements_after_the_replayed_ones(store, tmp_path):
    s = Schedule(START, (Announcement(1, 10, 7, LEARNT),))
    (tmp_path / FILE).parent.mkdir(parents=True)
    (tmp_path / FILE).write_text(json.dumps(s.to_doc()))
    resumed = Calibration(START, 3, save_dir=str(tmp_path), load_dir=str(tmp_path))
    resumed.restore(9)
    a = resumed.announce(store(), learnt_through=12, step=15, model=LATER, overheads={}, refits=[])
    assert a.number == 2 and [x.number for x in read_saved(str(tmp_path), 12)] == [1, 2]


def test_a_steps_observations_are_each_replicas_longest_rank_and_its_counts():
    figures = [  # vision dp 2 with TP 2 (ranks 0-3), language dp 2 (ranks 4, 5)
        {"module": "vision", "dp_rank": 0, "time_s": 0.3, "features": [100, 5000, 1]},
        {"module": "vision", "dp_rank": 0, "time_s": 0.4, "features": [100, 5000, 1]},
        {"module": "vision", "dp_rank": 1, "time_s": 0.2, "features": [60, 1800, 2]},
        {"module": "vision", "dp_rank": 1, "time_s": 0.1, "features": [60, 1800, 2]},
        {"module": "language", "dp_rank": 1, "time_s": 0.5, "features": [300, 45000, 4]},
        {"module": "language", "dp_rank": 0, "time_s": 0.6, "features": [310, 48100, 4]},
        {"module": "unknown", "dp_rank": 0, "time_s": None, "features": None},
    ]
    out = step_observations(figures)
    x, y = out["vision"]
    assert x.tolist() == [[100, 5000, 1], [60, 1800, 2]] and y.tolist() == [0.4, 0.2]
    x, y = out["language"]
    assert x.tolist() == [[310, 48100, 4], [300, 45000, 4]] and y.tolist() == [0.6, 0.5]
    # a replica without a time: nothing to learn from this step; one replica: its scale only
    assert "vision" not in step_observations(figures[:2] + [dict(figures[2], time_s=None)])
    x, y = step_observations(figures[4:5])["language"]
    assert x.tolist() == [[300, 45000, 4]] and y.tolist() == [0.5]


def test_a_pipelined_replicas_time_is_its_stages_summed_each_its_longest_rank():
    # language tp 2 pp 2 dp 2 (ranks 1-8, pp slowest): a sample's cost is the whole model's, as the
    # step model prices it before spreading it over the stages again; a rank's stage from its place
    figures = [{"module": "vision", "dp_rank": 0, "rank": 0, "stages": 1, "time_s": 0.9, "features": [50, 900, 2]}]
    times = {1: 0.50, 2: 0.52, 3: 0.40, 4: 0.41, 5: 0.56, 6: 0.55, 7: 0.47, 8: 0.45}
    for rank in (8, 3, 5, 1, 6, 2, 7, 4):  # any order of arrival
        figures.append({"module": "language", "dp_rank": (rank - 1) // 2 % 2, "rank": rank, "stages": 2,
                        "time_s": times[rank], "features": [300 + rank % 2, 45000, 4]})
    out = step_observations(figures)
    assert out["language"][1].tolist() == pytest.approx([0.52 + 0.56, 0.41 + 0.47])
    assert out["language"][0].tolist() == [[301, 45000, 4], [301, 45000, 4]]
    assert out["vision"][1].tolist() == [0.9]


@given(stages=st.integers(1, 4), tp=st.integers(1, 3), seed=st.integers(0, 2**16))
@settings(max_examples=examples(60), deadline=None)
def test_a_replicas_time_is_the_sum_of_its_stages_maxima_whatever_the_order(stages, tp, seed):
    rng = np.random.default_rng(seed)
    t = rng.uniform(0.01, 1.0, size=(stages, tp))  # [stage, tp rank] of one replica
    figures = [{"module": "language", "dp_rank": 0, "rank": 10 + p * tp + k, "stages": stages,
                "time_s": float(t[p, k]), "features": [100, 1000, 2]} for p in range(stages) for k in range(tp)]
    shuffled = [figures[i] for i in rng.permutation(len(figures))]
    assert step_observations(shuffled)["language"][1][0] == pytest.approx(t.max(axis=1).sum())
    # a figure without its stages (one stage): the replica's longest rank, as before
    flat = [{k: v for k, v in f.items() if k != "stages"} for f in shuffled]
    assert step_observations(flat)["language"][1][0] == pytest.approx(t.max())


@pytest.mark.parametrize("window,step_micro_batches,depth,lead", [(1, 1, 3, 7), (1, 4, 3, 4), (4, 8, 3, 5),
                                                                  (8, 8, 3, 7)])
def test_the_lead_covers_every_window_a_planner_may_have_planned(window, step_micro_batches, depth, lead):
    assert lead_steps(window, step_micro_batches, depth) == lead


def test_the_fitting_rank_learns_from_gathered_figures_and_announces(store):
    """Steps whose vision replicas' times follow a per-image cost the start model lacks: a refit is
    accepted and announced for an iteration past the fitting rank's own plus the lead."""
    rng = np.random.default_rng(0)
    fitter = Calibration(START, 1)
    s = store()
    true = ModuleCost(2e-5, 1e-8, 0.02)
    refits = []
    for it in range(1, 16):
        figures = []
        for dp in range(4):
            items = int(rng.integers(1, 8))
            rows = int(rng.integers(200, 2000))
            sq = rows * rows // items
            t = float(true.encoder_costs([rows], [sq], [items])[0]) * (1 + 0.01 * rng.standard_normal())
            figures.append({"module": "vision", "dp_rank": dp, "time_s": t, "features": [rows, sq, items]})
        refits += fitter.observe(it, figures, s, current_iteration=it + 1, lead=4)
    assert refits, "no refit was accepted"
    first = fitter.schedule.announcements[0]
    assert first.step >= refits[0].step + 4 and first.learnt_through == refits[0].step - 1
    assert first.model.of("vision").k > 0  # the per-image cost the default model lacked


def _vision_step(rng, true: ModuleCost) -> list:
    figures = []
    for dp in range(4):
        items, rows = int(rng.integers(1, 8)), int(rng.integers(200, 2000))
        sq = rows * rows // items
        t = float(true.encoder_costs([rows], [sq], [items])[0]) * (1 + 0.01 * rng.standard_normal())
        figures.append({"module": "vision", "dp_rank": dp, "time_s": t, "features": [rows, sq, items]})
    return figures


def _cold(calibration: Calibration, prefetched: int = 0) -> Calibration:
    calibration.models(2, prefetched)  # a train loader of 2 micro-batches a step
    calibration.gathers = True  # the run's figures reach the fitting rank
    return calibration


def test_the_first_refit_plans_the_iteration_every_planner_waits_at(store):
    """The cold start: the first refit learns from iterations 2-4 (the first left out), and plans
    iteration 6, where every planner waits for the fitting rank's word on it."""
    rng = np.random.default_rng(1)
    fitter, planner = _cold(Calibration(START, 1)), _cold(Calibration(START, 1))
    assert first_refit(0) == 4 and planner.first_planned == 6
    planner_store, fitter_store = store(), store()
    assert planner.model_for(5, planner_store) == START  # before the first refit's iteration: no wait
    for it in range(1, 5):
        fitter.observe(it, _vision_step(rng, ModuleCost(2e-5, 1e-8, 0.02)), fitter_store, current_iteration=it + 1,
                       lead=7)
    first = fitter.schedule.announcements[0]
    assert (first.step, first.learnt_through) == (6, 4)  # not iteration 5 + the lead of 7
    assert planner.model_for(6, planner_store) == first.model != START


def test_a_planner_waits_for_the_first_refits_word_and_says_why_when_it_never_comes(store):
    planner = _cold(Calibration(START, 1))
    impatient = dist.TCPStore("127.0.0.1", store().port, is_master=False, timeout=datetime.timedelta(seconds=1))
    with pytest.raises(RuntimeError, match="did not say within the store's timeout whether its first refit, made "
                                           "from iteration 4, plans iteration 6"):
        planner.model_for(6, impatient)


def test_the_first_refits_word_is_given_when_it_is_not_accepted_or_learning_fails(store):
    fitter, planner = _cold(Calibration(START, 1)), _cold(Calibration(START, 1))
    s = store()
    for it in range(1, 4):
        fitter.observe(it, [], s, current_iteration=it + 1, lead=7)  # nothing gathered to learn from
    bad = [{"module": "vision", "dp_rank": dp, "time_s": -1.0, "features": [10, 100, 1]} for dp in range(2)]
    with pytest.raises(ValueError, match="replica times must be finite"):
        fitter.observe(4, bad, s, current_iteration=5, lead=7)
    assert planner.model_for(6, store()) == START  # the word came: no refit, the start model plans on


def test_the_first_refit_plans_past_what_the_loaders_workers_prefetch():
    # 4 batches prefetched at 2 micro-batches a step: a planner waiting at iteration 6 would hold up
    # iteration 4, whose figures the first refit learns from
    assert _cold(Calibration(START, 1), prefetched=4).first_planned == 8


@pytest.mark.parametrize("window, follows", [("step", True), (1, False)])
def test_a_step_plans_models_follow_the_machines_pace_and_a_per_micro_batch_plans_do_not(store, window, follows):
    """One vision replica (upstream's reference layout), a FLOPs start, the first steps 40 % slower
    than the rest: with reorder_window="step" (a plan that weighs the modules in seconds) the model
    announced last prices the newest steps at their measured time; a per-micro-batch window keeps
    the first scale (its plans compare replicas within a module only)."""
    rng = np.random.default_rng(1)
    fitter, s = Calibration(CostModel(fit={"start": "flops"}), 1, window=window), store()
    true = ModuleCost(2e-5, 1e-8, 0.0)
    times = {}
    for it in range(1, 14):
        rows, pace = int(rng.integers(2000, 9000)), 1.4 if it <= 5 else 1.0
        sq = rows * 300
        times[it] = (np.array([rows, sq, 4.0]), pace * float(true.encoder_costs([rows], [sq], [4])[0]))
        figures = [{"module": "vision", "dp_rank": 0, "time_s": times[it][1], "features": list(times[it][0])}]
        fitter.observe(it, figures, s, current_iteration=it + 1, lead=4)
    cost = fitter.schedule.announcements[-1].model.of("vision")
    w = np.array([cost.a, cost.b, cost.k])
    ratio = sum(times[it][0] @ w for it in (11, 12, 13)) / sum(times[it][1] for it in (11, 12, 13))
    assert (abs(ratio - 1.0) <= 0.05) == follows


def _micro(rows_per_item, cost: ModuleCost, noise, rng):
    """One encoder rank's figure of a step: its micro-batches' counts and fwd + bwd seconds."""
    feats, secs = [], []
    for rows in rows_per_item:
        r = np.asarray(rows, dtype=np.float64)
        f = [float(r.sum()), float((r * r).sum()), float(r.size)]
        feats.append(f)
        secs.append(float(np.array([cost.a, cost.b, cost.k]) @ f) * (1.0 + noise * rng.standard_normal()))
    total = [sum(col) for col in zip(*feats)]
    return {"module": "vision", "dp_rank": 0, "stages": 1, "time_s": sum(secs), "features": total,
            "micro": {"features": feats, "seconds": secs}}


def test_a_lone_replicas_micro_batches_are_its_observations():
    rng = np.random.default_rng(0)
    cost = ModuleCost(1e-4, 1e-7, 0.0)
    a = _micro([[100, 200], [50, 60], [300, 10]], cost, 0.0, rng)
    b = dict(a, rank=1, micro={"features": a["micro"]["features"],
                               "seconds": [s * 1.1 for s in a["micro"]["seconds"]]})  # its TP peer, slower
    x, y = step_observations([a, b])["vision"]
    assert x.tolist() == a["micro"]["features"] and y.tolist() == pytest.approx(b["micro"]["seconds"])
    # a peer that timed another number of micro-batches, or none: the step as one observation
    short = dict(b, micro={"features": a["micro"]["features"][:2], "seconds": a["micro"]["seconds"][:2]})
    for peer in (short, dict(b, micro=None)):
        x, y = step_observations([a, peer])["vision"]
        assert x.shape == (1, 3) and y.tolist() == pytest.approx([max(a["time_s"], peer["time_s"])])
    # two replicas: they are the observations, as before
    other = dict(a, dp_rank=1, time_s=2 * a["time_s"])
    assert step_observations([a, other])["vision"][1].tolist() == pytest.approx([a["time_s"], 2 * a["time_s"]])


def test_the_language_models_micro_batches_are_its_observations_each_its_stages_summed():
    # language tp2 pp2 dp2 (ranks 1-8, pp slowest), two micro-batches of one sample a replica: a
    # micro-batch's time is each stage's slowest rank, summed, as a replica's is
    fwd_bwd = {1: [0.10, 0.30], 2: [0.12, 0.28], 3: [0.20, 0.20], 4: [0.21, 0.19],
               5: [0.15, 0.35], 6: [0.14, 0.36], 7: [0.25, 0.22], 8: [0.24, 0.23]}
    tokens = {0: [[40, 1600, 1], [300, 90000, 1]], 1: [[120, 14400, 1], [130, 16900, 1]]}
    figures = []
    for rank in (5, 2, 8, 1, 7, 4, 6, 3):  # any order of arrival
        dp = (rank - 1) // 2 % 2
        figures.append({"module": "language", "dp_rank": dp, "rank": rank, "stages": 2,
                        "time_s": sum(fwd_bwd[rank]), "features": [sum(c) for c in zip(*tokens[dp])],
                        "micro": {"features": tokens[dp], "seconds": fwd_bwd[rank]}})
    x, y = step_observations(figures, language_per_micro_batch=True)["language"]
    assert x.tolist() == tokens[0] + tokens[1]
    assert y.tolist() == pytest.approx([0.12 + 0.15, 0.30 + 0.36, 0.21 + 0.25, 0.20 + 0.23])
    # not asked for (no step plan: a row's overhead would be a micro-batch's), or a rank without
    # them: a row per replica, as before
    rows = step_observations(figures)["language"]
    figures[0] = dict(figures[0], micro=None)
    for x, y in (rows, step_observations(figures, language_per_micro_batch=True)["language"]):
        assert x.shape == (2, 3) and y.tolist() == pytest.approx([0.40 + 0.50, 0.40 + 0.47])  # each rank's step


@pytest.mark.parametrize("per_micro_batch", [True, False])
def test_a_lone_encoders_shape_is_learnt_from_its_micro_batches(store, per_micro_batch):
    """Upstream's reference layout: one vision replica, whose step sets the pipeline's pace. Its
    true cost is far more quadratic than the start's; per micro-batch, the calibration learns the
    ratio of the terms; from the step alone it can only scale the start."""
    rng = np.random.default_rng(3)
    true = ModuleCost(2e-5, 6e-8, 0.0)
    start = CostModel(modules={"vision": ModuleCost(2e-5, 2e-9, 0.0), "language": ModuleCost(1e-5, 0.0)})
    fitter, s = Calibration(start, 1, window="step"), store()
    for it in range(1, 16):
        rows = rng.integers(20, 900, size=(8, 2))  # 8 micro-batches of 2 images
        figure = _micro(rows.tolist(), true, 0.03, rng)
        if not per_micro_batch:
            figure["micro"] = None
        fitter.observe(it, [figure], s, current_iteration=it + 1, lead=4)
    learnt = fitter.schedule.announcements[-1].model.of("vision")
    if not per_micro_batch:
        assert learnt.b / learnt.a == pytest.approx(2e-9 / 2e-5, rel=1e-6)
        return
    # on fresh steps, the learnt model splits a step's work over its micro-batches closer to the
    # truth than the start did (the prior, worth 16 steps, still holds part of the way)
    errors = {}
    for name, model in (("start", start.of("vision")), ("learnt", learnt)):
        w = np.array([model.a, model.b, model.k])
        errors[name] = np.mean([replica_share_error(np.array(f["micro"]["features"]) @ w, f["micro"]["seconds"])
                                for f in (_micro(rng.integers(20, 900, size=(8, 2)).tolist(), true, 0.0, rng)
                                          for _ in range(20))])
    assert errors["learnt"] < 0.7 * errors["start"]
    assert 2e-9 / 2e-5 < learnt.b / learnt.a < true.b / true.a
