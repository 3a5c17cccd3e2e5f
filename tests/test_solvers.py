"""The exact-budget solvers and largest-remainder rounding, against properties and scipy."""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence

import numpy as np
import pytest
from geospec_plugins.solvers import PowerLaw, Proportional, water_fill
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import brentq, minimize

from geospec.errors import GeospecError
from geospec.kinds import ModelDims, WidthProblem
from geospec.rounding import InfeasibleBudget, round_to_budget, units_between


@st.composite
def problems(draw: st.DrawFn, exponents: bool = False) -> tuple[ModelDims, list[float], dict]:
    """A model (depth, multiple, uniform width as a whole number of multiples), a random
    non-negative work profile with some positive value, and ratio bounds around 1."""
    n = draw(st.integers(1, 24))
    multiple = draw(st.sampled_from([1, 8, 16, 64]))
    units = draw(st.integers(1, 40))
    dims = ModelDims(n_layers=n, d_model=64, ffn_width=units * multiple, multiple_of=multiple)
    work = draw(st.lists(st.floats(0, 100, allow_subnormal=False), min_size=n, max_size=n))
    if not any(work):
        work[draw(st.integers(0, n - 1))] = 1.0
    bounds = {
        "min_ratio": draw(st.floats(0.05, 1.0)),
        "max_ratio": draw(st.floats(1.0, 4.0)),
    }
    return dims, work, bounds


def assert_valid(widths: list[int], dims: ModelDims, bounds: dict) -> None:
    u = dims.ffn_width
    assert len(widths) == dims.n_layers
    assert sum(widths) == dims.budget
    assert all(w % dims.multiple_of == 0 and w >= dims.multiple_of for w in widths)
    assert all(
        bounds["min_ratio"] * u - 1e-6 <= w <= bounds["max_ratio"] * u + 1e-6 for w in widths
    )


def assert_monotone(work: list[float], widths: list[int]) -> None:
    for i, wi in enumerate(work):
        for j, wj in enumerate(work):
            if wi > wj:
                assert widths[i] >= widths[j], (i, j, work, widths)


@settings(max_examples=150, deadline=None)
@given(problems(), st.floats(0.1, 4.0), st.floats(0.0, 3.0))
def test_exact_budget_bounds_and_order(case: tuple, a: float, beta: float) -> None:
    dims, work, bounds = case
    for solver in (
        PowerLaw(PowerLaw.Params(a=a, **bounds)),
        Proportional(Proportional.Params(beta=beta, **bounds)),
    ):
        widths = solver.solve(dims.width_problem(work))
        assert_valid(widths, dims, bounds)
        assert_monotone(work, widths)


@settings(max_examples=100, deadline=None)
@given(problems(), st.floats(0.01, 1000.0), st.floats(0.1, 4.0))
def test_equal_work_gives_uniform(case: tuple, level: float, a: float) -> None:
    dims, _, bounds = case
    work = [level] * dims.n_layers
    for solver in (
        PowerLaw(PowerLaw.Params(a=a, **bounds)),
        Proportional(Proportional.Params(**bounds)),
    ):
        assert solver.solve(dims.width_problem(work)) == [dims.ffn_width] * dims.n_layers


@settings(max_examples=60, deadline=None)
@given(problems())
def test_per_layer_exponents_keep_the_contract(case: tuple) -> None:
    dims, work, bounds = case
    rng = random.Random(len(work))
    exponents = [rng.uniform(0.3, 3.0) for _ in work]
    widths = PowerLaw(PowerLaw.Params(**bounds)).solve(dims.width_problem(work, exponents))
    assert_valid(widths, dims, bounds)


def test_closed_form_when_no_bound_binds() -> None:
    # KKT with a shared exponent and no active bound: w_l = B * W_l^(1/(a+1)) / sum W^(1/(a+1)).
    work = [3.0, 2.5, 2.0, 1.6, 1.3, 1.0]
    a = 1.5
    dims = ModelDims(6, 64, 1024, 64)
    solver = PowerLaw(PowerLaw.Params(a=a, min_ratio=0.1, max_ratio=5.0))
    got = solver.continuous(dims.width_problem(work))
    weights = [w ** (1 / (a + 1)) for w in work]
    expected = [dims.budget * k / sum(weights) for k in weights]
    assert got == pytest.approx(expected, rel=1e-12)


