"""Cost-model calibration from profiler logs (mimo_accel.tools.calibrate): every module from its
own measured times (files written by the real mimo_accel.profiler.Recorder, its region clock driven
by hand)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from rich.console import Console

from mimo_accel.tools import calibrate as cal
from mimo_accel.costs import CostModel
from mimo_accel.costs.fit import nnls
from mimo_accel.profiler import Recorder
from mimo_accel.profiler.run import read_run

class _Clock:
    """A region clock the test advances by hand: region time = what the step 'cost'."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def _recorder(out, rank, world, module="vision", dp_rank=0, dp_size=1, run_id=None):
    rec = Recorder(out, rank=rank, world_size=world, module=module, dp_rank=dp_rank, dp_size=dp_size, clock="wall",
                   run_id=run_id)
    clock = _Clock()
    rec._clock._fn = clock  # region times come from the synthetic clock
    return rec, clock


def _rel(x, y):
    return abs(x - y) / y



# ------------------------------------------------------------------------------------------
# Every module from its own measured times
# ------------------------------------------------------------------------------------------

TRUE_MODULES = {"vision": {"a": 2e-5, "b": 3e-9, "k": 5e-3}, "audios": {"a": 4e-5, "b": 6e-9, "k": 8e-3},
                "language": {"a": 3e-5, "b": 3e-5 / 8192}}


def _count(rec, **counters):
    """Counters by the profiler's per-module names: ``add`` where the recorder knows them, else
    ``set`` (the same field in the step line)."""
    try:
        rec.add(**counters)
    except TypeError:
        rec.set(**counters)


def write_module_run(out, *, steps=30, dps=None, noise=0.003, seed=0, drift=None, coef=TRUE_MODULES, sq=True,
                     items=None, overhead=0.0, identical=False, run_id=None):
    """One rank per replica of each module; each rank's module time is its true cost (+ ``overhead``)
    (+ relative noise), recorded under ``<m>_fwd`` / ``<m>_bwd`` with its ``<m>_items/_rows/_sq_rows``
    (encoders) or ``tokens``/``sq_tokens`` (language) counters; ``items``: that many per encoder
    replica and step (as a sharded plan gives), else 1-5; ``identical``: the same work in every
    step; ``drift[s]`` scales step s on every rank alike (a machine whose speed changes between
    steps); ``run_id``: every header's."""
    dps = dps or {"vision": 2, "audios": 2, "language": 2}
    rng = np.random.default_rng(seed)
    world = sum(dps.values())
    rank = 0
    for module, dp in dps.items():
        for r in range(dp):
            rec, clock = _recorder(out, rank, world, module=module, dp_rank=r, dp_size=dp, run_id=run_id)
            rank += 1
            for step in range(steps):
                c = coef[module]
                if module == "language":
                    lengths = np.array([1000, 2000]) if identical else rng.integers(50, 4000, size=int(rng.integers(2, 8)))
                    t, q = int(lengths.sum()), int((lengths ** 2).sum())
                    seconds = c["a"] * t + c["b"] * q
                    rec.add(samples=len(lengths), tokens=t)
                    _count(rec, **({"sq_tokens": q} if sq else {}))
                else:
                    sizes = np.array([1000, 2000]) if identical else \
                        rng.integers(50, 3000, size=items or int(rng.integers(1, 6)))
                    p, q = int(sizes.sum()), int((sizes ** 2).sum())
                    seconds = c["a"] * p + c["b"] * q + c["k"] * len(sizes)
                    _count(rec, **{f"{module}_items": len(sizes), f"{module}_rows": p,
                                   **({f"{module}_sq_rows": q} if sq else {})})
                seconds = (seconds + overhead) * (1 + noise * rng.standard_normal())
                if drift is not None:
                    seconds *= drift[step]
                rec.start(f"{module}_fwd")
                clock.now += seconds / 3
                rec.stop(f"{module}_fwd")
                rec.start(f"{module}_bwd")
                clock.now += seconds - seconds / 3
                rec.stop(f"{module}_bwd")
                rec.end_step()
            rec.close()
    return out


