"""The one cost-model fitter (mimo_accel.costs.fit): its pure contract, as properties."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mimo_accel.costs.fit import SingularDesign, fit_costs, fit_near, nnls, solve, step_means, within_steps
from tests._hypothesis import examples

_SETTINGS = settings(max_examples=examples(60), deadline=None)


def _features(seed: int, n: int, columns: int) -> np.ndarray:
    """Rows, Σ rows² and items as a module's observations carry them (independent enough to fit)."""
    rng = np.random.default_rng(seed)
    rows = rng.integers(100, 6000, size=(n, 2)).astype(np.float64)
    return np.column_stack([rows[:, 0], rows[:, 1] ** 2, rng.integers(1, 6, size=n)])[:, :columns]


coefficient = st.one_of(st.just(0.0), st.floats(1e-9, 1e-3))


@_SETTINGS
@given(seed=st.integers(0, 2**16), w=st.lists(coefficient, min_size=1, max_size=3),
       overhead=st.one_of(st.just(0.0), st.floats(1e-6, 0.1)), relative=st.booleans())
def test_noiseless_coefficients_are_recovered(seed, w, overhead, relative):
    x = _features(seed, 24, len(w))
    truth = np.array(w)
    y = x @ truth + overhead
    if relative and not (y > 0).all():
        return
    fit = fit_costs(x, y, relative=relative)
    scale = np.abs(x).max(axis=0)  # compared in seconds per observation, where every term is sized alike
    assert np.allclose(fit.coefficients * scale, truth * scale, rtol=1e-6, atol=1e-9 * max(1.0, y.max()))
    assert fit.overhead == pytest.approx(overhead, abs=1e-7 * max(1.0, y.max()))
    assert np.allclose(fit.predicted, y, rtol=1e-8, atol=1e-12)
    if np.ptp(y) > 1e-6 * y.max():  # R² is the share of the variation explained: only where there is some
        assert fit.r2 == pytest.approx(1.0, abs=1e-9)


@_SETTINGS
@given(seed=st.integers(0, 2**16), columns=st.integers(1, 4), mode=st.sampled_from(["none", "one", "per_step"]))
def test_coefficients_are_never_negative(seed, columns, mode):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((30, columns))
    y = rng.standard_normal(30)  # times that fall with some features: NNLS clamps, never goes below 0
    fit = fit_costs(x, y, overhead=mode, steps=np.repeat(np.arange(10), 3), max_condition=None)
    assert (fit.coefficients >= 0).all()
    if mode == "one":
        assert fit.overhead >= 0


@_SETTINGS
@given(seed=st.integers(0, 2**16), unit=st.floats(1e-3, 1e3), column_scale=st.floats(1e-3, 1e3))
def test_scale_invariance(seed, unit, column_scale):
    """Times in another unit scale every coefficient alike; a feature counted in another unit
    scales its own coefficient inversely; the fit is otherwise the same."""
    rng = np.random.default_rng(seed)
    x = _features(seed, 20, 3)
    y = x @ np.array([2e-5, 3e-9, 5e-3]) * (1 + 0.05 * rng.standard_normal(20)) + 0.01
    base = fit_costs(x, y)
    in_unit = fit_costs(x, y * unit)
    assert np.allclose(in_unit.coefficients, base.coefficients * unit, rtol=1e-6)
    assert in_unit.overhead == pytest.approx(base.overhead * unit, rel=1e-6, abs=1e-12)
    x2 = x.copy()
    x2[:, 0] *= column_scale
    rescaled = fit_costs(x2, y)
    assert rescaled.coefficients[0] == pytest.approx(base.coefficients[0] / column_scale, rel=1e-6)
    assert np.allclose(rescaled.coefficients[1:], base.coefficients[1:], rtol=1e-6, atol=1e-15)
    assert np.allclose(rescaled.predicted, base.predicted, rtol=1e-8)


