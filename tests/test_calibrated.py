"""The ``calibrated`` schedule: widths that minimise the sum of the layers' fitted demand curves,
held to scipy's SLSQP on continuous widths and to a brute-force integer search."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from geospec_plugins.schedules import Calibrated
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError
from scipy.optimize import minimize

from geospec.errors import UsageError
from geospec.kinds import ModelDims
from geospec.plugin import create_plugin
from geospec.solve.widths import compute_widths
from geospec.spec import validate_spec
from geospec.spec.resolve import model_dims
from geospec.testing import minimal_spec

pytestmark = pytest.mark.usefixtures("geospec_registries")

LAMBDA, EXPONENT = "demand/lambda", "demand/exponent"


def calibrated(**params: Any) -> Calibrated:
    schedule = create_plugin("schedule", {"kind": "calibrated", **params})
    assert isinstance(schedule, Calibrated)
    return schedule


def profiles(lam: list[float], a: list[float]) -> dict[str, list[float]]:
    return {LAMBDA: lam, EXPONENT: a}


def objective(widths: Any, lam: list[float], a: list[float], full: float) -> float:
    """sum_l lambda_l (w_l / W)^(-a_l): the fitted errors, constants dropped."""
    f = np.asarray(widths, dtype=np.float64) / full
    return float(np.sum(np.asarray(lam) * f ** (-np.asarray(a))))


def slsqp_optimum(
    lam: list[float], a: list[float], full: float, lower: float, upper: float
) -> np.ndarray:
    """The continuous optimum by SLSQP (widths in units of W for conditioning)."""
    n = len(lam)
    result = minimize(
        lambda x: objective(x, lam, a, 1.0),
        x0=np.ones(n),
        method="SLSQP",
        bounds=[(lower / full, upper / full)] * n,
        constraints=[{"type": "eq", "fun": lambda x: float(np.sum(x)) - n}],
        options={"ftol": 1e-15, "maxiter": 2000},
    )
    assert result.success, result.message
    return np.asarray(result.x) * full


def integer_optimum(
    lam: list[float], a: list[float], dims: ModelDims, lower: int, upper: int
) -> float:
    """The best objective over every assignment of whole multiples within the bounds."""
    m = dims.multiple_of
    units = range(lower // m, upper // m + 1)
    target = dims.budget // m
    best = math.inf
    for head in itertools.product(units, repeat=dims.n_layers - 1):
        last = target - sum(head)
        if lower // m <= last <= upper // m:
            widths = [u * m for u in (*head, last)]
            best = min(best, objective(widths, lam, a, dims.ffn_width))
    return best


CASES = [
    # 4 layers, per-layer exponents, no bound binding
    ([1.0, 0.5, 0.2, 0.1], [0.5, 1.0, 1.5, 0.8]),
    # 4 layers: the first wants more than the upper bound, two want less than the lower one
    ([10.0, 0.01, 0.002, 1.0], [1.0, 1.0, 2.0, 0.5]),
    # 6 layers, one whose cuts did not raise the loss (lambda 0: the lower bound)
    ([0.3, 0.1, 0.0, 0.05, 0.02, 0.2], [1.2, 0.4, 0.3, 2.0, 0.3, 0.7]),
    # 6 layers, exponents spread over two orders of magnitude
    ([0.05, 0.08, 0.12, 0.2, 0.1, 0.04], [0.05, 0.3, 1.0, 3.0, 0.6, 5.0]),
]


@pytest.mark.parametrize(("lam", "a"), CASES)
def test_widths_minimise_the_fitted_errors(lam: list[float], a: list[float]) -> None:
    dims = ModelDims(n_layers=len(lam), d_model=256, ffn_width=1024, multiple_of=64)
    schedule = calibrated()
    lower, upper = 0.25 * dims.ffn_width, 2.0 * dims.ffn_width  # the solver's default ratios
    assert schedule.bounds(dims) == (lower, upper)
    widths = schedule.widths(dims, profiles(lam, a))
    assert sum(widths) == dims.budget
    continuous = slsqp_optimum(lam, a, dims.ffn_width, lower, upper)
    assert np.all(np.abs(np.asarray(widths) - continuous) <= dims.multiple_of + 1e-6)
    best = objective(continuous, lam, a, dims.ffn_width)
    ours = objective(widths, lam, a, dims.ffn_width)
    assert best - 1e-9 * best <= ours <= best * 1.005  # rounding to multiples costs little
    if dims.n_layers == 4:  # every integer split of 4 layers: rounding is (nearly) the best
        assert ours <= integer_optimum(lam, a, dims, int(lower), int(upper)) * 1.002


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 24),
    st.sampled_from([8, 64]),
    st.integers(2, 48),
    st.data(),
)
def test_widths_keep_the_budget_and_the_bounds(
    n: int, multiple: int, units: int, data: st.DataObject
) -> None:
    dims = ModelDims(n, 64, units * multiple, multiple)
    reference = data.draw(st.integers(1, 16))  # the profiles may come from another depth
    lam = data.draw(st.lists(st.floats(0.0, 100.0), min_size=reference, max_size=reference))
    a = data.draw(st.lists(st.floats(0.01, 10.0), min_size=reference, max_size=reference))
    if not any(lam):
        lam[0] = 1.0
    depth = np.linspace(0, 1, n) if n > 1 else np.array([0.5])
    resampled = np.interp(depth, np.linspace(0, 1, reference), lam) if reference > 1 else lam
    if not np.any(resampled):  # lambda > 0 only between the layers the target samples
        with pytest.raises(UsageError, match=r"resampled to \d+ layers': all \d+ values are zero"):
            calibrated().widths(dims, profiles(lam, a))
        return
    ratios = {"min_ratio": data.draw(st.floats(0.1, 1.0)), "max_ratio": data.draw(st.floats(1, 4))}
    schedule = calibrated(solver={"kind": "power_law", **ratios})
    if schedule.check(dims):  # these ratios cannot meet the budget: the solver says so
        with pytest.raises(ValueError, match="min_ratio"):
            schedule.widths(dims, profiles(lam, a))
        return
    widths = schedule.widths(dims, profiles(lam, a))
    assert len(widths) == n and sum(widths) == dims.budget
    assert all(w % multiple == 0 for w in widths)
    bounds = schedule.bounds(dims)
    assert bounds is not None
    lower, upper = bounds
    assert lower >= max(ratios["min_ratio"] * dims.ffn_width, multiple) - 1e-9
    assert upper <= ratios["max_ratio"] * dims.ffn_width + 1e-9
    assert all(lower <= w <= upper for w in widths)


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 16), st.floats(1e-4, 1e3), st.floats(0.01, 10.0))
def test_equal_lambda_and_exponent_give_uniform_widths(n: int, lam: float, a: float) -> None:
    dims = ModelDims(n, 64, 768, 64)
    assert calibrated().widths(dims, profiles([lam] * n, [a] * n)) == [768] * n


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.floats(0.0, 50.0), min_size=2, max_size=16).filter(any),
    st.floats(0.05, 5.0),
)
def test_a_layer_with_larger_lambda_never_gets_less_width(lam: list[float], a: float) -> None:
    """With a shared exponent the fitted errors differ only in lambda: more loss per cut, more
    width (weakly: bounds and rounding to multiples may tie them)."""
    dims = ModelDims(len(lam), 64, 640, 64)
    widths = calibrated().widths(dims, profiles(lam, [a] * len(lam)))
    for i, j in itertools.permutations(range(len(lam)), 2):
        if lam[i] > lam[j]:
            assert widths[i] >= widths[j]


def test_raising_one_layers_lambda_moves_width_to_it() -> None:
    dims = ModelDims(6, 64, 1024, 64)
    a = [0.5, 1.0, 1.5, 0.8, 2.0, 0.3]
    base = calibrated().widths(dims, profiles([1.0] * 6, a))
    raised = calibrated().widths(dims, profiles([1.0, 1.0, 4.0, 1.0, 1.0, 1.0], a))
    assert raised[2] > base[2]
    assert all(r <= b for i, (r, b) in enumerate(zip(raised, base, strict=True)) if i != 2)


def test_a_vanishing_lambda_gets_the_lower_bound() -> None:
    """lambda = 5e-324 (the smallest float) times an exponent below 1 underflows to 0: the solver
    must still treat the layer as nearly free to cut, not fail on log(0)."""
    dims = ModelDims(4, 64, 512, 64)
    widths = calibrated().widths(dims, profiles([5e-324, 1.0, 1.0, 1.0], [0.5, 1.0, 1.5, 2.0]))
    assert sum(widths) == dims.budget
    assert widths[0] == 0.25 * dims.ffn_width


def test_a_lambda_that_vanishes_only_once_resampled_is_named_as_resampled() -> None:
    """lambda > 0 only at the 3-layer reference's middle layer: a 2-layer target samples its ends,
    where it is 0. The profile is fine as given; the error names it as resampled."""
    with pytest.raises(UsageError) as raised:
        calibrated().widths(ModelDims(2, 64, 512, 64), profiles([0.0, 1.0, 0.0], [1.0] * 3))
    assert "profile 'demand/lambda resampled to 2 layers': all 2 values are zero" in str(
        raised.value
    )


def test_profiles_of_another_depth_are_resampled() -> None:
    """A 3-layer reference's fits for a 5-layer target: linear over normalised depth, which for
    these profiles gives the midpoints exactly."""
    dims = ModelDims(5, 64, 512, 64)
    shallow = calibrated().widths(dims, profiles([4.0, 2.0, 1.0], [1.0, 0.5, 2.0]))
    deep = calibrated().widths(
        dims, profiles([4.0, 3.0, 2.0, 1.5, 1.0], [1.0, 0.75, 0.5, 1.25, 2.0])
    )
    assert shallow == deep


def test_params_defaults_and_required_profiles(tmp_path: Path) -> None:
    schedule = calibrated()
    assert schedule.params.solver.kind == "power_law"
    assert schedule.required_profiles() == [LAMBDA, EXPONENT]
    assert schedule.profiles_file() is None
    other = calibrated(sensitivity="x/lam", exponent="x/lam", profiles=str(tmp_path / "p.json"))
    assert other.required_profiles() == ["x/lam"]
    assert other.profiles_file() == str(tmp_path / "p.json")
    with pytest.raises(ValidationError):
        calibrated(sensitivity="")
    with pytest.raises(ValidationError, match="unknown solver"):
        calibrated(solver={"kind": "power_lw"})


def test_check_reports_infeasible_solver_bounds() -> None:
    dims = ModelDims(4, 64, 96, 64)
    (problem,) = calibrated(solver={"kind": "power_law", "min_ratio": 0.9}).check(dims)
    assert "min_ratio <= 0.666667" in problem


DIMS = ModelDims(4, 64, 512, 64)
GOOD_LAMBDA, GOOD_EXPONENT = [1.0, 0.5, 0.2, 0.1], [1.0, 1.0, 1.0, 1.0]


@pytest.mark.parametrize(
    ("given", "fragment"),
    [
        ({EXPONENT: GOOD_EXPONENT}, "'demand/lambda' is not available"),
        ({LAMBDA: GOOD_LAMBDA}, "'demand/exponent' is not available"),
        (
            profiles([1.0, -0.5, 0.2, 0.1], GOOD_EXPONENT),
            "'demand/lambda': layer 1 is -0.5; values must be non-neg",
        ),
        (profiles([0.0] * 4, GOOD_EXPONENT), "'demand/lambda': all 4 values are zero"),
        (
            profiles([1.0, math.nan, 0.2, 0.1], GOOD_EXPONENT),
            "'demand/lambda': layer 1 is nan (not finite)",
        ),
        (
            profiles(GOOD_LAMBDA, [1.0, 1.0, 0.0, 1.0]),
            "'demand/exponent': layer 2 is 0.0; values must be positive",
        ),
        (
            profiles(GOOD_LAMBDA, [1.0, -1.0, 1.0, 1.0]),
            "'demand/exponent': layer 1 is -1.0; values must be positive",
        ),
        (profiles(GOOD_LAMBDA, [1.0, 1.0, 1.0]), "has 4 values but 'demand/exponent' has 3"),
        (profiles([], GOOD_EXPONENT), "'demand/lambda' is empty"),
    ],
)
def test_bad_profiles_raise_usage_errors_naming_them(
    given: dict[str, list[float]], fragment: str
) -> None:
    with pytest.raises(UsageError) as raised:
        calibrated().widths(DIMS, given)
    assert fragment in str(raised.value)


def test_the_core_computes_a_calibrated_arm_from_a_profiles_file(tmp_path: Path) -> None:
    """Through compute_widths (what `geospec widths` and the solve stage call): the FFN
    parameter count of the uniform model, the solver's bounds recorded."""
    lam, a = [2.0, 1.0, 0.5, 0.25], [0.6, 0.9, 1.2, 1.5]
    path = tmp_path / "profiles.json"
    path.write_text(json.dumps({"profiles": profiles(lam, a)}))
    arms = [
        {"name": "uniform", "schedule": {"kind": "uniform"}},
        {"name": "calibrated", "schedule": {"kind": "calibrated", "profiles": str(path)}},
    ]
    spec = validate_spec(minimal_spec(arms=arms))
    result = compute_widths(spec.model, spec.arms)
    dims = model_dims(spec.model)
    expected = calibrated().widths(dims, profiles(lam, a))
    assert result.widths["calibrated"] == expected
    assert result.ffn_params["calibrated"] == result.ffn_params["uniform"]
    assert result.bounds["calibrated"] == calibrated().bounds(dims)
