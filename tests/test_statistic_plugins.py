"""Work statistics against independent truth: gudhi, ripser, POT, brute force and invariances."""

from __future__ import annotations

import math
import warnings

import numpy as np
import ot
import pytest
import ripser
import torch
from geospec_plugins._matching import diagram_distance
from geospec_plugins._persistence import band_levels, certified_threshold, rips_diagram
from geospec_plugins.geometries import Hyperbolic, Raw, Spherical
from geospec_plugins.statistics import GromovWasserstein, Shift, Topology
from gudhi.wasserstein import wasserstein_distance
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from geospec.kinds import Geometry, Statistic

pytestmark = pytest.mark.torch

GEOMETRIES: list[Geometry] = [Raw(), Spherical(), Hyperbolic()]
STATISTICS: list[Statistic] = [Shift(), GromovWasserstein(), Topology()]


def ffn_pair(n: int = 60, d: int = 16, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """A low-rank cloud off the origin and the same cloud after an FFN-like update."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=g) @ torch.randn(4, d, generator=g) + 2.0
    x = x + 0.1 * torch.randn(n, d, generator=g)
    update = torch.relu(x @ torch.randn(d, 32, generator=g) / 4) @ torch.randn(32, d, generator=g)
    return x, x + 0.1 * update


def random_diagram(rng: np.random.Generator, size: int, essential: int = 0) -> np.ndarray:
    births = rng.uniform(0, 1, size)
    bars = np.stack([births, births + rng.exponential(0.3, size)], axis=1)
    infinite = np.stack([rng.uniform(0, 1, essential), np.full(essential, np.inf)], axis=1)
    return np.concatenate([bars, infinite]).reshape(-1, 2)


def full_ripser(distances: np.ndarray, degree: int) -> np.ndarray:
    """The reference diagram: ripser.py on the whole filtration."""
    result = ripser.ripser(distances.astype(np.float32), maxdim=degree, distance_matrix=True)
    return np.asarray(result["dgms"][degree], dtype=np.float64)


def sorted_rows(diagram: np.ndarray) -> np.ndarray:
    return diagram[np.lexsort((diagram[:, 1], diagram[:, 0]))]


# Diagram distances -----------------------------------------------------------------------


@pytest.mark.parametrize("p", [1.0, 2.0, 3.0])
@pytest.mark.parametrize(("m", "k"), [(0, 0), (0, 7), (9, 0), (1, 1), (12, 30), (80, 75)])
def test_diagram_distance_equals_gudhi(p: float, m: int, k: int) -> None:
    rng = np.random.default_rng(m * 100 + k)
    a, b = random_diagram(rng, m), random_diagram(rng, k)
    expected = wasserstein_distance(a, b, order=p, internal_p=2)
    assert diagram_distance(a, b, p) == pytest.approx(expected, rel=1e-9, abs=1e-12)
    assert diagram_distance(b, a, p) == pytest.approx(expected, rel=1e-9, abs=1e-12)


@pytest.mark.parametrize("essential", [1, 3])
def test_diagram_distance_matches_infinite_bars_by_birth_like_gudhi(essential: int) -> None:
    rng = np.random.default_rng(essential)
    a, b = random_diagram(rng, 20, essential), random_diagram(rng, 25, essential)
    expected = wasserstein_distance(a, b, order=2.0, internal_p=2)
    assert math.isfinite(expected)
    assert diagram_distance(a, b) == pytest.approx(expected, rel=1e-9)
    unequal = random_diagram(rng, 25, essential + 1)
    assert diagram_distance(a, unequal) == math.inf
    with pytest.warns(UserWarning, match="essential parts differs"):
        assert wasserstein_distance(a, unequal, order=2.0, internal_p=2) == math.inf


def test_diagram_distance_is_zero_only_between_equal_diagrams() -> None:
    a = random_diagram(np.random.default_rng(0), 40, 1)
    assert diagram_distance(a, a[::-1]) == 0.0
    assert diagram_distance(a, a + 1e-3) > 0


# Persistence diagrams --------------------------------------------------------------------


def _clouds() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    angles = rng.uniform(0, 2 * np.pi, 150)
    noisy_circle = np.stack([np.cos(angles), np.sin(angles)], 1) + rng.normal(0, 0.1, (150, 2))
    # A dense cluster inside a big sparse ring: the ring's loop is born at a long edge.
    ring = 5 * np.stack([np.cos(np.arange(24) * np.pi / 12), np.sin(np.arange(24) * np.pi / 12)], 1)
    cluster = rng.normal(0, 0.2, (160, 2))
    outliers = np.concatenate([rng.normal(0, 1, (150, 6)), rng.normal(0, 1, (5, 6)) * 20])
    grid = np.stack(np.meshgrid(np.arange(12), np.arange(12)), -1).reshape(-1, 2)  # many ties
    return {
        "gaussian": rng.normal(0, 1, (200, 5)),
        "low-rank": rng.normal(0, 1, (250, 3)) @ rng.normal(0, 1, (3, 20)),
        "noisy-circle": noisy_circle,
        "ring-around-cluster": np.concatenate([cluster, ring]),
        "outliers": outliers,
        "integer-grid": grid + 1.0,
        "duplicates": np.repeat(rng.normal(0, 1, (60, 4)), 3, axis=0),
    }


CLOUDS = _clouds()


@pytest.mark.parametrize("name", list(CLOUDS))
@pytest.mark.parametrize("geometry", GEOMETRIES, ids=repr)
def test_degree_one_diagrams_equal_the_full_ripser_computation(
    name: str, geometry: Geometry
) -> None:
    points = geometry.prepare(torch.from_numpy(CLOUDS[name]))
    distances = geometry.pairwise(points).numpy()
    got = rips_diagram(distances, 1)
    expected = full_ripser(distances, 1)
    assert got.shape == expected.shape
    np.testing.assert_allclose(sorted_rows(got), sorted_rows(expected), rtol=1e-6)


@settings(max_examples=60, deadline=None)
@given(
    st.integers(8, 80).flatmap(
        lambda n: st.lists(
            st.tuples(st.integers(0, 12), st.integers(0, 12), st.integers(0, 2)),
            min_size=n,
            max_size=n,
        )
    )
)
def test_shortcut_equals_ripser_on_clouds_full_of_ties(points: list[tuple[int, ...]]) -> None:
    """Integer points: many equal distances and duplicates, where tie-breaking could bite."""
    distances = Raw().pairwise(torch.tensor(points, dtype=torch.float64)).numpy()
    got = rips_diagram(distances, 1)
    expected = full_ripser(distances, 1)
    assert got.shape == expected.shape
    np.testing.assert_array_equal(sorted_rows(got), sorted_rows(expected))


def cut_levels(distances: np.ndarray) -> tuple[np.ndarray, list[float], float]:
    d32 = distances.astype(np.float32)
    lengths = np.sort(d32[np.triu_indices(len(d32), 1)])
    enclosing = float(d32.max(axis=1).min())
    levels = band_levels(lengths, int(np.searchsorted(lengths, enclosing, side="right")))
    return d32, levels, enclosing


def test_the_shortcut_is_taken_and_does_not_miss_a_loop_born_late() -> None:
    distances = Raw().pairwise(torch.from_numpy(CLOUDS["ring-around-cluster"])).numpy()
    d32, levels, enclosing = cut_levels(distances)
    threshold = certified_threshold(d32, levels)
    ring_edge = 10 * math.sin(math.pi / 24)
    # The cluster alone would allow a cut far below the ring's edges; the ring's edges have
    # no witness, so the cut must include them.
    assert levels[1] < ring_edge < threshold < enclosing
    bars = rips_diagram(distances, 1)
    assert np.any(np.isclose(bars[:, 0], ring_edge, rtol=1e-5))
    # On a plain cloud the certified cut is well below the enclosing radius.
    plain = Spherical().pairwise(Spherical().prepare(torch.from_numpy(CLOUDS["low-rank"])))
    d32, levels, enclosing = cut_levels(plain.numpy())
    assert certified_threshold(d32, levels) < 0.5 * enclosing


@pytest.mark.parametrize("degree", [0, 2])
def test_other_degrees_equal_ripser(degree: int) -> None:
    distances = Raw().pairwise(torch.from_numpy(CLOUDS["noisy-circle"][:60])).numpy()
    got = rips_diagram(distances, degree)
    expected = full_ripser(distances, degree)
    np.testing.assert_allclose(sorted_rows(got), sorted_rows(expected), rtol=1e-6)
    if degree == 0:
        assert np.isinf(got[:, 1]).sum() == 1


@pytest.mark.parametrize("geometry", GEOMETRIES, ids=repr)
def test_topology_equals_ripser_then_gudhi(geometry: Geometry) -> None:
    x, y = ffn_pair()
    dx = geometry.pairwise(geometry.prepare(x)).numpy()
    dy = geometry.pairwise(geometry.prepare(y)).numpy()
    for degree, p in [(1, 2.0), (0, 2.0), (1, 1.0)]:
        expected = wasserstein_distance(
            full_ripser(dx, degree), full_ripser(dy, degree), order=p, internal_p=2
        )
        statistic = Topology(Topology.Params(degree=degree, p=p))
        assert statistic(geometry, x, y) == pytest.approx(expected, rel=1e-6)


# Gromov–Wasserstein ----------------------------------------------------------------------


@pytest.mark.parametrize("geometry", GEOMETRIES, ids=repr)
def test_gw_matches_pot_from_the_identity_and_never_exceeds_the_identity(
    geometry: Geometry,
) -> None:
    x, y = ffn_pair(n=50)
    cx = geometry.pairwise(geometry.prepare(x)).numpy()
    cy = geometry.pairwise(geometry.prepare(y)).numpy()
    n = len(cx)
    weights = np.full(n, 1 / n)
    expected = ot.gromov.gromov_wasserstein2(
        cx, cy, weights, weights, "square_loss", G0=np.eye(n) / n
    )
    optimal = GromovWasserstein()(geometry, x, y)
    assert optimal == pytest.approx(float(expected), abs=1e-6)
    identity = GromovWasserstein(GromovWasserstein.Params(coupling="identity"))(geometry, x, y)
    assert optimal <= identity


@pytest.mark.parametrize("seed", [2, 5, 10])
def test_gw_matches_pot_over_several_iterations(seed: int) -> None:
    """Strong updates in the raw geometry leave the identity: the solver iterates."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(100, 5, generator=g, dtype=torch.float64)
    x = x @ torch.randn(5, 20, generator=g, dtype=torch.float64)
    mlp = torch.randn(20, 30, generator=g, dtype=torch.float64)
    y = x + (0.2 + seed * 0.3) * torch.relu(x @ mlp) @ mlp.T / 5
    cx = Raw().pairwise(x).numpy()
    cy = Raw().pairwise(y).numpy()
    weights = np.full(100, 1 / 100)
    expected, log = ot.gromov.gromov_wasserstein2(
        cx, cy, weights, weights, "square_loss", G0=np.eye(100) / 100, log=True
    )
    assert len(log["loss"]) > 2  # more than one conditional-gradient step
    assert GromovWasserstein()(Raw(), x, y) == pytest.approx(float(expected), rel=1e-9)


def unrelated_clouds() -> tuple[torch.Tensor, torch.Tensor]:
    """Two independent clouds: the conditional gradient leaves the identity over several steps
    that each lower the value (and every value stays below 1)."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(30, 3)) * 0.5
    y = rng.normal(size=(30, 3)) * rng.uniform(0.5, 2.0, size=3) * 0.5
    return torch.from_numpy(x), torch.from_numpy(y)


@pytest.mark.parametrize(
    "params", [{}, {"max_iter": 1}, {"max_iter": 2}, {"tol_abs": 0.05}, {"tol_rel": 0.05}]
)
def test_gw_stopping_parameters_are_pots(params: dict[str, float]) -> None:
    x, y = unrelated_clouds()
    cx, cy = Raw().pairwise(x).numpy(), Raw().pairwise(y).numpy()
    weights = np.full(30, 1 / 30)
    expected, log = ot.gromov.gromov_wasserstein2(
        cx, cy, weights, weights, "square_loss", G0=np.eye(30) / 30, log=True, **params
    )
    if not params:
        assert len(log["loss"]) > 3 and log["loss"][-1] < log["loss"][1]  # several real steps
    statistic = GromovWasserstein(GromovWasserstein.Params.model_validate(params))
    assert statistic(Raw(), x, y) == pytest.approx(float(expected), rel=1e-9)


def test_gw_identity_coupling_stays_at_the_identity() -> None:
    x, y = unrelated_clouds()
    cx, cy = Raw().pairwise(x).numpy(), Raw().pairwise(y).numpy()
    identity = GromovWasserstein(GromovWasserstein.Params(coupling="identity"))(Raw(), x, y)
    assert identity == pytest.approx(float(((cx - cy) ** 2).mean()), rel=1e-12)
    assert GromovWasserstein()(Raw(), x, y) < 0.6 * identity  # the optimal one moved away


def test_gw_passes_its_linear_program_limit_to_pot() -> None:
    rng = np.random.default_rng(1)
    x, y = (torch.from_numpy(rng.normal(size=(200, 3))) for _ in range(2))
    statistic = GromovWasserstein(GromovWasserstein.Params(max_iter_emd=1000))
    with pytest.warns(UserWarning, match="numItermax reached before optimality"):
        statistic(Raw(), x, y)


def test_gw_identity_equals_the_brute_force_objective() -> None:
    x, y = ffn_pair(n=12)
    geometry = Spherical()
    cx = geometry.pairwise(geometry.prepare(x)).numpy()
    cy = geometry.pairwise(geometry.prepare(y)).numpy()
    n = len(cx)
    coupling = np.eye(n) / n
    loss = (cx[:, None, :, None] - cy[None, :, None, :]) ** 2  # [i, j, k, l]
    expected = np.einsum("ijkl,ij,kl->", loss, coupling, coupling)
    got = GromovWasserstein(GromovWasserstein.Params(coupling="identity"))(geometry, x, y)
    assert got == pytest.approx(expected, rel=1e-12)


def test_gw_from_the_identity_beats_pots_default_start_on_an_ffn_update() -> None:
    x, y = ffn_pair(n=80, seed=3)
    geometry = Spherical()
    cx = geometry.pairwise(geometry.prepare(x)).numpy()
    cy = geometry.pairwise(geometry.prepare(y)).numpy()
    default_start = float(ot.gromov.gromov_wasserstein2(cx, cy, loss_fun="square_loss"))
    assert GromovWasserstein()(geometry, x, y) <= default_start


@pytest.mark.parametrize("normalize", ["max", "mean"])
def test_normalised_gw_ignores_scale_even_in_the_raw_geometry(normalize: str) -> None:
    x, y = ffn_pair()
    statistic = GromovWasserstein(GromovWasserstein.Params(normalize=normalize))
    base = statistic(Raw(), x, y)
    assert base > 0
    assert statistic(Raw(), 4.0 * x, 4.0 * y) == pytest.approx(base, rel=1e-9)
    cx = Raw().pairwise(Raw().prepare(x)).numpy()
    scale = cx.max() if normalize == "max" else cx.sum() / (len(cx) * (len(cx) - 1))
    identity = GromovWasserstein(GromovWasserstein.Params(coupling="identity"))
    unnormalised = identity(Raw(), x / scale, y)
    assert unnormalised != pytest.approx(base)  # the normalisation did something


@pytest.mark.parametrize("normalize", ["max", "mean"])
def test_normalised_gw_is_gw_of_the_rescaled_distance_matrices(normalize: str) -> None:
    """Each matrix divided by its largest entry, or by its mean off-diagonal entry (numpy's mean
    over the entries off the diagonal), then the identity-coupling GW (clouds small enough that
    every scale is below 1)."""
    x, y = unrelated_clouds()
    x, y = 0.05 * x, 0.1 * y
    off = ~np.eye(30, dtype=bool)
    matrices = []
    for cloud in (x, y):
        c = Raw().pairwise(cloud).numpy()
        scale = c.max() if normalize == "max" else c[off].mean()
        assert scale < 1
        matrices.append(c / scale)
    statistic = GromovWasserstein(
        GromovWasserstein.Params(normalize=normalize, coupling="identity")
    )
    expected = float(((matrices[0] - matrices[1]) ** 2).mean())
    assert statistic(Raw(), x, y) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("normalize", ["max", "mean"])
def test_normalised_gw_of_clouds_collapsed_to_a_point_is_zero(normalize: str) -> None:
    """All distances zero: nothing to divide by, and nothing moved."""
    point = torch.ones(8, 4, dtype=torch.float64)
    statistic = GromovWasserstein(GromovWasserstein.Params(normalize=normalize))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no division by zero
        assert statistic(Raw(), point, 2 * point) == 0.0


# Invariances -----------------------------------------------------------------------------

PAIRS = [(s, g) for s in STATISTICS for g in GEOMETRIES]
IDS = [f"{s.kind_name()}/{g.kind_name()}" for s, g in PAIRS]


@pytest.mark.parametrize(("statistic", "geometry"), PAIRS, ids=IDS)
def test_every_statistic_is_zero_when_nothing_moves(
    statistic: Statistic, geometry: Geometry
) -> None:
    x, _ = ffn_pair()
    assert statistic(geometry, x, x.clone()) == pytest.approx(0.0, abs=1e-12)


@pytest.mark.parametrize(("statistic", "geometry"), PAIRS, ids=IDS)
def test_scaling_both_clouds(statistic: Statistic, geometry: Geometry) -> None:
    x, y = ffn_pair()
    base = statistic(geometry, x, y)
    assert base > 0
    scaled = statistic(geometry, 4.0 * x, 4.0 * y)
    # Raw work scales like the distances (gw like their squares); normalised work does not.
    power = 2 if isinstance(statistic, GromovWasserstein) else 1
    factor = 4.0**power if geometry.scale_sensitive else 1.0
    rel = 1e-5 if isinstance(statistic, Topology) else 1e-9  # float32 diagrams
    assert scaled == pytest.approx(factor * base, rel=rel)


@pytest.mark.parametrize(("statistic", "geometry"), PAIRS, ids=IDS)
def test_permuting_the_tokens_of_both_clouds_changes_nothing(
    statistic: Statistic, geometry: Geometry
) -> None:
    x, y = ffn_pair()
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(1))
    base = statistic(geometry, x, y)
    assert statistic(geometry, x[order], y[order]) == pytest.approx(base, rel=1e-6)


@pytest.mark.parametrize(("statistic", "geometry"), PAIRS, ids=IDS)
def test_statistics_are_deterministic(statistic: Statistic, geometry: Geometry) -> None:
    x, y = ffn_pair(seed=5)
    assert statistic(geometry, x, y) == statistic(geometry, x.clone(), y.clone())


def test_shift_is_the_mean_paired_distance() -> None:
    x, y = ffn_pair()
    expected = np.linalg.norm(x.double().numpy() - y.double().numpy(), axis=1).mean()
    assert Shift()(Raw(), x, y) == pytest.approx(expected, rel=1e-12)


def test_params_are_constrained() -> None:
    assert GromovWasserstein.Params().coupling == "optimal"
    assert Topology.Params() == Topology.Params(degree=1, p=2.0)
    bad: list[tuple[type[Statistic], dict[str, object]]] = [
        (GromovWasserstein, {"coupling": "best"}),
        (GromovWasserstein, {"normalize": True}),
        (GromovWasserstein, {"tol_rel": 0}),
        (Topology, {"degree": -1}),
        (Topology, {"p": 0.5}),
        (Topology, {"p": math.inf}),
        (Shift, {"scale": 2}),
    ]
    for cls, values in bad:
        with pytest.raises(ValidationError):
            cls.Params.model_validate(values)