def test_sensitivities_multiply_work() -> None:
    dims = ModelDims(4, 64, 1024, 64)
    solver = PowerLaw(PowerLaw.Params(min_ratio=0.1, max_ratio=5.0))
    with_lambda = solver.continuous(dims.width_problem([1, 1, 1, 1], sensitivities=[4, 3, 2, 1]))
    as_work = solver.continuous(dims.width_problem([4, 3, 2, 1]))
    assert with_lambda == pytest.approx(as_work, rel=1e-12)


def _scipy_optimum(costs: np.ndarray, exponents: np.ndarray, n: int, lo: float, hi: float) -> float:
    """The surrogate minimised by a generic optimiser, in units of the uniform width."""

    def objective(x: np.ndarray) -> float:
        return float(np.sum(costs * x ** (-exponents)))

    def gradient(x: np.ndarray) -> np.ndarray:
        return -exponents * costs * x ** (-exponents - 1)

    result = minimize(
        objective,
        np.ones(n),
        jac=gradient,
        method="SLSQP",
        bounds=[(lo, hi)] * n,
        constraints=[{"type": "eq", "fun": lambda x: np.sum(x) - n, "jac": lambda x: np.ones(n)}],
        options={"ftol": 1e-12, "maxiter": 2000},
    )
    assert result.success, result.message
    return float(result.fun)


@pytest.mark.parametrize("binding", [False, True])
@pytest.mark.parametrize("per_layer", [False, True])
def test_matches_a_generic_constrained_optimiser(binding: bool, per_layer: bool) -> None:
    rng = np.random.default_rng(1234 + 2 * binding + per_layer)
    uniform = 1000
    checked = 0
    while checked < 12:
        n = int(rng.integers(3, 16))
        if binding:  # a wide spread of work against tight bounds: some layers hit them
            work = rng.lognormal(0.0, 1.5, n)
            min_ratio, max_ratio = 0.6, 1.5
        else:
            work = rng.uniform(1.0, 1.6, n)
            min_ratio, max_ratio = 0.25, 2.0
        exponents = rng.uniform(0.5, 2.5, n) if per_layer else np.full(n, 1.0)
        dims = ModelDims(n, 64, uniform, 1)
        problem = dims.width_problem(list(work), exponents=list(exponents) if per_layer else None)
        solver = PowerLaw(PowerLaw.Params(a=1.0, min_ratio=min_ratio, max_ratio=max_ratio))
        ours = np.array(solver.continuous(problem)) / uniform
        assert abs(ours.sum() - n) < 1e-9
        at_bound = np.isclose(ours, min_ratio, atol=1e-9) | np.isclose(ours, max_ratio, atol=1e-9)
        if at_bound.any() != binding:
            continue  # the draw did not produce the case this test is about
        assert np.all(ours >= min_ratio - 1e-12) and np.all(ours <= max_ratio + 1e-12)
        theirs = _scipy_optimum(work, exponents, n, min_ratio, max_ratio)
        mine = float(np.sum(work * ours ** (-exponents)))
        assert abs(mine - theirs) <= 1e-6 * theirs
        checked += 1


def _kkt_reference(work: list[float], exponents: list[float], lo: float, hi: float) -> list[float]:
    """The KKT solution in units of the uniform width, independently: w_l = clip((a_l W_l /
    mu)^(1/(a_l+1)), lo, hi) with mu found by scipy's brentq on the budget sum_l w_l = n.
    Zero-work layers sit at lo unless every other layer is at hi (then they share the rest)."""
    n = len(work)
    positive = [i for i in range(n) if work[i] > 0]
    zero = [i for i in range(n) if work[i] == 0]
    widths = [lo] * n
    if len(positive) * hi + len(zero) * lo <= n:
        for i in positive:
            widths[i] = hi
        for i in zero:
            widths[i] = (n - len(positive) * hi) / len(zero)
        return widths

    def at(log_mu: float) -> list[float]:
        logs = [(math.log(exponents[i] * work[i]) - log_mu) / (exponents[i] + 1) for i in positive]
        return [math.exp(min(max(x, math.log(lo)), math.log(hi))) for x in logs]

    target = n - len(zero) * lo
    log_mu = brentq(lambda s: sum(at(s)) - target, -2000.0, 2000.0, xtol=1e-15, rtol=1e-15)
    for i, w in zip(positive, at(log_mu), strict=True):
        widths[i] = w
    return widths


