"""Online calibration on Bridge's own loop (``examples/train_mimo.py``: ``pretrain_megatron_mimo``,
torch_dist checkpoints, resume) on CPU gloo ranks, started from a deliberately wrong cost model:
refits are announced and take effect while training, and every data rank plans every window with
the same model throughout (the plan check compares each window's plan, the model's digest in it:
a rank planning with another model would stop the job); in 1:1, fan-in, fan-out and with two
encoders. Under a step plan the language model's cost per micro-batch is learnt. A run resumed from a checkpoint taken after a refit plans with the saved models, and
each iteration trains exactly what the uninterrupted run trained.

One stand-in: the replica times the fitting rank learns from are a known cost of what each replica
computed (its real rows, Σ rows², items and tokens, gathered from every rank as in any run), not
this machine's timings of a tiny model, whose noise would make the step of the first accepted refit
a matter of chance. Everything else is the real path: the gather, the real fit, the announcement
through the store, the planner threads, the plan check, the checkpoint. Learning from real
timings: tests/test_online_calibration.py (simulated), the rehearsal (make demo)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from mimo_accel.costs import CostModel, ModuleCost
from mimo_accel.profiler.run import read_run
from mimo_accel_dev.rehearse.ranks import run_ranks
from mimo_accel.runtime.measuring.calibration import FILE, first_refit

from ._example import steps_from_trace, train_rank

pytestmark = pytest.mark.distributed

MBS, GBS, ITERS = 4, 8, 16
SAVED = 10  # the straight run's checkpoint the resumed run starts from
DEADLINE_S = 240.0
FIRST_CALIBRATED = 6  # the iteration the first refit plans at the latest (of 24 in make demo)
# 10x the default attention terms: wrong, but within the fit's plausibility bound of 100x
WRONG = CostModel(modules={"vision": ModuleCost(1.0, 0.009), "language": ModuleCost(1.0, 10 / 8192)})


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    d = tmp_path_factory.mktemp("online-calibration")
    WRONG.to_file(d / "wrong.json")
    return d


# the cost the stand-in times follow, far from the wrong model's: a per-item constant for the
# encoders, a quadratic-dominated language cost (seconds per row, row², item; per token, token²)
TRUE = {"vision": (2e-5, 1e-9, 5e-3), "audio": (1e-5, 1e-9, 2e-3), "language": (1e-5, 5e-7, 0.0)}


def _known_times(rank, world, argv, features, env):
    """A rank whose fitting thread learns from TRUE's times of what each replica computed."""
    import numpy as np

    from mimo_accel.runtime.measuring import calibration

    observations = calibration.step_observations

    def with_known_times(figures, **options):
        out = {}
        for module, (x, _) in observations(figures, **options).items():
            coefficients = np.asarray(TRUE[module][:x.shape[1]])
            out[module] = (x, x @ coefficients + 0.005)  # and an overhead every replica pays
        return out

    calibration.step_observations = with_known_times
    return train_rank(rank, world, argv, features, env)


def _run(workdir: Path, name: str, vdp: int, ldp: int, *extra: str, iters: int = ITERS,
         checkpoint: str | None = None, audio_dp: int = 0, **options) -> dict:
    trace, ckpt, profile = workdir / f"{name}.jsonl", workdir / (checkpoint or f"ckpt-{name}"), workdir / name
    layout = (["--vision-dp", str(vdp), "--language-dp", str(ldp), "--varied"] if not audio_dp else
              ["--modalities", "vision,audio", "--vision-dp", str(vdp), "--audio-dp", str(audio_dp),
               "--language-dp", str(ldp), "--image-dir", str(workdir / "media")])
    argv = ["--cpu", *layout, "--mbs", str(MBS), "--gbs", str(GBS), "--train-iters", str(iters),
            "--eval-interval", "4", "--eval-iters", "1", "--save", str(ckpt), "--trace", str(trace), *extra]
    features = dict(sharded_reads=True, reorder=True, packing=True, cost_model=str(workdir / "wrong.json"),
                    profile=str(profile), **options)
    env = {"MIMO_ACCEL_CACHE_DIR": str(workdir / "cache")}
    run_ranks(_known_times, vdp + audio_dp + ldp, argv, features, env, deadline_s=DEADLINE_S)
    records = [json.loads(line) for line in trace.read_text().splitlines()]
    return {"records": records, "schedule": json.loads((ckpt / FILE).read_text()), "profile": read_run(profile),
            "checkpoint": ckpt}


def _models_by_iteration(run: dict, resumed_at: int = 0) -> dict:
    """iteration -> the cost-model digest every data rank planned it with (asserting they agree);
    a profile counts its steps from 0 where the run started (``resumed_at``)."""
    out: dict = {}
    for rank, log in run["profile"].ranks.items():
        for line in log.steps:
            if "cost_model" in line:
                it = resumed_at + int(line["step"]) + 1
                assert out.setdefault(it, line["cost_model"]) == line["cost_model"], (rank, it)
    return out


def _assert_every_sample_once(records: list, iterations) -> None:
    steps = steps_from_trace(records)
    for it in iterations:
        want = list(range((it - 1) * GBS, it * GBS))
        assert steps[it]["vision"] == steps[it]["language"] == want, f"iteration {it}"


