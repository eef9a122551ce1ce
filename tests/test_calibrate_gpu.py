"""``mimo-accel calibrate-gpu`` (mimo_accel_dev.commands.calibrate_gpu): its fit recovers known
coefficients from synthetic timings, its budget stops adding points (and says so), its command
runs end to end at ``--size tiny --device cpu`` into a file ``CostModel.from_file`` reads, the raw
points refit to the same model, and bad arguments end in one ``error:`` line, exit 2. One process,
no ranks (the command itself is a world of one)."""

from __future__ import annotations

import io
import json
import math

import numpy as np
import pytest
from rich.console import Console

from mimo_accel.costs import CostModel
from mimo_accel_dev.commands import calibrate_gpu as cg
from mimo_accel.tools import cli
from mimo_accel_dev.commands.calibrate_gpu import devices as cg_devices

ERROR = "mimo-accel calibrate-gpu: error: "


def _console() -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    return Console(file=buf, width=160, color_system=None), buf


def _noisy(clean: np.ndarray, rel: float, seed: int) -> np.ndarray:
    return clean * (1.0 + np.random.default_rng(seed).normal(0.0, rel, clean.size))


# The fit ---------------------------------------------------------------------------------------

VISION_TRUE = {"a": 2.0e-6, "b": 1.2e-10, "k": 8.0e-4}  # s/row, s/row², s/image (H200-like scale)
OVERHEAD = 4.0e-3


def test_vision_fit_recovers_rows_squared_rows_and_per_image_terms():
    points = cg.vision_points("real")
    x = np.array([p.features() for p in points])
    clean = x @ np.array([VISION_TRUE["a"], VISION_TRUE["b"], VISION_TRUE["k"]]) + OVERHEAD
    fit = cg.fit_vision(points, _noisy(clean, 0.01, seed=1))
    for key, true in VISION_TRUE.items():
        assert fit.coefficients[key] == pytest.approx(true, rel=0.08), (key, fit.coefficients)
    assert fit.overhead_s == pytest.approx(OVERHEAD, rel=0.25)
    assert fit.r2 > 0.99 and fit.max_rel_err < 0.05
    assert len(fit.predicted) == len(points)
    # without noise the fit is exact
    exact = cg.fit_vision(points, clean)
    assert exact.coefficients["k"] == pytest.approx(VISION_TRUE["k"], rel=1e-6)


def test_the_core_vision_points_alone_separate_the_terms():
    points = cg.vision_points("real")[:cg.VISION_CORE]
    x = np.array([p.features() for p in points])
    clean = x @ np.array([VISION_TRUE["a"], VISION_TRUE["b"], VISION_TRUE["k"]]) + OVERHEAD
    fit = cg.fit_vision(points, clean)
    assert fit.coefficients == pytest.approx(VISION_TRUE, rel=1e-6)


def test_language_fit_recovers_a_and_b_and_keeps_the_per_sequence_work_out_of_them():
    a, b, per_seq = 3.0e-5, 2.0e-10, 1.5e-3
    points = cg.language_points("real")
    x = np.array([p.features() for p in points])
    fit = cg.fit_language(points, _noisy(x @ np.array([a, b, per_seq]) + OVERHEAD, 0.01, seed=2))
    assert fit.coefficients["a"] == pytest.approx(a, rel=0.08)
    assert fit.coefficients["b"] == pytest.approx(b, rel=0.15)
    assert fit.nuisance["per_sequence"] == pytest.approx(per_seq, rel=0.3)
    assert set(fit.coefficients) == {"a", "b"}  # the per-sequence term is not a model coefficient


def test_a_design_that_cannot_separate_the_terms_is_refused():
    same = [cg.VisionPoint(((16, 16),))] * 6
    with pytest.raises(cg.MeasureError, match="singular design"):
        cg.fit_vision(same, [0.01] * 6)
    with pytest.raises(cg.MeasureError, match="need at least 5"):
        cg.fit_vision(cg.vision_points("tiny")[:3], [0.01, 0.02, 0.03])


def test_model_from_fits_scales_the_language_block_to_the_decoder_and_names_the_modules(tmp_path):
    vpts, lpts = cg.vision_points("real"), cg.language_points("real")
    vx, lx = np.array([p.features() for p in vpts]), np.array([p.features() for p in lpts])
    vision = cg.fit_vision(vpts, vx @ np.array([2e-6, 1e-10, 1e-3]) + 1e-3, module="images")
    language = cg.fit_language(lpts, lx @ np.array([3e-5, 2e-10, 0.0]) + 1e-3)
    model = cg.model_from_fits(vision, language, language_scale=9.0, meta={"size": "real"})
    path = tmp_path / "m.json"
    model.to_file(path)
    back = CostModel.from_file(path)
    assert back.of("images").k == pytest.approx(1e-3) and back.of("images").a == pytest.approx(2e-6)
    assert back.of("language").a == pytest.approx(9 * 3e-5) and back.of("language").b == pytest.approx(9 * 2e-10)
    assert back.fit["modules"]["language"]["scale"] == 9.0 and back.fit["source"] == "mimo-accel calibrate-gpu"