KKT_CASES = {
    # name: (work, exponents, min_ratio, max_ratio)
    "most at the upper bound": ([0.5, 1.0, 2.0, 4.0], [0.5, 1.0, 1.5, 2.0], 0.25, 1.05),
    "most at the lower bound": ([0.5, 1.0, 2.0, 40.0], [2.0, 1.5, 1.0, 0.5], 0.95, 2.0),
    "zero-work layers": ([0.0, 1.0, 3.0, 0.0, 2.0], [1.0, 0.5, 2.0, 1.0, 1.5], 0.25, 2.0),
    "zero work, nearly saturated": ([0.0, 1.0, 2.0, 3.0], [0.7, 1.0, 1.3, 2.2], 0.25, 1.4),
    "saturated": ([0.0, 1.0, 2.0, 3.0], [0.7, 1.0, 1.3, 2.2], 0.25, 1.25),
    "nothing binds": ([1.0, 1.2, 1.5, 1.1, 1.3], [0.6, 0.9, 1.2, 1.5, 1.8], 0.25, 2.0),
    # drawn at random; each once told a wrong solver (a mutant) from the right one
    "three zero layers": (
        [0.0, 0.21, 0.0, 0.77, 0.1, 0.0, 1.5],
        [2.1, 2.6, 1.2, 1.0, 1.9, 1.5, 0.8],
        0.5,
        1.85,
    ),
    "wide bounds, one zero layer": ([0.0, 0.6, 0.35], [1.3, 2.9, 0.4], 0.12, 2.92),
    "wide bounds, two zero layers": ([1.75, 0.0, 0.0], [0.6, 2.6, 0.4], 0.14, 2.94),
    "a layer far above the rest": ([0.4, 0.28, 3.14], [1.4, 1.5, 0.4], 0.46, 1.83),
    "two exponents": ([1.0, 2.0, 3.0, 4.0], [1.0, 2.0, 1.0, 2.0], 0.25, 2.0),
    "saturated with room left": ([0.0, 1.0, 2.0, 3.0], [0.7, 1.0, 1.3, 2.2], 0.25, 1.2),
}


@pytest.mark.parametrize("case", list(KKT_CASES))
def test_per_layer_exponents_solve_the_kkt_conditions(case: str) -> None:
    work, exponents, min_ratio, max_ratio = KKT_CASES[case]
    uniform = 1000
    dims = ModelDims(len(work), 64, uniform, 1)
    solver = PowerLaw(PowerLaw.Params(min_ratio=min_ratio, max_ratio=max_ratio))
    ours = solver.continuous(dims.width_problem(work, exponents))
    reference = _kkt_reference(work, exponents, min_ratio, max_ratio)
    assert [w / uniform for w in ours] == pytest.approx(reference, rel=1e-9, abs=1e-12)
    assert sum(ours) == pytest.approx(dims.budget, rel=1e-12)


def _water_level_reference(
    weights: list[float], budget: float, lower: float, upper: float
) -> list[float]:
    """clip(k_l t, lower, upper) with t from scipy's brentq on the budget; zero weights at lower
    unless every other layer is at upper (then they share the rest)."""
    n = len(weights)
    positive = [i for i in range(n) if weights[i] > 0]
    zero = [i for i in range(n) if weights[i] <= 0]
    widths = [float(lower)] * n
    if len(positive) * upper + len(zero) * lower <= budget:
        for i in positive:
            widths[i] = float(upper)
        for i in zero:
            widths[i] = (budget - len(positive) * upper) / len(zero)
        return widths
    remaining = budget - len(zero) * lower

    def excess(t: float) -> float:
        return sum(min(max(weights[i] * t, lower), upper) for i in positive) - remaining

    t = brentq(excess, 0.0, 2 * max(upper / weights[i] for i in positive), xtol=1e-14)
    for i in positive:
        widths[i] = min(max(weights[i] * t, lower), upper)
    return widths


WATER_CASES = [
    # drawn at random; each once told a wrong water level (a mutant) from the right one
    ([1.0, 0.0, 1.47], 3, 1, 10),  # a zero weight, the budget at n * lower
    ([0.0, 2.0, 3.0], 100, 5, 50),  # the level in the last piece: one layer below upper
    ([2.0, 1.0], 78, 5, 50),  # one free layer of weight exactly 1
    ([0.6, 1.0, 0.0, 1.0, 1.91, 1.66], 51, 5, 10),  # five layers at upper leave the zero one 1
]