@_SETTINGS
@given(seed=st.integers(0, 2**16), levels=st.lists(st.floats(0.0, 10.0), min_size=8, max_size=8))
def test_per_step_levels_leave_the_coefficients_alone(seed, levels):
    """What every observation of a step shares (its overhead, the machine's speed then) is taken
    out: adding any level per step changes the step overheads only."""
    x = _features(seed, 32, 3)
    steps = np.repeat(np.arange(8), 4)
    y = x @ np.array([2e-5, 3e-9, 5e-3])
    plain = fit_costs(x, y, overhead="per_step", steps=steps)
    shifted = fit_costs(x, y + np.array(levels)[steps], overhead="per_step", steps=steps)
    assert np.allclose(shifted.coefficients, plain.coefficients, rtol=1e-6, atol=1e-15)
    for s in range(8):
        assert shifted.step_overheads[s] == pytest.approx(plain.step_overheads[s] + levels[s], abs=1e-6)


@_SETTINGS
@given(seed=st.integers(0, 2**16))
def test_step_means_do_not_depend_on_row_order(seed):
    rng = np.random.default_rng(seed)
    steps = rng.integers(0, 5, size=17)
    values = rng.standard_normal((17, 2))
    order = rng.permutation(17)
    assert np.allclose(step_means(values, steps)[order], step_means(values[order], steps[order]))
    within = within_steps(values, steps)
    for s in np.unique(steps):
        assert np.allclose(within[steps == s].sum(axis=0), 0.0, atol=1e-12)


def test_columns_that_cannot_be_told_apart_are_refused():
    x = _features(0, 12, 2)
    with pytest.raises(SingularDesign) as caught:
        fit_costs(np.column_stack([x, 2 * x[:, 0]]), x @ [1e-5, 1e-9])
    assert 0 in caught.value.columns and 2 in caught.value.columns and 1 not in caught.value.columns
    with pytest.raises(SingularDesign) as caught:
        solve(x[:1], np.ones(1))  # one row, two columns
    assert caught.value.columns == (0, 1) and caught.value.rows == 1


@_SETTINGS
@given(seed=st.integers(0, 2**16))
def test_solve_is_nnls_of_the_full_system(seed):
    rng = np.random.default_rng(seed)
    x, y = rng.standard_normal((25, 3)), rng.standard_normal(25)
    w = solve(x, y, max_condition=None)
    direct = nnls(x, y)
    assert np.linalg.norm(x @ w - y) == pytest.approx(np.linalg.norm(x @ direct - y), rel=1e-9, abs=1e-12)


@_SETTINGS
@given(seed=st.integers(0, 2**16), prior=st.floats(0.0, 50.0))
def test_a_prior_centred_on_the_truth_keeps_it(seed, prior):
    x = _features(seed, 24, 3)
    steps = np.repeat(np.arange(6), 4)
    truth = np.array([2e-5, 3e-9, 5e-3])
    w, varying = fit_near(x, x @ truth + 0.01, steps, truth.copy(), prior)
    assert varying.all() and np.allclose(w, truth, rtol=1e-6)


def test_a_strong_prior_holds_the_centre_and_a_weak_one_follows_the_steps():
    x = _features(3, 24, 3)
    steps = np.repeat(np.arange(6), 4)
    truth, centre = np.array([2e-5, 3e-9, 5e-3]), np.array([4e-5, 1e-9, 2e-3])
    y = x @ truth
    strong, _ = fit_near(x, y, steps, centre.copy(), 1e8)
    weak, _ = fit_near(x, y, steps, centre.copy(), 1e-8)
    assert np.allclose(strong, centre, rtol=1e-3) and np.allclose(weak, truth, rtol=1e-3)


def test_bad_calls_are_refused_with_the_fix():
    x = _features(0, 6, 2)
    with pytest.raises(ValueError, match="overhead must be one of none, one, per_step"):
        fit_costs(x, np.ones(6), overhead="two")
    with pytest.raises(ValueError, match="per-step overheads need the steps"):
        fit_costs(x, np.ones(6), overhead="per_step")
    with pytest.raises(ValueError, match="relative error needs every time finite and > 0"):
        fit_costs(x, np.zeros(6), relative=True)
    with pytest.raises(ValueError, match="features must be"):
        fit_costs(x, np.ones(5))
