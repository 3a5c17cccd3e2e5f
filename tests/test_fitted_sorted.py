"""Controls derived from another arm: ``fitted`` (the best plain taper, checked against scipy's
least squares) and ``sorted``; arms computed in dependency order; a profiles file of another depth.
"""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner
from geospec_plugins.schedules import Fitted, Geometric, Sorted
from scipy.optimize import brentq, least_squares, lsq_linear

from geospec.cli import cli
from geospec.errors import SpecError
from geospec.kinds import ModelDims
from geospec.solve.widths import compute_widths
from geospec.spec import validate_spec
from geospec.testing import minimal_spec

pytestmark = pytest.mark.usefixtures("geospec_registries")

DIMS = ModelDims(n_layers=6, d_model=128, ffn_width=512, multiple_of=16)
# the gw/spherical arm of the CPU study: steep, with a rise at the last layer
GW = [1024, 896, 464, 240, 208, 240]
FAMILIES = ["cosine", "linear", "exponential", "power"]


def family_widths(family: str, theta: float, n: int, u: float) -> np.ndarray:
    """The families as docs/schedules.md writes them (mean held at u)."""
    t = np.arange(n) / (n - 1)
    if family == "cosine":
        c = (1 + np.cos(np.pi * t)) / 2
        return u * (1 + theta * (c - c.mean()))
    if family == "linear":
        return u * (1 + theta * (0.5 - t))
    f = np.exp(-theta * t) if family == "exponential" else (np.arange(n) + 1.0) ** -theta
    return n * u * f / f.sum()


def fitted(family: str, **bounds: float) -> Fitted:
    return Fitted(Fitted.Params(of="source", family=family, **bounds))  # type: ignore[arg-type]


@pytest.mark.parametrize("family", FAMILIES)
def test_unbounded_fit_is_scipys_least_squares(family: str) -> None:
    source = np.asarray(GW, dtype=float)
    schedule = fitted(family, min_ratio=0.01, max_ratio=6.0)
    theta, continuous = schedule.fit(DIMS, GW)

    def residual(x: np.ndarray) -> np.ndarray:
        return family_widths(family, float(x[0]), 6, 512) - source

    best = min(
        (least_squares(residual, [x0], xtol=1e-14, ftol=1e-14, gtol=1e-14) for x0 in (0, 1, 3)),
        key=lambda r: r.cost,
    )
    assert theta == pytest.approx(best.x[0], rel=1e-6, abs=1e-9)
    assert continuous == pytest.approx(family_widths(family, theta, 6, 512), rel=1e-12)
    assert sum(continuous) == pytest.approx(DIMS.budget, rel=1e-12)


@pytest.mark.parametrize("family", ["cosine", "linear"])
def test_bounded_affine_fit_is_lsq_linear(family: str) -> None:
    """With the default bounds (0.25x to 2x) the steep source pushes the fit onto a bound."""
    u, lo, hi = 512.0, 128.0, 1024.0
    shape = family_widths(family, 1.0, 6, u) / u - 1  # w = u (1 + theta * shape)
    # lo <= u (1 + theta c) <= hi for every layer, solved for theta
    upper = min((hi / u - 1) / c if c > 0 else (lo / u - 1) / c for c in shape if c != 0)
    lower = max((lo / u - 1) / c if c > 0 else (hi / u - 1) / c for c in shape if c != 0)
    truth = lsq_linear(u * shape[:, None], np.asarray(GW) - u, bounds=([lower], [upper]))
    theta, _ = fitted(family).fit(DIMS, GW)
    assert theta == pytest.approx(truth.x[0], rel=1e-9)
    assert math.isclose(theta, upper, rel_tol=1e-9)  # the last layer sits at 0.25x


@pytest.mark.parametrize("family", ["exponential", "power"])
def test_bounded_nonlinear_fit_is_least_squares_within_the_feasible_interval(family: str) -> None:
    u, lo, hi = 512.0, 128.0, 1024.0

    def first(theta: float) -> float:
        return float(family_widths(family, theta, 6, u)[0])

    # the first layer's width grows with theta: the bound it meets is where the interval ends
    top = brentq(lambda th: first(th) - hi, 0.0, 60.0, xtol=1e-15)
    source = np.asarray(GW, dtype=float)
    truth = least_squares(
        lambda x: family_widths(family, float(x[0]), 6, u) - source,
        [top / 2],
        bounds=([0.0], [top]),
        xtol=1e-15,
        ftol=1e-15,
        gtol=1e-15,
    )
    theta, continuous = fitted(family).fit(DIMS, GW)
    assert theta == pytest.approx(truth.x[0], rel=1e-7)
    assert lo - 1e-8 <= min(continuous) and max(continuous) <= hi + 1e-8


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("theta", [-0.6, 0.4, 1.1])
def test_a_member_of_the_family_is_recovered(family: str, theta: float) -> None:
    dims = ModelDims(n_layers=9, d_model=64, ffn_width=640, multiple_of=8)
    source = family_widths(family, theta, 9, 640)
    found, _ = fitted(family, min_ratio=0.05, max_ratio=8).fit(dims, list(source))
    assert found == pytest.approx(theta, abs=1e-7)