@pytest.mark.parametrize("seed", [0, 1])
def test_every_module_is_fitted_from_its_own_times(tmp_path, seed):
    run = read_run(write_module_run(tmp_path, seed=seed))
    assert cal.modules_in(run) == ["vision", "audios", "language"]
    model, stats = cal.fit_modules(run)
    for m, true in TRUE_MODULES.items():
        got = model.of(m).to_dict()
        for k, v in true.items():
            assert _rel(got[k], v) < (0.15 if k == "k" else 0.08), (m, k, got[k], v)  # few items: k is the weakest
        assert stats[m]["r2"] > 0.99 and stats[m]["n"] == 2 * 29 and stats[m]["rel_rmse"] < 0.02
        assert stats[m]["terms"]["a"]["significant"] and stats[m]["terms"]["b"]["significant"]
        assert stats[m]["skipped_warmup"] == [0] and len(stats[m]["ranks"]) == 2 and stats[m]["sq"]
        assert model.fit["modules"][m]["r2"] == stats[m]["r2"] and model.fit["modules"][m]["n"] == stats[m]["n"]
    assert model.fit["units"] == "seconds"
    assert model.of("language").k == 0
    assert (model.a, model.b) == (model.of("vision").a, model.of("vision").b)  # the default encoder's


def test_an_item_count_equal_everywhere_is_the_overhead(tmp_path):
    # every replica carried 4 images in every step (the demo's sharded split): k·items is a constant,
    # which the plain fit cannot tell from the overhead; it is dropped with a warning, a and b stay
    run = read_run(write_module_run(tmp_path, dps={"vision": 4, "language": 4}, items=4, seed=5))
    model, stats = cal.fit_modules(run, modules=["vision"])
    vision = model.of("vision")
    assert vision.k == 0
    assert any("vision_items is the same in every step" in w for w in stats["vision"]["warnings"])
    assert _rel(vision.a, TRUE_MODULES["vision"]["a"]) < 0.08 and _rel(vision.b, TRUE_MODULES["vision"]["b"]) < 0.08
    assert stats["vision"]["overhead_s"] == pytest.approx(4 * TRUE_MODULES["vision"]["k"], rel=0.5)


def test_per_step_fits_each_module_within_steps(tmp_path):
    drift = 1 + 0.6 * np.random.default_rng(3).random(30)  # every replica of a step slower alike
    run = read_run(write_module_run(tmp_path, dps={"vision": 4, "language": 4}, drift=drift, seed=4))
    plain, plain_stats = cal.fit_modules(run)
    model, stats = cal.fit_modules(run, per_step=True)
    scale = drift[1:].mean()
    for m in ("vision", "language"):
        assert stats[m]["per_step"] and stats[m]["r2"] > 0.98 and stats[m]["r2"] > plain_stats[m]["r2"] + 0.02
        assert stats[m]["r2_across_steps"] == plain_stats[m]["r2"]
        assert _rel(model.of(m).a, TRUE_MODULES[m]["a"] * scale) < 0.1, m
        assert stats[m]["steps"] == 29 and len(stats[m]["terms"]["overhead"]["per_step"]) == 29
    assert model.fit["per_step"] and model.fit["modules"]["vision"]["r2_across_steps"] == plain_stats["vision"]["r2"]
    console = Console(record=True, width=200)
    cal.render_modules(model, stats, console)
    text = console.export_text()
    assert "R² within steps" in text and "R² across steps (one overhead)" in text and "overhead per step" in text


