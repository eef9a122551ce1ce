"""Cost-model calibration from profiler logs (mimo_accel.tools.calibrate)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from rich.console import Console

from mimo_accel.tools import calibrate as cal
from mimo_accel.costs import CostModel
from mimo_accel.profiler import Recorder, read_run

TRUE = {"a": 2e-5, "b": 3e-9, "c": 4e-6}


class _Clock:
    """A region clock the test advances by hand: region time = what the step 'cost'."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def _recorder(out, rank, world, module="vision", dp_rank=0, dp_size=1):
    rec = Recorder(out, rank=rank, world_size=world, module=module, dp_rank=dp_rank, dp_size=dp_size, clock="wall")
    clock = _Clock()
    rec._clock._fn = clock  # region times come from the synthetic clock
    return rec, clock


def write_run(out, *, steps=40, ranks=2, noise=0.003, sq=True, overhead=0.0, seed=0, identical=False,
              split_bwd=True, coef=TRUE, drift=None):
    """Vision ranks whose vision time is a·Σp + b·Σp² + c·tokens (+ overhead) (+ relative noise);
    ``drift[s]`` scales step s on every rank alike (a machine whose speed changes between steps)."""
    rng = np.random.default_rng(seed)
    world = ranks + 1
    for r in range(ranks):
        rec, clock = _recorder(out, r, world, dp_rank=r, dp_size=ranks)
        for step in range(steps):
            if identical:
                images, tokens = np.array([1000, 2000]), 3000
            else:
                images = rng.integers(100, 6000, size=int(rng.integers(1, 6)))
                tokens = int(rng.integers(200, 8000))
            p, q = int(images.sum()), int((images**2).sum())
            seconds = coef["a"] * p + coef["b"] * q + coef["c"] * tokens + overhead
            seconds *= 1 + noise * rng.standard_normal()
            if drift is not None:
                seconds *= drift[step]
            rec.add(samples=4, images=len(images), patches=p, tokens=tokens)
            if sq:
                rec.add(sq_patches=q)
            fwd = seconds / 3 if split_bwd else seconds
            rec.start("vision_fwd")
            clock.now += fwd
            rec.stop("vision_fwd")
            if split_bwd:
                rec.start("vision_bwd")
                clock.now += seconds - fwd
                rec.stop("vision_bwd")
            rec.end_step()
        rec.close()
    lang, _ = _recorder(out, ranks, world, module="language")  # no vision timing: ignored
    for _ in range(steps):
        lang.add(samples=4, tokens=100)
        lang.end_step()
    lang.close()
    return out


def _rel(x, y):
    return abs(x - y) / y


@pytest.mark.parametrize("seed", [0, 1])
def test_recovers_known_coefficients(tmp_path, seed):
    run = read_run(write_run(tmp_path, seed=seed))
    model, stats = cal.fit(run)
    for k in ("a", "b", "c"):
        assert _rel(getattr(model, k), TRUE[k]) < 0.05, (k, getattr(model, k))
        assert stats["terms"][k]["significant"]
    assert stats["r2"] > 0.99 and stats["rel_rmse"] < 0.02
    assert stats["n"] == 2 * 39 and stats["ranks"] == [0, 1] and stats["skipped_warmup"] == [0]
    assert stats["sq_patches"] and model.fit["r2"] == stats["r2"] and model.fit["n"] == stats["n"]
    assert model.fit["units"] == "seconds"


def test_overhead_is_fitted_apart_and_kept_out_of_the_model(tmp_path):
    run = read_run(write_run(tmp_path, overhead=0.05, split_bwd=False, seed=3))
    model, stats = cal.fit(run)
    assert stats["overhead_s"] == pytest.approx(0.05, rel=0.15)
    for k in ("a", "b"):
        assert _rel(getattr(model, k), TRUE[k]) < 0.05
    # without the intercept the fixed time leaks into the per-patch/per-token terms
    model0, stats0 = cal.fit(run, intercept=False)
    assert stats0["overhead_s"] == 0.0 and "overhead" not in stats0["terms"]
    assert model0.a + model0.c > model.a + model.c


def test_without_sq_patches_falls_back_to_a_and_c(tmp_path):
    run = read_run(write_run(tmp_path, sq=False, coef={"a": 2e-5, "b": 0.0, "c": 4e-6}))
    model, stats = cal.fit(run)
    assert model.b == 0.0 and not stats["sq_patches"] and not stats["terms"]["b"]["fitted"]
    assert _rel(model.a, 2e-5) < 0.05 and _rel(model.c, 4e-6) < 0.05
    assert any("no sq_patches" in w and "b = 0" in w for w in stats["warnings"])
    console = Console(record=True, width=160)
    cal.render(model, stats, console)
    text = console.export_text()
    assert "not fitted (no sq_patches in logs)" in text and "b = 0" in text


