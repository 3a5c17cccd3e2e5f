"""Geometries against independent truth: scipy, arccos of dot products, geoopt's Poincaré ball."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from geoopt import PoincareBall
from geospec_plugins.geometries import Hyperbolic, Raw, Spherical
from pydantic import ValidationError
from scipy.spatial.distance import cdist

from geospec.errors import GeospecError
from geospec.kinds import Geometry

pytestmark = pytest.mark.torch

GEOMETRIES: list[Geometry] = [
    Raw(),
    Spherical(),
    Hyperbolic(),
    Hyperbolic(Hyperbolic.Params(radius=0.5, curvature=2.0)),
]


def cloud(n: int = 40, d: int = 12, seed: int = 0, offset: float = 0.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, d, generator=g, dtype=torch.float64) + offset


def test_raw_distances_equal_scipy_even_far_from_the_origin() -> None:
    for offset in (0.0, 1e3):
        x = cloud(offset=offset)
        y = cloud(seed=1, offset=offset)
        geometry = Raw()
        got = geometry.pairwise(geometry.prepare(x)).numpy()
        np.testing.assert_allclose(got, cdist(x.numpy(), x.numpy()), rtol=1e-9, atol=1e-9)
        paired = geometry.paired(geometry.prepare(x), geometry.prepare(y)).numpy()
        np.testing.assert_allclose(paired, np.linalg.norm(x.numpy() - y.numpy(), axis=1))


def test_raw_distances_of_near_duplicates_keep_full_relative_precision() -> None:
    x = cloud(offset=1e3)
    direction = torch.ones(x.shape[1], dtype=torch.float64) / math.sqrt(x.shape[1])
    x[1] = x[0] + 1e-6 * direction
    got = Raw().pairwise(Raw().prepare(x))[0, 1].item()
    assert got == pytest.approx(float(torch.linalg.vector_norm(x[1] - x[0])), rel=1e-12)


def test_spherical_distance_is_the_angle() -> None:
    x, y = cloud(), cloud(seed=1)
    u = x.numpy() / np.linalg.norm(x.numpy(), axis=1, keepdims=True)
    v = y.numpy() / np.linalg.norm(y.numpy(), axis=1, keepdims=True)
    geometry = Spherical()
    expected = np.arccos(np.clip(u @ u.T, -1, 1))
    np.fill_diagonal(expected, 0.0)
    got = geometry.pairwise(geometry.prepare(x)).numpy()
    np.testing.assert_allclose(got, expected, atol=1e-9)
    paired = geometry.paired(geometry.prepare(x), geometry.prepare(y)).numpy()
    np.testing.assert_allclose(paired, np.arccos(np.clip((u * v).sum(1), -1, 1)), atol=1e-9)


@pytest.mark.parametrize("angle", [1e-7, 1e-3, 0.5, 3.0])
def test_spherical_is_accurate_for_small_and_large_angles(angle: float) -> None:
    # Two states at a known angle in a random plane, with different norms.
    basis, _ = torch.linalg.qr(cloud(n=8, d=2))
    e1, e2 = basis[:, 0], basis[:, 1]
    points = torch.stack([3.0 * e1, 0.2 * (math.cos(angle) * e1 + math.sin(angle) * e2)])
    points = torch.cat([points, cloud(n=3, d=8, seed=3)])
    geometry = Spherical()
    prepared = geometry.prepare(points)
    assert geometry.pairwise(prepared)[0, 1].item() == pytest.approx(angle, rel=1e-9)
    paired = geometry.paired(prepared[:1], prepared[1:2])
    assert paired.item() == pytest.approx(angle, rel=1e-9)


@pytest.mark.parametrize("curvature", [1.0, 0.25, 3.0])
def test_poincare_distances_equal_geoopt(curvature: float) -> None:
    # A float64 curvature: geoopt would otherwise take sqrt(c) in float32.
    ball = PoincareBall(c=torch.tensor(curvature, dtype=torch.float64))
    edge = 1 / math.sqrt(curvature)
    x, y = cloud(), cloud(seed=1)
    # Points at many radii, up to 95% of the way to the boundary (not only prepared ones).
    g = torch.Generator().manual_seed(2)
    radii = 0.95 * edge * torch.rand(len(x), 1, generator=g, dtype=torch.float64)
    a = radii * x / x.norm(dim=1, keepdim=True)
    b = radii.flip(0) * y / y.norm(dim=1, keepdim=True)
    geometry = Hyperbolic(Hyperbolic.Params(radius=0.5 * edge, curvature=curvature))
    expected = ball.dist(a[:, None, :], a[None, :, :]).numpy()
    np.fill_diagonal(expected, 0.0)
    np.testing.assert_allclose(geometry.pairwise(a).numpy(), expected, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(
        geometry.paired(a, b).numpy(), ball.dist(a, b).numpy(), rtol=1e-9, atol=1e-9
    )
    # Prepared clouds sit at the radius and agree with geoopt too.
    prepared = geometry.prepare(x)
    np.testing.assert_allclose(prepared.norm(dim=1).numpy(), 0.5 * edge, rtol=1e-12)
    expected = ball.dist(prepared[:, None, :], prepared[None, :, :]).numpy()
    np.fill_diagonal(expected, 0.0)
    np.testing.assert_allclose(geometry.pairwise(prepared).numpy(), expected, rtol=1e-9, atol=1e-9)


def test_hyperbolic_is_the_closed_form_in_the_angle() -> None:
    """At a fixed radius r the Poincaré distance is an increasing function of the angle."""
    r, c = 0.9, 1.0
    x = cloud()
    angle = Spherical().pairwise(Spherical().prepare(x)).numpy()
    z = 2 * c * r**2 * (2 - 2 * np.cos(angle)) / (1 - c * r**2) ** 2
    expected = np.arccosh(1 + z) / math.sqrt(c)
    geometry = Hyperbolic()
    got = geometry.pairwise(geometry.prepare(x)).numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("geometry", GEOMETRIES, ids=repr)
def test_pairwise_is_a_symmetric_matrix_with_zero_diagonal(geometry: Geometry) -> None:
    distances = geometry.pairwise(geometry.prepare(cloud(offset=5.0)))
    assert distances.dtype == torch.float64
    assert torch.equal(distances, distances.T)
    assert torch.all(distances.diagonal() == 0)
    assert torch.all(distances >= 0)
    off_diagonal = distances + torch.eye(len(distances))
    assert torch.all(off_diagonal > 0)


@pytest.mark.parametrize("geometry", GEOMETRIES, ids=repr)
def test_scaling_changes_only_raw_distances(geometry: Geometry) -> None:
    x = cloud()
    base = geometry.pairwise(geometry.prepare(x))
    scaled = geometry.pairwise(geometry.prepare(7.5 * x))
    if geometry.scale_sensitive:
        torch.testing.assert_close(scaled, 7.5 * base, rtol=1e-12, atol=1e-12)
    else:
        torch.testing.assert_close(scaled, base, rtol=1e-12, atol=1e-12)
    assert type(geometry).scale_sensitive == isinstance(geometry, Raw)


@pytest.mark.parametrize("geometry", [Spherical(), Hyperbolic()], ids=repr)
def test_normalising_geometries_reject_zero_vectors(geometry: Geometry) -> None:
    x = cloud()
    x[3] = 0.0
    x[17] = 0.0
    with pytest.raises(GeospecError, match=r"2 token\(s\) are zero vectors \(token 3, 17\)"):
        geometry.prepare(x)
    Raw().prepare(x)  # the raw geometry has no trouble with them


def test_hyperbolic_params_must_place_states_inside_the_ball() -> None:
    assert Hyperbolic.Params() == Hyperbolic.Params(radius=0.9, curvature=1.0)
    with pytest.raises(ValidationError, match="not inside the Poincaré ball"):
        Hyperbolic.Params(radius=0.8, curvature=2.0)
    with pytest.raises(ValidationError):
        Hyperbolic.Params(radius=1.0)
    with pytest.raises(ValidationError):
        Hyperbolic.Params(curvature=0.0)
    with pytest.raises(ValidationError):
        Hyperbolic.Params(radius=-0.1)
    with pytest.raises(ValidationError):
        Raw.Params.model_validate({"kind": "raw", "radius": 0.9})


def test_float32_and_float64_clouds_give_float64_distances() -> None:
    x = cloud()
    for geometry in GEOMETRIES:
        got32 = geometry.pairwise(geometry.prepare(x.float()))
        got64 = geometry.pairwise(geometry.prepare(x.float().double()))
        assert torch.equal(got32, got64)