@pytest.mark.parametrize("family", FAMILIES)
def test_fitted_widths_keep_the_budget_bounds_multiples_and_order(family: str) -> None:
    rng = np.random.default_rng(7)
    dims = ModelDims(n_layers=12, d_model=64, ffn_width=256, multiple_of=16)
    for _ in range(5):
        raw = np.sort(rng.gamma(1.0, size=12))[::-1] + 0.2
        source = list(np.round(raw / raw.sum() * dims.budget / 16) * 16)
        schedule = fitted(family)
        _, continuous = schedule.fit(dims, source)
        widths = schedule.widths_from(dims, {}, {"source": source})
        assert sum(widths) == dims.budget and all(w % 16 == 0 for w in widths)
        assert all(64 <= w <= 512 for w in widths)  # 0.25x and 2x of 256
        assert all(abs(w - c) < 16 for w, c in zip(widths, continuous, strict=True))
        assert all(a >= b for a, b in itertools.pairwise(widths)) or all(
            a <= b for a, b in itertools.pairwise(widths)
        )


def test_sorted_is_the_same_widths_in_decreasing_order() -> None:
    schedule = Sorted(Sorted.Params(of="gw"))
    widths = schedule.widths_from(DIMS, {}, {"gw": GW})
    assert widths == [1024, 896, 464, 240, 240, 208]
    assert sorted(widths) == sorted(GW)


def spec_with(arms: list[dict[str, Any]], **sections: Any) -> Any:
    sections.setdefault(
        "measure", [{"geometry": {"kind": "spherical"}, "statistic": {"kind": "shift"}}]
    )
    return validate_spec(minimal_spec(arms=arms, **sections))


GEOMETRIC = {"kind": "geometric", "profile": "shift/spherical"}


def test_arms_are_computed_after_their_sources_and_listed_in_spec_order() -> None:
    spec = spec_with(
        [
            {"name": "fit", "schedule": {"kind": "fitted", "of": "sorted-geo", "family": "linear"}},
            {"name": "sorted-geo", "schedule": {"kind": "sorted", "of": "geo"}},
            {"name": "uniform", "schedule": {"kind": "uniform"}},
            {"name": "geo", "schedule": GEOMETRIC},
        ]
    )
    profile = {"shift/spherical": [1.0, 4.0, 2.0, 3.0]}
    result = compute_widths(spec.model, spec.arms, profile)
    assert list(result.widths) == ["fit", "sorted-geo", "uniform", "geo"]
    geo = Geometric(Geometric.Params(profile="shift/spherical"))
    dims = ModelDims(4, 32, 64, 8)
    assert result.widths["geo"] == geo.widths(dims, profile)
    assert result.widths["sorted-geo"] == sorted(result.widths["geo"], reverse=True)
    linear = Fitted(Fitted.Params(of="sorted-geo", family="linear"))
    assert result.widths["fit"] == linear.widths_from(dims, {}, result.widths)

    pending = compute_widths(spec.model, spec.arms)  # no profiles: the derived arms wait too
    assert pending.pending == {a: ["shift/spherical"] for a in ("fit", "sorted-geo", "geo")}
    assert list(pending.widths) == ["uniform"]


def test_derived_arms_have_the_bounds_their_widths_were_held_in() -> None:
    """sorted: its source's bounds (the same widths); fitted: its own ratios of the uniform width
    rounded inward to multiples (64 x 0.3 = 19.2 -> 24, 64 x 1.9 = 121.6 -> 120)."""
    spec = spec_with(
        [
            {"name": "uniform", "schedule": {"kind": "uniform"}},
            {
                "name": "geo",
                "schedule": {**GEOMETRIC, "solver": {"kind": "power_law", "max_ratio": 1.5}},
            },
            {"name": "sorted-geo", "schedule": {"kind": "sorted", "of": "geo"}},
            {
                "name": "fit",
                "schedule": {"kind": "fitted", "of": "geo", "min_ratio": 0.3, "max_ratio": 1.9},
            },
        ]
    )
    result = compute_widths(spec.model, spec.arms, {"shift/spherical": [50.0, 1.0, 1.0, 1.0]})
    assert result.bounds == {
        "uniform": None,
        "geo": (16, 96),
        "sorted-geo": (16, 96),
        "fit": (24, 120),
    }
    assert result.widths["geo"][0] == 96  # the profile wants more: the bound binds
    assert result.at_bounds("sorted-geo") == "layer 0 at the upper bound 96"
    assert all(24 <= w <= 120 for w in result.widths["fit"])