def test_per_step_overheads_take_out_a_drift_that_every_replica_shares(tmp_path):
    # the machine runs up to 25 % slower in some steps, on all four replicas at once
    drift = 1 + 0.25 * np.random.default_rng(7).random(40)
    run = read_run(write_run(tmp_path, ranks=4, overhead=0.05, drift=drift, seed=5))
    plain, plain_stats = cal.fit(run)
    model, stats = cal.fit(run, per_step=True)
    assert stats["per_step"] and stats["steps"] == 39 and model.fit["per_step"]
    # within a step the model explains the replicas' differences; across steps the drift is noise
    assert stats["r2"] > 0.98 > plain_stats["r2"] and stats["r2_across_steps"] == plain_stats["r2"]
    assert model.fit["r2_across_steps"] == plain_stats["r2"]
    # the coefficients come out as the drift's mean scale times the true ones
    scale = drift[1:].mean()
    for k in ("a", "b", "c"):
        assert _rel(getattr(model, k), TRUE[k] * scale) < 0.06, (k, getattr(model, k))
    assert stats["overhead_s"] == pytest.approx(0.05 * scale, rel=0.3)
    assert len(stats["terms"]["overhead"]["per_step"]) == 39
    console = Console(record=True, width=160)
    cal.render(model, stats, console)
    text = console.export_text()
    assert "R² within steps" in text and "R² across steps (one overhead)" in text and "overhead per step" in text
    with pytest.raises(ValueError, match="per_step"):
        cal.fit(run, per_step=True, intercept=False)


def test_per_step_with_one_replica_falls_back_to_one_overhead(tmp_path):
    run = read_run(write_run(tmp_path, ranks=1, seed=2))
    model, stats = cal.fit(run, per_step=True)
    assert not stats["per_step"] and "r2_across_steps" not in stats
    assert any("fitted one overhead across steps" in w for w in stats["warnings"])
    assert _rel(model.b, TRUE["b"]) < 0.05


def test_main_writes_a_cost_model_file(tmp_path):
    run_dir = write_run(tmp_path / "run")
    out, js = tmp_path / "cost.json", tmp_path / "fit.json"
    console = Console(record=True, width=160)
    assert cal.main([str(run_dir), "--out", str(out), "--json", str(js)], console=console) == 0
    text = console.export_text()
    assert "R²" in text and "relative RMSE" in text and "significant" in text and "wrote" in text
    model = CostModel.from_file(out)
    assert _rel(model.b, TRUE["b"]) < 0.05
    assert {"r2", "n", "rmse", "rel_rmse", "overhead_s"} <= set(model.fit)
    assert json.loads(out.read_text())["format"] == "mimo-accel-cost-model/1"
    assert json.loads(js.read_text())["model"]["a"] == model.a


def test_error_cases(tmp_path, capsys):
    # only a language rank: no vision steps
    lang, _ = _recorder(tmp_path / "lang", 0, 1, module="language")
    for _ in range(5):
        lang.end_step()
    lang.close()
    with pytest.raises(cal.CalibrationError, match="no vision steps"):
        cal.fit(read_run(tmp_path / "lang"))
    # too few steps: 3 recorded, 1 warm-up, 2 left on one rank
    with pytest.raises(cal.CalibrationError, match=r"too few steps.*2 usable.*at least 3"):
        cal.fit(read_run(write_run(tmp_path / "few", steps=3, ranks=1)))
    # every step identical: the features cannot be told apart
    with pytest.raises(cal.CalibrationError, match="singular design.*collinear"):
        cal.fit(read_run(write_run(tmp_path / "same", identical=True)))
    # the CLI: clear message, rc 2
    assert cal.main([str(tmp_path / "same")]) == 2
    assert "singular design" in capsys.readouterr().err
    assert cal.main([str(tmp_path / "missing")]) == 2
    assert "not a directory" in capsys.readouterr().err
    assert cal.main([str(tmp_path / "few"), "--warmup", "-1"]) == 2
    assert cal.main([str(tmp_path / "few"), "--per-step", "--no-intercept"]) == 2
    assert "--per-step" in capsys.readouterr().err
    with pytest.raises(ValueError, match="warmup"):
        cal.fit(read_run(tmp_path / "few"), warmup=-1)


def test_nnls_matches_scipy():
    from scipy.optimize import nnls as scipy_nnls  # scipy comes with the megatron runtime
    rng = np.random.default_rng(0)
    for _ in range(30):
        x = rng.standard_normal((20, 4))
        y = rng.standard_normal(20)
        ours = cal.nnls(x, y)
        ref, _ = scipy_nnls(x, y)
        assert (ours >= 0).all()
        assert np.linalg.norm(x @ ours - y) == pytest.approx(np.linalg.norm(x @ ref - y), rel=1e-9, abs=1e-12)