@pytest.mark.parametrize("vdp,ldp", [(2, 2), (2, 1), (1, 2)], ids=["one-to-one", "fan-in", "fan-out"])
def test_plans_agree_at_every_window_while_refits_take_effect(workdir, vdp, ldp):
    run = _run(workdir, f"v{vdp}-l{ldp}", vdp, ldp)
    announced = run["schedule"]["announcements"]
    assert announced and announced[0]["step"] <= ITERS, "no refit took effect within the run"
    models = _models_by_iteration(run)
    assert len(set(models.values())) >= 2  # the model changed at a step boundary while training
    first = announced[0]["step"]
    assert len({models[it] for it in range(1, first)}) == 1  # the configured model until the first announcement
    # the cold start: the first refit learns from iterations 2-4 (the first left out) and plans from 6,
    # every planner having waited for it there rather than the refit waiting out the queue (fan-out's
    # one vision replica leaves the language model alone to learn, whose first refit is not accepted)
    cold = [a for a in announced if a["learnt_through"] == first_refit(0) == 4]
    assert [a["step"] for a in cold] == ([FIRST_CALIBRATED] if vdp > 1 else [])
    assert models[first] != models[first - 1]
    _assert_every_sample_once(run["records"], range(1, ITERS + 1))
    refits = [r for log in run["profile"].ranks.values() for line in log.steps for r in line.get("online_refits", ())]
    # from a start in seconds (a file), every refit taken is a fit judged better (no scale-only one)
    assert refits and all(r["held_out_error_after"] < r["held_out_error_before"] for r in refits)
    assert any(r["coefficients"]["k"] > 0 for r in refits if r["module"] == "vision") or vdp == 1
    # no step plan: a language row is a replica, whose samples never differ, so it learns no cost per sample
    assert all(r["coefficients"]["k"] == 0 for r in refits if r["module"] == "language")


@pytest.fixture(scope="module")
def straight(workdir):
    return _run(workdir, "straight", 2, 1, "--save-interval", str(SAVED))


def _learnt_through(schedule: dict, iteration: int) -> int:
    """The last iteration the model planning ``iteration`` learnt from (0: the configured model)."""
    known = [a for a in schedule["announcements"] if a["step"] <= iteration]
    return known[-1]["learnt_through"] if known else 0


def test_a_resume_after_a_refit_plans_with_the_saved_models_and_trains_the_same_samples(workdir, straight):
    learnt = [a for a in straight["schedule"]["announcements"] if a["learnt_through"] <= SAVED]
    assert learnt, f"no refit before the checkpoint at iteration {SAVED}: nothing to resume with"
    # the checkpoint of iteration SAVED (Bridge may also save at the end of training: leave that out)
    at_saved = workdir / f"ckpt-straight-{SAVED}"
    shutil.copytree(straight["checkpoint"], at_saved)
    for later in at_saved.glob("iter_*"):
        if int(later.name.split("_")[1]) > SAVED:
            shutil.rmtree(later)
    (at_saved / "latest_checkpointed_iteration.txt").write_text(str(SAVED))
    state = at_saved / f"iter_{SAVED:07d}" / "train_state.pt"
    if (at_saved / "latest_train_state.pt").exists() and state.exists():  # upstream main's pointer to the latest
        shutil.copyfile(state, at_saved / "latest_train_state.pt")
    resumed = _run(workdir, "resumed", 2, 1, "--load", str(at_saved), checkpoint="ckpt-resumed")
    # the resumed run replays what was learnt up to its checkpoint, from the same iterations on
    assert [a["step"] for a in resumed["schedule"]["announcements"][:len(learnt)]] == [a["step"] for a in learnt]
    # every iteration the straight run planned with a model learnt up to the checkpoint (what it learnt
    # later is announced at least a lead past it) trains the same samples, in the same micro-batches, on
    # every replica, planned with the same model
    want, got = _models_by_iteration(straight), _models_by_iteration(resumed, resumed_at=SAVED)
    iterations = [it for it in range(SAVED + 1, ITERS + 1) if _learnt_through(straight["schedule"], it) <= SAVED]
    assert any(_learnt_through(straight["schedule"], it) > 0 for it in iterations), "no learnt model to compare"
    assert [got[it] for it in iterations] == [want[it] for it in iterations]
    replica = {(r["module"], r["dp_rank"], r["iteration"]): r["ids"] for r in straight["records"]}
    after = [r for r in resumed["records"] if r["iteration"] in iterations]
    assert sorted({r["iteration"] for r in after}) == list(iterations)
    for r in after:
        assert r["ids"] == replica[(r["module"], r["dp_rank"], r["iteration"])], (r["module"], r["iteration"])


def test_with_two_encoders_refits_take_effect_and_every_module_plans_alike(workdir):
    run = _run(workdir, "two-encoders", 2, 1, audio_dp=2)
    announced = run["schedule"]["announcements"]
    assert announced and announced[0]["step"] <= ITERS, "no refit took effect within the run"
    # the images' per-item cost is learnt; the clips (every one as long: rows follow items) are priced
    # in proportion to their true cost by any model, so theirs has nothing to gain
    assert "vision" in {m for a in announced for m in a["model"]["modules"]}
    assert len(set(_models_by_iteration(run).values())) >= 2
    for it, step in steps_from_trace(run["records"]).items():
        assert step["vision"] == step["audio"] == step["language"] == list(range((it - 1) * GBS, it * GBS)), it


def test_a_step_plan_learns_what_a_language_micro_batch_costs_whatever_its_length(workdir):
    # the stand-in gives every observed row its known cost plus 0.005 s; under a step plan the
    # language model is observed per micro-batch (stages summed), so that is what one costs whatever
    # its length, learnt at the machine's pace as k: a sample's share (MBS / 2 replicas a micro-batch)
    run = _run(workdir, "step-plan", 2, 2, reorder_window="step")
    language = [a["model"]["modules"]["language"] for a in run["schedule"]["announcements"]]
    assert language and language[-1]["k"] == pytest.approx(0.005 / (MBS // 2), rel=0.1), language
    _assert_every_sample_once(run["records"], range(1, ITERS + 1))
