"""The power law fitted to measured demand, held to scipy's general-purpose fitters and sklearn."""

from __future__ import annotations

import math
import warnings

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import OptimizeWarning, curve_fit, least_squares
from sklearn.metrics import r2_score

from geospec.measure.demand_fit import POWER_LAW_R2, DemandFit, fit_demand

Array = npt.NDArray[np.float64]
KEEP = np.array([0.125, 0.25, 0.375, 0.5, 0.625, 0.75, 0.875])
RANGE = (0.01, 10.0)


def law(f: Array, lam: float, a: float) -> Array:
    return lam * (f ** (-a) - 1.0)


def sse_of(f: Array, d: Array, lam: float, a: float) -> float:
    residual = d - law(f, lam, a)
    return float(residual @ residual)


def rounding(d: Array) -> float:
    """What floating point may add to a sum of squares of these values (generously)."""
    return 1e-10 * float(d @ d) + 1e-300


def curve_fit_from(f: Array, d: Array, start: tuple[float, float]) -> tuple[float, float] | None:
    """scipy's unconstrained Levenberg-Marquardt fit from ``start``, or None when it fails."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", (OptimizeWarning, RuntimeWarning))
            params, _ = curve_fit(
                law, f, d, p0=start, ftol=1e-15, xtol=1e-15, gtol=1e-15, maxfev=20_000
            )
    except (RuntimeError, ValueError):
        return None
    lam, a = (float(p) for p in params)
    return (lam, a) if math.isfinite(lam) and math.isfinite(a) else None


@pytest.mark.parametrize("lam", [0.02, 0.5, 4.0])
@pytest.mark.parametrize("a", [0.15, 0.8, 2.5])
@pytest.mark.parametrize("seed", [0, 1])
def test_noisy_fits_agree_with_curve_fit(lam: float, a: float, seed: int) -> None:
    rng = np.random.default_rng(seed)
    clean = law(KEEP, lam, a)
    d = clean + 0.03 * clean.mean() * rng.standard_normal(len(KEEP))
    found = curve_fit_from(KEEP, d, (lam, a))
    assert found is not None, "curve_fit from the true parameters converges on this data"
    fit = fit_demand(KEEP.tolist(), d.tolist())
    assert fit.sensitivity == pytest.approx(found[0], rel=1e-6)
    assert fit.exponent == pytest.approx(found[1], rel=1e-6)
    assert sse_of(KEEP, d, fit.sensitivity, fit.exponent) <= sse_of(KEEP, d, *found) + rounding(d)


@settings(max_examples=15, deadline=None)
@given(
    st.lists(st.floats(0.02, 0.98), min_size=2, max_size=8, unique=True),
    st.data(),
)
def test_the_fit_is_never_worse_than_scipy_from_any_start(
    keep: list[float], data: st.DataObject
) -> None:
    """Arbitrary increases (power law or not): no fit scipy finds within the constraints, from
    several starts, has a smaller residual than fit_demand's (curve_fit unconstrained, its
    results counted where they are feasible; least_squares with the bounds)."""
    f = np.array(keep)
    d = np.array(data.draw(st.lists(st.floats(-1.0, 3.0), min_size=len(f), max_size=len(f))))
    fit = fit_demand(keep, d.tolist())
    assert fit.sensitivity >= 0 and RANGE[0] <= fit.exponent <= RANGE[1]
    ours = sse_of(f, d, fit.sensitivity, fit.exponent)
    for a0 in (0.05, 1.0, 8.0):
        found = curve_fit_from(f, d, (1.0, a0))
        if found is not None and found[0] >= 0 and RANGE[0] <= found[1] <= RANGE[1]:
            assert ours <= sse_of(f, d, *found) + rounding(d)
    for a0 in (0.3, 5.0):
        bounded = least_squares(
            lambda p: law(f, p[0], p[1]) - d,
            x0=(max(float(d.max()), 0.0) + 0.1, a0),
            bounds=([0.0, RANGE[0]], [np.inf, RANGE[1]]),
            xtol=1e-12,
            ftol=1e-12,
            gtol=1e-12,
        )
        assert ours <= sse_of(f, d, *bounded.x) + rounding(d)


@pytest.mark.parametrize(
    ("keep", "lam", "a"),
    [
        ([0.25, 0.5, 0.75], 0.1, 1.0),
        ([0.1, 0.9], 2.0, 0.3),  # two points: exactly determined
        (KEEP, 0.004, 6.0),
        ([0.05, 0.2, 0.4, 0.6, 0.8, 0.95], 1.3, 0.02),  # near the bottom of the range
    ],
)
def test_noiseless_data_is_recovered_exactly(keep: list[float], lam: float, a: float) -> None:
    f = np.array(keep, dtype=np.float64)
    fit = fit_demand(keep, law(f, lam, a).tolist())
    assert fit.sensitivity == pytest.approx(lam, rel=1e-6)
    assert fit.exponent == pytest.approx(a, rel=1e-6)
    assert fit.r2 == pytest.approx(1.0, abs=1e-9) and fit.power_law
    assert fit.predict(keep) == pytest.approx(list(law(f, lam, a)), rel=1e-6)
    assert fit.predict([1.0]) == [0.0]  # no increase at the full width


def test_an_exponent_beyond_the_range_stops_at_its_bound() -> None:
    fit = fit_demand(KEEP.tolist(), law(KEEP, 0.5, 3.0).tolist(), exponent_range=(0.1, 2.0))
    assert fit.exponent == pytest.approx(2.0, rel=1e-12)
    best = least_squares(
        lambda p: law(KEEP, p[0], 2.0) - law(KEEP, 0.5, 3.0), x0=[1.0], bounds=(0.0, np.inf)
    )
    assert fit.sensitivity == pytest.approx(float(best.x[0]), rel=1e-6)


@pytest.mark.parametrize(
    "increase",
    [
        [0.9, 0.5, 0.2, 0.15, 0.05, 0.03, 0.0],  # a power-law-like fall
        [1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0],  # a step
        [0.1, 0.4, 0.05, 0.3, 0.2, 0.0, 0.25],  # noise
        [0.2, -0.1, 0.3, 0.0, 0.1, -0.2, 0.05],
    ],
)
def test_r2_is_the_coefficient_of_determination_of_the_curve(increase: list[float]) -> None:
    fit = fit_demand(KEEP.tolist(), increase)
    expected = r2_score(increase, fit.predict(KEEP.tolist()))
    assert fit.r2 == pytest.approx(expected, rel=1e-9, abs=1e-12)
    assert fit.power_law == (expected >= POWER_LAW_R2)


def test_power_law_follows_the_threshold() -> None:
    assert POWER_LAW_R2 == 0.9
    assert DemandFit(1.0, 1.0, 0.9).power_law
    assert not DemandFit(1.0, 1.0, 0.8999).power_law
    assert not DemandFit(1.0, 1.0, None).power_law


def test_equal_increases_have_no_r2() -> None:
    fit = fit_demand([0.2, 0.5, 0.8], [0.3, 0.3, 0.3])
    assert fit.r2 is None and not fit.power_law


@pytest.mark.parametrize("exponent_range", [(0.01, 10.0), (0.5, 2.0)])
def test_a_layer_whose_cuts_lower_the_loss_has_zero_sensitivity(
    exponent_range: tuple[float, float],
) -> None:
    d = -law(KEEP, 0.2, 1.0)  # the more is cut, the lower the loss
    fit = fit_demand(KEEP.tolist(), d.tolist(), exponent_range=exponent_range)
    assert fit.sensitivity == 0.0
    lo, hi = exponent_range
    assert fit.exponent == pytest.approx(math.sqrt(lo * hi), rel=1e-12)  # not identified: the mid
    assert fit.predict(KEEP.tolist()) == [0.0] * len(KEEP)
    assert fit.r2 == pytest.approx(r2_score(d, np.zeros_like(d)), rel=1e-12)
    assert not fit.power_law


@pytest.mark.parametrize(
    ("keep", "increase", "exponent_range", "message"),
    [
        ([0.2, 0.5, 0.8], [0.1, 0.2], RANGE, "3 keep fractions but 2 loss increases"),
        ([0.5], [0.1], RANGE, "at least 2"),
        ([], [], RANGE, "at least 2"),
        ([0.0, 0.5], [0.1, 0.2], RANGE, "strictly between 0 and 1"),
        ([0.5, 1.0], [0.1, 0.0], RANGE, "strictly between 0 and 1"),
        ([0.5, 1.5], [0.1, 0.0], RANGE, "strictly between 0 and 1"),
        ([-0.2, 0.5], [0.1, 0.0], RANGE, "strictly between 0 and 1"),
        ([math.nan, 0.5], [0.1, 0.0], RANGE, "strictly between 0 and 1"),
        ([0.5, 0.5, 0.7], [0.1, 0.2, 0.0], RANGE, "distinct"),
        ([0.2, 0.5], [math.nan, 0.1], RANGE, "finite"),
        ([0.2, 0.5], [0.1, math.inf], RANGE, "finite"),
        ([[0.2, 0.5]], [[0.1, 0.2]], RANGE, "flat sequences"),
        ([0.2, 0.5], [0.3, 0.1], (0.0, 10.0), "0 < lo < hi"),
        ([0.2, 0.5], [0.3, 0.1], (2.0, 1.0), "0 < lo < hi"),
        ([0.2, 0.5], [0.3, 0.1], (1.0, 1.0), "0 < lo < hi"),
        ([0.2, 0.5], [0.3, 0.1], (0.1, math.inf), "0 < lo < hi"),
    ],
)
def test_bad_inputs_raise(
    keep: list[float],
    increase: list[float],
    exponent_range: tuple[float, float],
    message: str,
) -> None:
    with pytest.raises(ValueError, match=message):
        fit_demand(keep, increase, exponent_range=exponent_range)


@pytest.mark.parametrize("keep", [[0.0], [-0.5], [math.nan], [math.inf]])
def test_predict_rejects_fractions_that_are_not_positive(keep: list[float]) -> None:
    with pytest.raises(ValueError, match="finite and positive"):
        DemandFit(1.0, 1.0, 1.0).predict(keep)


@pytest.mark.parametrize("a", [0.0101, 9.9])
def test_exponents_at_either_end_of_the_range_are_refined_too(a: float) -> None:
    """The search refines between the grid's neighbours of its best point; at the first and the
    last grid point there is one neighbour only, and the exponent must still come out exact."""
    fit = fit_demand(KEEP.tolist(), law(KEEP, 0.3, a).tolist())
    assert fit.exponent == pytest.approx(a, rel=1e-6)
    assert fit.sensitivity == pytest.approx(0.3, rel=1e-6)


def test_the_fit_warns_of_nothing_even_where_f_to_the_minus_a_overflows() -> None:
    """keep 1e-80 at a = 10 is 1e800 (beyond the largest double): the curve's scale overflows on
    purpose and the fit says nothing about it; nor does the refinement (an option scipy does not
    know would warn)."""
    keep, increase = [1e-80, 0.25, 0.5, 0.75], law(np.array([1e-80, 0.25, 0.5, 0.75]), 1e-6, 0.2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fit = fit_demand(keep, increase.tolist())
    assert fit.exponent == pytest.approx(0.2, rel=1e-6)
    assert fit.sensitivity == pytest.approx(1e-6, rel=1e-6)


def test_single_precision_inputs_are_fitted_in_double_precision() -> None:
    """Loss increases straight from a float32 tensor (and float32 fractions) are converted to
    float64 first: the fit equals the fit of the same values given as Python floats."""
    keep32 = KEEP.astype(np.float32)
    increase32 = np.array([15.17, 6.43, 0.976, 0.394, 19.37, 21.74, 14.45], dtype=np.float32)
    assert increase32.mean() != increase32.astype(np.float64).mean()  # float32 sums round
    fit32 = fit_demand(keep32, increase32)  # type: ignore[arg-type]
    fit64 = fit_demand([float(v) for v in keep32], [float(v) for v in increase32])
    assert fit32 == fit64
    assert fit64.predict(keep32) == fit64.predict([float(v) for v in keep32])  # type: ignore[arg-type]


def test_predict_of_a_unit_sensitivity() -> None:
    assert DemandFit(1.0, 1.0, 1.0).predict([0.5, 0.25]) == [1.0, 3.0]  # 1/f - 1


@pytest.mark.parametrize(
    ("keep", "increase"), [([[0.2, 0.5]], [0.1, 0.2]), ([0.2, 0.5], [[0.1, 0.2]])]
)
def test_either_input_nested_is_refused(keep: object, increase: object) -> None:
    with pytest.raises(ValueError) as raised:
        fit_demand(keep, increase)  # type: ignore[arg-type]
    assert str(raised.value) == "keep and increase must be flat sequences of numbers"