def test_main_writes_every_module_and_prints_each_fit(tmp_path):
    run_dir = write_module_run(tmp_path / "run", seed=2)
    out, js = tmp_path / "cost.json", tmp_path / "fit.json"
    console = Console(record=True, width=200)
    assert cal.main([str(run_dir), "--out", str(out), "--json", str(js), "--per-step"], console=console) == 0
    text = console.export_text()
    assert "relative RMSE" in text and "significant" in text and "wrote" in text
    # the setting's one name: cost_model, MIMO_ACCEL_COST_MODEL (no command of the wheel takes the file)
    flat = " ".join(text.split())
    assert f"cost_model={out} or MIMO_ACCEL_COST_MODEL={out}" in flat and "MIMO_ACCEL_COST=" not in flat
    for m in ("vision", "audios", "language"):
        assert f"{m}: cost-model fit" in text and f"Fit quality ({m})" in text
    assert "R² within steps" in text and "k · items" in text and "a · tokens" in text
    doc = json.loads(out.read_text())
    assert doc["format"] == "mimo-accel-cost-model/3" and set(doc["modules"]) == {"vision", "audios", "language"}
    model = CostModel.from_file(out)
    assert _rel(model.of("audios").a, TRUE_MODULES["audios"]["a"]) < 0.1
    fit_doc = json.loads(js.read_text())
    assert set(fit_doc["modules"]) == {"vision", "audios", "language"} and fit_doc["model"]["modules"]


def test_a_module_without_its_attention_counter_falls_back(tmp_path):
    run = read_run(write_module_run(tmp_path, dps={"vision": 2, "language": 1}, sq=False,
                                    coef={"vision": {"a": 2e-5, "b": 0.0, "k": 1e-3},
                                          "language": {"a": 3e-5, "b": 0.0}}))
    model, stats = cal.fit_modules(run)
    assert model.of("vision").b == 0 and not stats["vision"]["sq"]
    assert any("no vision_sq_rows" in w for w in stats["vision"]["warnings"])
    assert any("no sq_tokens" in w for w in stats["language"]["warnings"])
    assert _rel(model.of("language").a, 3e-5) < 0.05
    console = Console(record=True, width=200)
    cal.render_modules(model, stats, console)
    text = console.export_text()
    assert "not fitted (no vision_sq_rows in logs)" in text and "b = 0 for vision" in text


def test_a_module_of_pp_stages_is_fitted_on_its_replicas_stages_summed(tmp_path):
    """Language tp 2 pp 2 dp 2 (ranks 0-7, pp slowest): each stage computes half of a replica's
    cost; the fit learns the whole module's (a sample's cost before the step model spreads it over
    the stages), not one stage's. One TP rank of each stage runs 5 % slower: the slowest counts."""
    true = TRUE_MODULES["language"]
    rng = np.random.default_rng(3)
    steps = 20
    work = {(r, s): rng.integers(50, 4000, size=int(rng.integers(2, 8))) for r in range(2) for s in range(steps)}
    layout = {"dp": {"language": 2}, "pp": {"language": 2}}
    for rank in range(8):
        tp, dp, stage = rank % 2, rank // 2 % 2, rank // 4
        rec = Recorder(tmp_path, rank=rank, world_size=8, module="language", dp_rank=dp, dp_size=2, clock="wall",
                       layout=layout)
        clock = _Clock()
        rec._clock._fn = clock
        for s in range(steps):
            lengths = work[dp, s]
            t, q = int(lengths.sum()), int((lengths ** 2).sum())
            seconds = (true["a"] * t + true["b"] * q) * (0.4 if stage == 0 else 0.6) * (1.05 if tp else 1.0)
            rec.add(tokens=t)
            _count(rec, sq_tokens=q)
            rec.start("language_fwd")
            clock.now += seconds / 3
            rec.stop("language_fwd")
            rec.start("language_bwd")
            clock.now += seconds - seconds / 3
            rec.stop("language_bwd")
            rec.end_step()
        rec.close()
    model, stats = cal.fit_modules(read_run(tmp_path), intercept=False)
    got = model.of("language")
    assert _rel(got.a, 1.05 * true["a"]) < 0.02 and _rel(got.b, 1.05 * true["b"]) < 0.02
    assert stats["language"]["n"] == 2 * (steps - 1)  # one observation per replica and step (warm-up left out)