@pytest.mark.parametrize(("weights", "budget", "lower", "upper"), WATER_CASES)
def test_water_fill_cases(weights: list[float], budget: int, lower: int, upper: int) -> None:
    expected = _water_level_reference(weights, budget, lower, upper)
    assert water_fill(weights, budget, lower, upper) == pytest.approx(expected, rel=1e-9)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.one_of(st.just(0.0), st.floats(0.1, 3.0), st.integers(1, 4).map(float)),
        min_size=2,
        max_size=6,
    ),
    st.sampled_from([1, 2, 5, 10]),
    st.sampled_from([2, 3, 4, 10]),
    st.floats(0.0, 1.0),
)
def test_water_fill_is_the_exact_water_level(
    weights: list[float], lower: int, factor: int, where: float
) -> None:
    if not any(weights):
        weights = [*weights[:-1], 1.0]
    upper = lower * factor
    n = len(weights)
    budget = round(n * lower + where * n * (upper - lower))
    expected = _water_level_reference(weights, budget, lower, upper)
    assert water_fill(weights, budget, lower, upper) == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize("beta", [0.0, 0.5, 2.0])
def test_proportional_widths_follow_work_to_the_power_beta(beta: float) -> None:
    work = [1.0, 1.3, 1.6, 2.0]
    dims = ModelDims(4, 64, 1000, 1)
    solver = Proportional(Proportional.Params(beta=beta, min_ratio=0.1, max_ratio=5.0))
    weights = [w**beta for w in work]
    expected = [dims.budget * k / sum(weights) for k in weights]
    assert solver.continuous(dims.width_problem(work)) == pytest.approx(expected, rel=1e-12)


def test_zero_work_layers_get_the_lower_bound_or_the_remainder() -> None:
    dims = ModelDims(4, 64, 1000, 1)
    solver = PowerLaw(PowerLaw.Params(min_ratio=0.5, max_ratio=2.0))
    assert solver.continuous(dims.width_problem([0, 1, 1, 0])) == pytest.approx(
        [500, 1500, 1500, 500]
    )
    # One working layer saturates at 2x; the zero-work layers share the remaining 2000 equally.
    assert solver.continuous(dims.width_problem([0, 5, 0, 0])) == pytest.approx(
        [2000 / 3, 2000, 2000 / 3, 2000 / 3]
    )


def test_infeasible_bounds_state_the_feasible_range() -> None:
    # Uniform width 96 in multiples of 64: each layer must take 64 or 128, ratios 2/3 and 4/3.
    dims = ModelDims(4, 64, 96, 64)
    solver = PowerLaw(PowerLaw.Params(min_ratio=0.9, max_ratio=2.0))
    with pytest.raises(InfeasibleBudget) as raised:
        solver.solve(dims.width_problem([1, 2, 3, 4]))
    message = str(raised.value)
    assert "min_ratio <= 0.666667" in message and "max_ratio >= 1.33333" in message
    assert isinstance(raised.value, GeospecError) and raised.value.exit_code == 2
    assert solver.check(dims) == [f"solver power_law: {message}"]
    loose = PowerLaw(PowerLaw.Params(min_ratio=0.6, max_ratio=1.4))
    assert loose.check(dims) == []
    assert sorted(loose.solve(dims.width_problem([1, 2, 3, 4]))) == [64, 64, 128, 128]


NEGATIVE = "sensitivities must be finite and non-negative, got [1.0, -1.0, 1.0]"
HARD_LIMITS = "widths within the hard limits [{}, {}] in multiples of 64 cannot sum to the budget"


@pytest.mark.parametrize(
    ("problem", "message"),
    [
        (WidthProblem((), 128, 64, 64, 128), "the work profile is empty"),
        (WidthProblem((1.0,), 100, 64, 64, 128), "budget 100 is not a multiple of 64"),
        # 2..4 multiples each: 3 layers reach 12 multiples at most, the budget is 16
        (WidthProblem((1.0,) * 3, 1024, 64, 128, 256), f"3 {HARD_LIMITS.format(128, 256)} 1024"),
        # 5 multiples at least (320) but 4 at most (310): no width at all
        (WidthProblem((1.0,) * 2, 1024, 64, 300, 310), f"2 {HARD_LIMITS.format(300, 310)} 1024"),
        # 3..4 multiples each: 2 layers need 6 multiples at least, the budget is 4
        (WidthProblem((1.0,) * 2, 256, 64, 192, 256), f"2 {HARD_LIMITS.format(192, 256)} 256"),
    ],
)
def test_the_hard_limits_are_checked_one_condition_at_a_time(
    problem: WidthProblem, message: str
) -> None:
    with pytest.raises(ValueError) as raised:  # InfeasibleBudget is a ValueError
        PowerLaw().solve(problem)
    assert str(raised.value) == message