# The attention the measured modules run -------------------------------------------------------

@pytest.mark.parametrize("causal, heads, groups", [(False, 4, 4), (True, 4, 2)])
def test_packed_attention_attends_within_each_segment_only(causal, heads, groups):
    import torch

    g = torch.Generator().manual_seed(0)
    bounds, dim = [0, 5, 12, 13], 8
    q = torch.randn(13, heads, dim, generator=g)
    k, v = torch.randn(13, groups, dim, generator=g), torch.randn(13, groups, dim, generator=g)
    out = cg_devices._sdpa_segments(q, k, v, bounds, causal, dim ** -0.5)
    assert out.shape == (13, heads * dim)
    for start, stop in zip(bounds[:-1], bounds[1:]):  # the textbook softmax, one segment at a time
        n = stop - start
        for h in range(heads):
            kh, vh = k[start:stop, h * groups // heads], v[start:stop, h * groups // heads]
            scores = q[start:stop, h] @ kh.T * dim ** -0.5
            if causal:
                scores = scores.masked_fill(torch.triu(torch.ones(n, n, dtype=torch.bool), 1), float("-inf"))
            ref = torch.softmax(scores, dim=-1) @ vh
            assert torch.allclose(out[start:stop, h * dim:(h + 1) * dim], ref, atol=1e-5)


# The budget ------------------------------------------------------------------------------------

class _Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def _fake_measure(clock: _Clock, iterations: int):
    """Each point 'takes' its true time per iteration on the fake clock."""
    def measure(point):
        t = float(np.dot(point.features(), [VISION_TRUE["a"], VISION_TRUE["b"], VISION_TRUE["k"]]) + OVERHEAD)
        clock.now += t * iterations
        return [t] * iterations
    return measure


def test_the_budget_stops_adding_points_but_never_the_ones_a_fit_needs():
    points = cg.vision_points("real")
    clock = _Clock()
    done = cg.collect("vision", points, _fake_measure(clock, 3), deadline=0.0, core=cg.VISION_CORE, iterations=3,
                      fit=cg.fit_vision, clock=clock)
    assert len(done.measured) == cg.VISION_CORE  # past the deadline from the start: the core only
    assert done.stopped.startswith(f"the budget is spent: vision measured {cg.VISION_CORE} of {len(points)}")

    clock = _Clock()
    everything = sum(_fake_measure(_Clock(), 3)(p)[0] * 3 for p in points)
    some = cg.collect("vision", points, _fake_measure(clock, 3), deadline=0.6 * everything, core=cg.VISION_CORE,
                      iterations=3, fit=cg.fit_vision, clock=clock)
    assert cg.VISION_CORE < len(some.measured) < len(points) and some.stopped
    assert clock.now <= 0.6 * everything  # no point was started that would run past the deadline

    clock = _Clock()
    full = cg.collect("vision", points, _fake_measure(clock, 3), deadline=10 * everything, core=cg.VISION_CORE,
                      iterations=3, fit=cg.fit_vision, clock=clock)
    assert len(full.measured) == len(points) and full.stopped is None


def test_a_point_that_fails_with_a_skippable_error_is_left_out_and_named():
    points = cg.vision_points("tiny")
    clock = _Clock()
    inner = _fake_measure(clock, 1)

    def measure(point):
        if point.items == 16:
            raise MemoryError("out of memory at this point")
        return inner(point)

    done = cg.collect("vision", points, measure, deadline=1e9, core=cg.VISION_CORE, iterations=1,
                      fit=cg.fit_vision, clock=clock, skip_errors=(MemoryError,))
    assert len(done.measured) == len(points) - 1
    assert done.skipped == ["16×4×4: out of memory at this point"]


# The command, end to end on CPU -------------------------------------------------------------

def _tiny(tmp_path, *extra: str) -> list[str]:
    return ["--device", "cpu", "--size", "tiny", "--warmup", "0", "--repeats", "1", "--out",
            str(tmp_path / "cost.json"), "--points", str(tmp_path / "points.json"), *extra]


def _check_model(path) -> CostModel:
    model = CostModel.from_file(path)
    assert set(model.modules) == {"vision", "language"}
    for name, cost in model.modules.items():
        for value in cost.to_dict().values():
            assert math.isfinite(value) and value >= 0, (name, cost)
    assert model.of("language").k == 0
    assert any(v > 0 for v in model.of("vision").to_dict().values())
    return model


def test_tiny_run_on_cpu_writes_a_cost_model_and_its_points_refit_to_it(tmp_path):
    console, out = _console()
    assert cg.main(_tiny(tmp_path, "--budget-s", "300"), console=console) == 0, out.getvalue()
    model = _check_model(tmp_path / "cost.json")
    assert model.fit["size"] == "tiny" and model.fit["device"]["kind"] == "cpu"
    assert model.fit["budget_stopped"] == []
    assert model.fit["device"]["attention"] == {"vision": "sdpa per segment", "language": "sdpa per segment"}
    points = json.loads((tmp_path / "points.json").read_text())
    assert points["format"] == cg.POINTS_FORMAT
    assert len(points["modules"]["vision"]["points"]) == len(cg.vision_points("tiny"))
    assert len(points["modules"]["language"]["points"]) == len(cg.language_points("tiny"))
    text = out.getvalue()
    assert "vision: fitted cost" in text and "language: fitted cost" in text and "R²" in text
    assert f"wrote {tmp_path / 'cost.json'}" in text

    console, out = _console()
    refit = tmp_path / "refit.json"
    assert cg.main(["--from-points", str(tmp_path / "points.json"), "--out", str(refit)], console=console) == 0
    again = CostModel.from_file(refit)
    for name in ("vision", "language"):
        assert again.of(name).to_dict() == pytest.approx(model.of(name).to_dict(), rel=1e-9)


def test_a_tiny_budget_measures_only_the_points_a_fit_needs_and_says_so(tmp_path):
    console, out = _console()
    assert cg.main(_tiny(tmp_path, "--budget-s", "0.001"), console=console) == 0, out.getvalue()
    points = json.loads((tmp_path / "points.json").read_text())["modules"]
    assert len(points["vision"]["points"]) == cg.VISION_CORE
    assert len(points["language"]["points"]) == cg.LANGUAGE_CORE
    text = " ".join(out.getvalue().split())
    assert f"the budget is spent: vision measured {cg.VISION_CORE} of {len(cg.vision_points('tiny'))} points" in text
    assert f"language measured {cg.LANGUAGE_CORE} of" in text
    model = _check_model(tmp_path / "cost.json")
    assert len(model.fit["budget_stopped"]) == 2


# Bad arguments: one line, exit 2 ----------------------------------------------------------------

def _one_error_line(capsys, *words: str) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert err and err[-1].startswith(ERROR), err
    assert "Traceback" not in "\n".join(err)
    for w in words:
        assert w in err[-1], err[-1]
    return err[-1]


def test_cuda_where_there_is_none_is_one_error_line(tmp_path, capsys, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert cli.main(["calibrate-gpu", "--out", str(tmp_path / "c.json")]) == 2
    line = _one_error_line(capsys, "--device cuda: CUDA is not available here", "--device cpu --size tiny")
    assert len(line.splitlines()) == 1
    assert not (tmp_path / "c.json").exists()


@pytest.mark.parametrize("argv, words", [
    (["--device", "cpu", "--size", "tiny", "--out", "{d}/no/such/dir/c.json"], ["the directory", "does not exist"]),
    (["--device", "cpu", "--size", "tiny", "--out", "{d}/c.json", "--points", "{d}/none/p.json"],
     ["--points", "does not exist"]),
    (["--device", "cpu", "--size", "real", "--out", "{d}/c.json"], ["--size real on cpu", "--size tiny"]),
    (["--device", "cpu", "--size", "tiny", "--budget-s", "0", "--out", "{d}/c.json"], ["--budget-s must be"]),
    (["--device", "cpu", "--size", "tiny", "--repeats", "0", "--out", "{d}/c.json"], ["--repeats >= 1"]),
    (["--from-points", "{d}/missing.json", "--out", "{d}/c.json"], ["--from-points", "no such file"]),
    (["--from-points", "{d}/bad.json", "--out", "{d}/c.json"], ["bad.json", cg.POINTS_FORMAT]),
    (["--device", "cpu"], ["the following arguments are required: --out"]),
])
def test_bad_arguments_are_one_error_line(tmp_path, capsys, argv, words):
    (tmp_path / "bad.json").write_text(json.dumps({"format": "something-else"}))
    argv = [a.replace("{d}", str(tmp_path)) for a in argv]
    assert cli.main(["calibrate-gpu", *argv]) == 2
    _one_error_line(capsys, *words)
    assert not (tmp_path / "c.json").exists()
