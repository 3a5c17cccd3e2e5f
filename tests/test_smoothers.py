"""Profile smoothers, against reference implementations and the properties they promise."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from geospec_plugins.smoothers import Gaussian, Isotonic, MovingAverage, NoSmoothing, SavitzkyGolay
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError
from scipy.ndimage import gaussian_filter1d
from scipy.signal import savgol_filter
from sklearn.isotonic import IsotonicRegression

from geospec.kinds import Smoother

profiles = st.lists(st.floats(0, 1000, allow_subnormal=False), min_size=1, max_size=40)

SMOOTHERS: list[Smoother] = [
    NoSmoothing(),
    MovingAverage(MovingAverage.Params(window=3)),
    MovingAverage(MovingAverage.Params(window=7)),
    Gaussian(Gaussian.Params(sigma=0.7)),
    Gaussian(Gaussian.Params(sigma=3.0)),
    SavitzkyGolay(SavitzkyGolay.Params(window=5, order=2)),
    Isotonic(),
]


@settings(max_examples=60, deadline=None)
@given(profiles)
def test_every_smoother_keeps_length_and_non_negativity(profile: list[float]) -> None:
    for smoother in SMOOTHERS:
        out = smoother(profile)
        assert len(out) == len(profile)
        assert all(v >= 0 for v in out), smoother


@settings(max_examples=30, deadline=None)
@given(st.floats(0.001, 1000), st.integers(1, 30))
def test_a_constant_profile_stays_constant(level: float, n: int) -> None:
    for smoother in SMOOTHERS:
        assert smoother([level] * n) == pytest.approx([level] * n, rel=1e-9)


def test_none_is_the_identity() -> None:
    assert NoSmoothing()([3, 1, 2]) == [3.0, 1.0, 2.0]


def test_moving_average_interior_matches_convolution_and_edges_average_what_exists() -> None:
    profile = [4.0, 8.0, 1.0, 3.0, 9.0, 2.0, 6.0]
    out = MovingAverage(MovingAverage.Params(window=5))(profile)
    interior = np.convolve(profile, np.ones(5) / 5, mode="valid")
    assert out[2:-2] == pytest.approx(interior)
    # At the ends the window is truncated: layer 0 averages layers 0..2, layer 1 layers 0..3.
    assert out[0] == pytest.approx((4 + 8 + 1) / 3)
    assert out[1] == pytest.approx((4 + 8 + 1 + 3) / 4)
    assert out[-1] == pytest.approx((9 + 2 + 6) / 3)


def test_moving_average_window_must_be_odd() -> None:
    with pytest.raises(ValidationError, match="odd"):
        MovingAverage.Params(window=4)


def test_gaussian_interior_matches_scipy() -> None:
    rng = np.random.default_rng(0)
    profile = rng.uniform(0, 10, 60)
    sigma = 1.5
    out = np.array(Gaussian(Gaussian.Params(sigma=sigma))(list(profile)))
    reference = gaussian_filter1d(profile, sigma, truncate=4.0)
    edge = int(np.ceil(4 * sigma))  # away from the ends no kernel weight is dropped
    assert out[edge:-edge] == pytest.approx(reference[edge:-edge], rel=1e-9)


def test_gaussian_edges_renormalise_the_truncated_kernel() -> None:
    # A ramp: near the ends the average leans inwards, but stays between the end values.
    ramp = [float(i) for i in range(10)]
    out = Gaussian(Gaussian.Params(sigma=2.0))(ramp)
    assert 0.0 < out[0] < 1.5 and 7.5 < out[-1] < 9.0
    assert out == sorted(out)


def test_savgol_matches_a_local_polynomial_fit() -> None:
    rng = np.random.default_rng(1)
    profile = list(rng.uniform(5, 10, 15))
    window, order = 7, 3
    out = SavitzkyGolay(SavitzkyGolay.Params(window=window, order=order))(profile)
    half = window // 2
    for i in range(half, len(profile) - half):  # each interior point: the centre of its own fit
        xs = np.arange(-half, half + 1)
        coefficients = np.polyfit(xs, profile[i - half : i + half + 1], order)
        assert out[i] == pytest.approx(np.polyval(coefficients, 0.0), rel=1e-9)
    # Edge layers: the polynomial fitted to the first window, evaluated at their positions.
    first = np.polyfit(np.arange(window), profile[:window], order)
    assert out[0] == pytest.approx(np.polyval(first, 0.0), rel=1e-9)
    assert out[:5] == pytest.approx(list(savgol_filter(profile, window, order, mode="interp")[:5]))


def test_savgol_shrinks_its_window_for_short_profiles_and_clips_below_zero() -> None:
    short = SavitzkyGolay(SavitzkyGolay.Params(window=9, order=2))([5.0, 3.0, 4.0, 1.0])
    assert len(short) == 4 and all(v >= 0 for v in short)
    cliff = SavitzkyGolay(SavitzkyGolay.Params(window=5, order=4))([0, 0, 0, 0, 50, 0, 0, 0.0])
    assert min(cliff) == 0.0
    with pytest.raises(ValidationError, match="smaller than window"):
        SavitzkyGolay.Params(window=5, order=5)


@settings(max_examples=100, deadline=None)
@given(profiles)
def test_isotonic_is_the_least_squares_non_increasing_fit(profile: list[float]) -> None:
    out = Isotonic()(profile)
    reference = IsotonicRegression(increasing=False).fit_transform(
        np.arange(len(profile)), np.array(profile)
    )
    assert out == pytest.approx(list(reference), rel=1e-9, abs=1e-9)
    assert all(a >= b for a, b in itertools.pairwise(out))
    assert Isotonic()(out) == pytest.approx(out)