def test_infeasible_ratio_bounds_are_explained_in_full() -> None:
    # ratios 0.9..2 of 96 in multiples of 64: 128..192, so 4 layers take at least 512 > 384
    solver = PowerLaw(PowerLaw.Params(min_ratio=0.9, max_ratio=2.0))
    with pytest.raises(InfeasibleBudget) as raised:
        solver.solve(ModelDims(4, 64, 96, 64).width_problem([1, 2, 3, 4]))
    assert str(raised.value) == (
        "min_ratio 0.9 and max_ratio 2 of the uniform width 96 allow widths 128..192 in multiples "
        "of 64, which cannot sum to the budget 384 over 4 layers; the feasible range is "
        "min_ratio <= 0.666667 and max_ratio >= 1.33333"
    )


@pytest.mark.parametrize(
    ("exponents", "sensitivities", "message"),
    [
        ([1.0, 0.0, 2.0], None, "exponents must be finite and positive, got [1.0, 0.0, 2.0]"),
        ([1.0, 2.0], None, "2 exponents for 3 layers"),
        (None, [1.0, -1.0, 1.0], NEGATIVE),
        (None, [1.0, 1.0], "2 sensitivities for 3 layers"),
    ],
)
def test_per_layer_inputs_are_checked(
    exponents: list[float] | None, sensitivities: list[float] | None, message: str
) -> None:
    problem = ModelDims(3, 64, 128, 64).width_problem([1, 2, 3], exponents, sensitivities)
    with pytest.raises(ValueError) as raised:
        PowerLaw().solve(problem)
    assert str(raised.value) == message


def test_work_is_checked_and_a_zero_sensitivity_is_allowed() -> None:
    dims = ModelDims(2, 64, 128, 64)
    for work, message in (
        ([1.0, -1.0], "work values must be finite and non-negative, got [1.0, -1.0]"),
        ([0.0, 0.0], "every layer has zero work (times sensitivity): nothing to allocate by"),
    ):
        with pytest.raises(ValueError) as raised:
            PowerLaw().solve(dims.width_problem(work))
        assert str(raised.value) == message
    # lambda = 0 switches a layer off: it gets the lower bound (64) and the others share the
    # remaining 320 as 160 each, 2.5 multiples: the tied extra multiple goes to the first layer
    three = ModelDims(3, 64, 128, 64)
    widths = PowerLaw().solve(three.width_problem([1, 1, 1], sensitivities=[1, 0, 1]))
    assert widths == [192, 64, 128]


def test_equal_per_layer_exponents_are_a_shared_exponent() -> None:
    """a_l = 2 everywhere (the solver's own a is 1): the closed form with a = 2."""
    work = [3.0, 2.5, 2.0, 1.6]
    dims = ModelDims(4, 64, 1024, 1)
    solver = PowerLaw(PowerLaw.Params(a=1.0, min_ratio=0.1, max_ratio=5.0))
    got = solver.continuous(dims.width_problem(work, exponents=[2.0] * 4))
    weights = [w ** (1 / 3) for w in work]
    assert got == pytest.approx([dims.budget * k / sum(weights) for k in weights], rel=1e-12)


def test_bad_work_is_rejected() -> None:
    solver = PowerLaw()
    for work in ([0.0, 0.0], [1.0, -1.0], [1.0, math.nan]):
        with pytest.raises(ValueError):
            solver.solve(WidthProblem(tuple(work), 128, 64, 64, 128))


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.floats(1.0, 50.0), min_size=1, max_size=30),
    st.sampled_from([1, 4, 64]),
    st.integers(0, 10_000),
)
def test_round_to_budget_is_exact_and_moves_each_value_less_than_a_multiple(
    shares: list[float], multiple: int, seed: int
) -> None:
    units = len(shares) * 10 + seed % 7
    budget = units * multiple
    values = [s * budget / sum(shares) for s in shares]
    rounded = round_to_budget(values, budget, multiple, lower=0)
    assert sum(rounded) == budget
    assert all(w % multiple == 0 for w in rounded)
    assert all(abs(w - v) < multiple + 1e-9 for w, v in zip(rounded, values, strict=True))
    assert_monotone(values, rounded)