def test_overhead_is_fitted_apart_and_kept_out_of_the_model(tmp_path):
    run = read_run(write_module_run(tmp_path, dps={"vision": 2, "language": 1}, overhead=0.05, seed=3))
    model, stats = cal.fit_modules(run, modules=["vision"])
    assert stats["vision"]["overhead_s"] == pytest.approx(0.05, rel=0.15)
    for k in ("a", "b"):
        assert _rel(getattr(model.of("vision"), k), TRUE_MODULES["vision"][k]) < 0.08, k
    # without the intercept the fixed time leaks into the per-row/per-item terms
    model0, stats0 = cal.fit_modules(run, modules=["vision"], intercept=False)
    assert stats0["vision"]["overhead_s"] == 0.0 and "overhead" not in stats0["vision"]["terms"]
    assert model0.of("vision").a + model0.of("vision").k > model.of("vision").a + model.of("vision").k


def test_per_step_with_one_replica_falls_back_to_one_overhead(tmp_path):
    run = read_run(write_module_run(tmp_path, dps={"vision": 1, "language": 1}, seed=2))
    model, stats = cal.fit_modules(run, per_step=True, modules=["vision"])
    assert not stats["vision"]["per_step"] and "r2_across_steps" not in stats["vision"]
    assert any("fitted one overhead across steps" in w for w in stats["vision"]["warnings"])
    assert _rel(model.of("vision").b, TRUE_MODULES["vision"]["b"]) < 0.08


def test_error_cases(tmp_path, capsys):
    # only a language rank that times nothing: no module to fit
    lang, _ = _recorder(tmp_path / "lang", 0, 1, module="language")
    for _ in range(5):
        lang.end_step()
    lang.close()
    with pytest.raises(cal.CalibrationError, match="no module is timed"):
        cal.fit_modules(read_run(tmp_path / "lang"))
    assert cal.main([str(tmp_path / "lang")]) == 2
    assert "no module is timed" in capsys.readouterr().err
    # too few steps: 3 recorded, 1 warm-up, 2 left on one rank
    few = write_module_run(tmp_path / "few", steps=3, dps={"vision": 1})
    with pytest.raises(cal.CalibrationError, match=r"too few steps.*2 usable.*at least 3"):
        cal.fit_modules(read_run(few))
    # every step identical: the features cannot be told apart
    same = write_module_run(tmp_path / "same", dps={"vision": 2}, identical=True)
    with pytest.raises(cal.CalibrationError, match="singular design.*collinear"):
        cal.fit_modules(read_run(same), intercept=False)
    # the CLI: clear message, rc 2
    assert cal.main([str(same), "--no-intercept"]) == 2
    assert "singular design" in capsys.readouterr().err
    assert cal.main([str(tmp_path / "missing")]) == 2
    assert "missing: no such directory" in capsys.readouterr().err
    assert cal.main([str(few), "--warmup", "-1"]) == 2
    assert cal.main([str(few), "--per-step", "--no-intercept"]) == 2
    assert "--per-step" in capsys.readouterr().err
    with pytest.raises(ValueError, match="warmup"):
        cal.fit_modules(read_run(few), warmup=-1)
    with pytest.raises(ValueError, match="per_step"):
        cal.fit_modules(read_run(few), per_step=True, intercept=False)


def test_nnls_matches_scipy():
    # scipy comes with the Megatron runtime (modelopt needs it: the suite's import check has it)
    scipy_nnls = pytest.importorskip("scipy.optimize", reason="scipy comes with the Megatron runtime").nnls
    rng = np.random.default_rng(0)
    for _ in range(30):
        x = rng.standard_normal((20, 4))
        y = rng.standard_normal(20)
        ours = nnls(x, y)
        ref, _ = scipy_nnls(x, y)
        assert (ours >= 0).all()
        assert np.linalg.norm(x @ ours - y) == pytest.approx(np.linalg.norm(x @ ref - y), rel=1e-9, abs=1e-12)
