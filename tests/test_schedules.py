"""Width schedules: the tapers, the geometry-derived schedule and its controls, manual lists."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import ClassVar, Literal

import numpy as np
import pytest
from geospec_plugins.schedules import (
    Anti,
    Cosine,
    Geometric,
    Linear,
    Manual,
    Permuted,
    Sigmoid,
    Uniform,
)
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from geospec import hookimpl
from geospec.errors import SpecError, UsageError
from geospec.kinds import ModelDims, Smoother, Solver, WidthProblem
from geospec.plugin import PluginParams, Register
from geospec.testing import registered

DIMS = ModelDims(n_layers=12, d_model=768, ffn_width=3072, multiple_of=64)


def test_cosine_reproduces_the_paper_example_before_rounding() -> None:
    continuous = Cosine().continuous(12, 3072)
    paper = [4608, 4546, 4364, 4078, 3710, 3291, 2853, 2434, 2066, 1780, 1598, 1536]
    assert [round(w) for w in continuous] == paper
    assert sum(continuous) == pytest.approx(12 * 3072)


def _assert_on_budget(widths: list[int], dims: ModelDims) -> None:
    assert len(widths) == dims.n_layers
    assert sum(widths) == dims.budget
    assert all(w >= dims.multiple_of and w % dims.multiple_of == 0 for w in widths)


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 48),
    st.sampled_from([8, 64]),
    st.integers(2, 64),
    st.floats(1.0, 3.0),
    st.floats(1.0, 30.0),
)
def test_tapers_keep_the_budget_and_fall_with_depth(
    n: int, multiple: int, units: int, start: float, steepness: float
) -> None:
    dims = ModelDims(n, 64, units * multiple, multiple)
    end = 2.0 - start if start < 2.0 else 0.1
    for schedule in (
        Uniform(),
        Cosine(Cosine.Params(start=start, end=end)),
        Linear(Linear.Params(start=start, end=end)),
        Sigmoid(Sigmoid.Params(start=start, end=end, steepness=steepness)),
    ):
        widths = schedule.widths(dims, {})
        _assert_on_budget(widths, dims)
        if not isinstance(schedule, Uniform):
            continuous = schedule.continuous(n, dims.ffn_width)
            assert all(a >= b - 1e-9 for a, b in itertools.pairwise(continuous))


def test_linear_taper_is_a_straight_line_from_start_to_end() -> None:
    continuous = Linear().continuous(7, 1000)
    assert continuous == pytest.approx(list(np.linspace(1500, 500, 7)))


def test_sigmoid_taper_runs_from_start_to_end_through_the_mid_depth() -> None:
    continuous = Sigmoid(Sigmoid.Params(steepness=8)).continuous(9, 1000)
    assert continuous[0] == pytest.approx(1500) and continuous[-1] == pytest.approx(500)
    assert continuous[4] == pytest.approx(1000)  # the centre of a symmetric drop
    logistic = [1 / (1 + math.exp(-8 * (0.5 - t))) for t in np.linspace(0, 1, 9)]
    lo, hi = 1 / (1 + math.exp(4)), 1 / (1 + math.exp(-4))
    expected = [500 + 1000 * (s - lo) / (hi - lo) for s in logistic]
    assert continuous == pytest.approx(expected)


def geometric(**params: object) -> Geometric:
    return Geometric(Geometric.Params.model_validate({"profile": "topology/hyperbolic", **params}))


WIDE = {"kind": "power_law", "min_ratio": 0.05, "max_ratio": 10.0}


def test_geometric_resamples_over_normalised_depth() -> None:
    reference = [9.0, 3.0, 6.0, 1.0]  # a 4-layer reference model, a 7-layer target
    dims = ModelDims(7, 64, 640, 64)
    work = geometric().work(dims, {"topology/hyperbolic": reference})
    assert work == pytest.approx(
        list(np.interp(np.linspace(0, 1, 7), np.linspace(0, 1, 4), reference))
    )


def test_geometric_widths_follow_the_power_law_closed_form() -> None:
    # With a = 1 and no bound binding, w_l is proportional to sqrt(W_l) before rounding.
    profile = [4.0, 3.0, 2.5, 2.0, 1.8, 1.5, 1.2, 1.0, 1.0, 0.9, 0.8, 0.7]
    widths = geometric(solver=WIDE).widths(DIMS, {"topology/hyperbolic": profile})
    _assert_on_budget(widths, DIMS)
    roots = [math.sqrt(w) for w in profile]
    expected = [DIMS.budget * r / sum(roots) for r in roots]
    assert all(abs(w - e) < DIMS.multiple_of for w, e in zip(widths, expected, strict=True))


def test_geometric_smooths_before_solving() -> None:
    spiky = [1.0, 1.0, 1.0, 9.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]
    raw = geometric(solver=WIDE).widths(DIMS, {"topology/hyperbolic": spiky})
    smooth = geometric(solver=WIDE, smoother={"kind": "moving_average", "window": 5}).widths(
        DIMS, {"topology/hyperbolic": spiky}
    )
    assert max(smooth) < max(raw) and smooth[1] > raw[1]


def test_geometric_uses_sensitivities_and_intrinsic_dimensions() -> None:
    profiles = {
        "work": [1.0] * 12,
        "lambda": [3.0] * 6 + [1.0] * 6,
        "d_int": [2.0] * 12,  # a_l = 2 / 2 = 1 everywhere: the same as the default exponent
    }
    schedule = geometric(profile="work", sensitivity="lambda", intrinsic_dimension="d_int")
    assert schedule.required_profiles() == ["work", "lambda", "d_int"]
    widths = schedule.widths(DIMS, profiles)
    as_work = geometric(profile="lambda").widths(DIMS, profiles)
    assert widths == as_work


def test_anti_reverses_the_order_for_a_monotone_profile() -> None:
    front_loaded = [10.0, 7.0, 5.0, 4.0, 3.2, 2.6, 2.1, 1.7, 1.4, 1.2, 1.1, 1.0]
    profiles = {"topology/hyperbolic": front_loaded}
    forward = geometric().widths(DIMS, profiles)
    anti = Anti(Anti.Params(profile="topology/hyperbolic")).widths(DIMS, profiles)
    _assert_on_budget(anti, DIMS)
    assert forward == sorted(forward, reverse=True) and forward[0] > forward[-1]
    assert anti == sorted(anti) and anti[0] < anti[-1]


def test_anti_of_a_linear_profile_is_the_mirror_image() -> None:
    linear = [12.0 - i for i in range(12)]
    profiles = {"p": linear}
    solver = {"kind": "power_law", "min_ratio": 0.1, "max_ratio": 5.0}
    forward = geometric(profile="p", solver=solver)
    anti = Anti(Anti.Params.model_validate({"profile": "p", "solver": solver}))
    assert anti.work(DIMS, profiles) == pytest.approx(forward.work(DIMS, profiles)[::-1])
    assert anti.widths(DIMS, profiles) == forward.widths(DIMS, profiles)[::-1]


def test_permuted_shuffles_the_geometric_widths_reproducibly() -> None:
    profile = {"topology/hyperbolic": [float(12 - i) for i in range(12)]}
    base = geometric().widths(DIMS, profile)
    first = Permuted(Permuted.Params(profile="topology/hyperbolic", seed=7)).widths(DIMS, profile)
    again = Permuted(Permuted.Params(profile="topology/hyperbolic", seed=7)).widths(DIMS, profile)
    other = Permuted(Permuted.Params(profile="topology/hyperbolic", seed=8)).widths(DIMS, profile)
    assert sorted(first) == sorted(base) and first != base
    assert first == again and other != first


def test_permuted_never_returns_the_identity_order() -> None:
    for seed in range(50):
        assert Permuted(Permuted.Params(profile="p", seed=seed)).permutation(2) == [1, 0]


def test_manual_returns_its_list_and_reports_every_problem() -> None:
    dims = ModelDims(4, 64, 256, 64)
    good = Manual(Manual.Params(widths=[384, 320, 192, 128]))
    assert good.check(dims) == [] and good.widths(dims, {}) == [384, 320, 192, 128]
    bad = Manual(Manual.Params(widths=[400, 320, 192]))
    problems = bad.check(dims)
    assert len(problems) == 3
    assert "3 entries; the model has 4 layers" in problems[0]
    assert "sum to 912, but the budget is 1024" in problems[1] and "add 112" in problems[1]
    assert "layer 0: 400" in problems[2]
    with pytest.raises(SpecError):
        bad.widths(dims, {})


@pytest.mark.parametrize(
    ("values", "fragment"),
    [
        ([], "is empty"),
        ([1.0, -2.0] + [1.0] * 10, "layer 1 is -2.0"),
        ([1.0, math.nan] + [1.0] * 10, "layer 1 is nan (not finite)"),
        ([0.0] * 12, "all 12 values are zero"),
        ([1.0, "x"] + [1.0] * 10, "layer 1 is 'x', not a number"),
    ],
)
def test_bad_profiles_name_the_profile(values: list, fragment: str) -> None:
    with pytest.raises(UsageError) as raised:
        geometric().widths(DIMS, {"topology/hyperbolic": values})
    assert "'topology/hyperbolic'" in str(raised.value) and fragment in str(raised.value)


def test_a_missing_profile_lists_the_available_ones() -> None:
    with pytest.raises(
        UsageError, match=r"'topology/hyperbolic' is not available \(available: 'gw/raw'\)"
    ):
        geometric().widths(DIMS, {"gw/raw": [1.0] * 12})


def test_nested_tables_are_validated_through_the_registries() -> None:
    params = Geometric.Params.model_validate(
        {"profile": "p", "smoother": {"kind": "gaussian", "sigma": 2}, "solver": "proportional"}
    )
    assert params.smoother.kind == "gaussian" and params.solver.kind == "proportional"
    assert Geometric.Params(profile="p").smoother.kind == "none"
    assert Geometric.Params(profile="p").solver.kind == "power_law"
    with pytest.raises(
        ValidationError, match=r"unknown smoother 'gausian'.*did you mean 'gaussian'"
    ):
        Geometric.Params.model_validate({"profile": "p", "smoother": {"kind": "gausian"}})
    with pytest.raises(ValidationError, match="sigma"):
        Geometric.Params.model_validate(
            {"profile": "p", "smoother": {"kind": "gaussian", "sigma": -1}}
        )


def test_geometric_check_reports_infeasible_solver_bounds() -> None:
    dims = ModelDims(4, 64, 96, 64)
    schedule = geometric(solver={"kind": "power_law", "min_ratio": 0.9})
    (problem,) = schedule.check(dims)
    assert "min_ratio <= 0.666667" in problem


# -- third-party smoothers and solvers inside the geometric schedule ------------------------------


class Reversed(Smoother):
    """A third-party smoother: the profile back to front."""

    class Params(PluginParams):
        kind: Literal["testreversed"] = "testreversed"

    def __call__(self, profile: Sequence[float]) -> list[float]:
        return list(profile)[::-1]


class Recording(Solver):
    """A third-party solver: all spare width to the first layer; remembers its problem."""

    class Params(PluginParams):
        kind: Literal["testrecording"] = "testrecording"

    asked: ClassVar[list[WidthProblem]] = []

    def solve(self, problem: WidthProblem) -> list[int]:
        Recording.asked.append(problem)
        rest = [problem.multiple] * (problem.n_layers - 1)
        return [problem.budget - sum(rest), *rest]


class ThirdParty:
    @hookimpl
    def geospec_register_smoothers(self, register: Register) -> None:
        register(Reversed)

    @hookimpl
    def geospec_register_solvers(self, register: Register) -> None:
        register(Recording)


def test_a_third_party_smoother_and_solver_work_inside_the_geometric_schedule() -> None:
    reference = [9.0, 3.0, 6.0, 1.0]
    dims = ModelDims(7, 64, 640, 64)
    with registered(ThirdParty()):
        smoothed = geometric(smoother={"kind": "testreversed"}, solver="testrecording")
        Recording.asked.clear()
        widths = smoothed.widths(dims, {"topology/hyperbolic": reference})
    [problem] = Recording.asked
    # the solver is asked for the reversed (smoothed) profile resampled to 7 layers
    expected = np.interp(np.linspace(0, 1, 7), np.linspace(0, 1, 4), reference[::-1])
    assert problem.work == pytest.approx(tuple(expected))
    assert (problem.budget, problem.multiple, problem.n_layers) == (7 * 640, 64, 7)
    assert problem.exponents is None and problem.sensitivities is None
    assert widths == [7 * 640 - 6 * 64] + [64] * 6