def test_a_sorted_arm_of_a_monotone_arm_is_noted(tmp_path: Path) -> None:
    text = (
        'name = "t"\nout = "OUT"\n[model]\nn_layers = 4\nd_model = 32\nn_heads = 2\n'
        "ffn_width = 64\nseq_len = 32\nmultiple_of = 8\n"
        "[[arms]]\nname = 'uniform'\nschedule = { kind = 'uniform' }\n"
        "[[arms]]\nname = 'cosine'\nschedule = { kind = 'cosine' }\n"
        "[[arms]]\nname = 'sorted-cosine'\nschedule = { kind = 'sorted', of = 'cosine' }\n"
        "[train]\nsteps = 1\n"
    ).replace("OUT", str(tmp_path / "run"))
    path = tmp_path / "spec.toml"
    path.write_text(text)
    for command in ("validate", "widths"):
        result = CliRunner().invoke(cli, [command, str(path)])
        assert result.exit_code == 0, result.output
        assert "sorted-cosine has exactly the widths of its source arm 'cosine'" in result.output


@pytest.mark.parametrize(
    ("arms", "path", "message"),
    [
        ([{"name": "s", "schedule": {"kind": "sorted", "of": "geo"}}], "arms[1].schedule.of",
         "no arm is named 'geo'"),
        ([{"name": "s", "schedule": {"kind": "sorted", "of": "unifrom"}}], "arms[1].schedule.of",
         "did you mean 'uniform'"),
        ([{"name": "s", "schedule": {"kind": "sorted", "of": "s"}}], "arms[1].schedule.of",
         "cannot be derived from itself"),
        (
            [
                {"name": "a", "schedule": {"kind": "sorted", "of": "b"}},
                {"name": "b", "schedule": {"kind": "fitted", "of": "c"}},
                {"name": "c", "schedule": {"kind": "sorted", "of": "a"}},
            ],
            "arms[1].schedule.of",
            "cycle ('a' -> 'b' -> 'c' -> 'a')",
        ),
    ],
)  # fmt: skip
def test_source_arms_are_validated(arms: list[dict[str, Any]], path: str, message: str) -> None:
    with pytest.raises(SpecError) as error:
        spec_with([{"name": "uniform", "schedule": {"kind": "uniform"}}, *arms])
    text = str(error.value)
    assert f"{path}: " in text and message in text


def test_widths_from_a_profiles_file_of_another_depth(tmp_path: Path) -> None:
    """The depth-transfer option: a 3-layer profile solved for the 4-layer model equals the
    geometric arm of a pretrained (other-depth) reference given the same profile."""
    shallow = {"shift/spherical": [3.0, 1.0, 2.0]}
    path = tmp_path / "profiles.json"
    transfer = {**GEOMETRIC, "profiles": str(path)}
    spec = spec_with(
        [
            {"name": "uniform", "schedule": {"kind": "uniform"}},
            {"name": "transfer", "schedule": transfer},
            {"name": "sorted", "schedule": {"kind": "sorted", "of": "transfer"}},
        ],
        measure=[],  # nothing measured: the profile comes from the file
    )
    waiting = compute_widths(spec.model, spec.arms)
    assert set(waiting.pending) == {"transfer", "sorted"}
    assert "does not exist yet" in waiting.notes["transfer"]

    path.write_text(json.dumps({"profiles": shallow}))
    result = compute_widths(spec.model, spec.arms, {"shift/spherical": [9.0, 9.0, 9.0, 1.0]})
    own = spec_with([{"name": "geo", "schedule": GEOMETRIC}])
    expected = compute_widths(own.model, own.arms, shallow, pretrained_reference=True)
    assert result.widths["transfer"] == expected.widths["geo"]
    assert len(result.widths["transfer"]) == 4

    path.write_text(json.dumps({"profiles": {"gw/raw": [1.0, 2.0, 3.0]}}))
    with pytest.raises(Exception, match="has no profile 'shift/spherical'"):
        compute_widths(spec.model, spec.arms)