def test_round_to_budget_rejects_an_impossible_budget() -> None:
    with pytest.raises(InfeasibleBudget, match=r"feasible sums are 256\.\.512"):
        round_to_budget([100.0, 100.0], 640, 64, lower=128, upper=256)
    with pytest.raises(ValueError, match="finite"):
        round_to_budget([math.inf, 1.0], 128, 64)


def _compositions(total: int, parts: int) -> list[tuple[int, ...]]:
    """Every way to write ``total`` as an ordered sum of ``parts`` non-negative integers."""
    if parts == 1:
        return [(total,)]
    return [(k, *rest) for k in range(total + 1) for rest in _compositions(total - k, parts - 1)]


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.floats(0.05, 1.0), min_size=1, max_size=4),
    st.sampled_from([1, 8, 64]),
    st.integers(1, 3),
)
def test_round_to_budget_is_the_nearest_vector_of_multiples(
    shares: list[float], multiple: int, per_layer: int
) -> None:
    """Values on budget: the result is as near (least squares) as any vector of multiples with
    that sum, found by enumerating them all."""
    target = len(shares) * per_layer
    budget = target * multiple
    values = [s * budget / sum(shares) for s in shares]
    rounded = round_to_budget(values, budget, multiple, lower=0)

    def distance(widths: Sequence[float]) -> float:
        return sum((w - v) ** 2 for w, v in zip(widths, values, strict=True))

    best = min(distance([u * multiple for u in c]) for c in _compositions(target, len(values)))
    assert distance(rounded) == pytest.approx(best, rel=1e-9, abs=1e-9)


def test_round_to_budget_clips_then_adds_or_takes_one_multiple_at_a_time() -> None:
    # 1000 -> 200 (the upper bound); the 8 missing multiples alternate between the equal others
    assert round_to_budget([1000, 10, 10], 300, 10, lower=10, upper=200) == [200, 50, 50]
    # both zeros are lifted to the lower bound: the overshoot comes off the only wide layer
    assert round_to_budget([0, 0, 300], 300, 10, lower=50) == [50, 50, 200]


def test_round_to_budget_breaks_ties_by_priority_then_by_layer_order() -> None:
    assert round_to_budget([15, 15], 30, 10) == [20, 10]  # the first layer first
    assert round_to_budget([15, 15], 30, 10, priority=[1, 2]) == [10, 20]  # more priority first
    # taking back: the layer of least priority (then the first) gives first, one at a time
    assert round_to_budget([105, 105, 0], 200, 10, lower=50) == [70, 80, 50]
    assert round_to_budget([105, 105, 0], 200, 10, lower=50, priority=[1, 0, 0]) == [80, 70, 50]


def test_bounds_a_hair_beside_a_multiple_are_that_multiple() -> None:
    # 0.1 * 3 * 640 is 192.00000000000003 in floating point: still 3 multiples of 64
    assert units_between(0.1 * 3 * 640, 1.1 * 640, 64) == (3, 11)
    assert units_between(192 * (1 + 1e-8), 704 * (1 - 1e-8), 64) == (4, 10)  # a real excess


INFEASIBLE = (
    "2 widths in [128, 256] (multiples of 64) cannot sum to 640: feasible sums are 256..512"
)
MISFIT = "budget 100 is not a multiple of 64"
PRIORITIES = "1 priorities for 2 widths"


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda: round_to_budget([1.0], 128, 0), ValueError, "multiple must be >= 1, got 0"),
        (lambda: round_to_budget([], 128, 64), ValueError, "no widths to round"),
        (lambda: round_to_budget([64.0], 100, 64), InfeasibleBudget, MISFIT),
        (lambda: round_to_budget([99.0, 99.0], 640, 64, 128, 256), InfeasibleBudget, INFEASIBLE),
        (lambda: round_to_budget([64.0, 1.0], 128, 64, priority=[1.0]), ValueError, PRIORITIES),
    ],
)
def test_round_to_budget_says_what_is_wrong(
    call: Callable[[], object], error: type[Exception], message: str
) -> None:
    with pytest.raises(error) as raised:
        call()
    assert str(raised.value) == message
