"""Distance matrices on the run's GPU: float32 there, against the float64 CPU reference.

No GPU is needed: the float32 path is the same code given the CPU as its device
(``pairwise_distances(geometry, points, torch.device("cpu"))``), so it runs here. Each float32
distance must lie within the a-priori rounding bound docs/engine.md gives (derived below, not
fitted to our output), and the CPU path of a measurement must give what the plugins give
themselves, bit for bit.
"""

from __future__ import annotations

import math
from typing import ClassVar

import pytest
import torch
from geospec_plugins.geometries import Hyperbolic, Raw, Spherical
from geospec_plugins.statistics import GromovWasserstein, Shift, Topology

from geospec.kinds import Geometry
from geospec.measure.work import measure_profiles, pairwise_distances

pytestmark = pytest.mark.torch

U = 2.0**-24  # float32's unit roundoff
CPU = torch.device("cpu")
#: Where the float32 path is checked: the CPU here; also the GPU where there is one (what
#: benchmarks/gpu_check.sh runs on a GPU machine: the bounds must hold for CUDA's kernels too).
DEVICES = [CPU] + ([torch.device("cuda")] if torch.cuda.is_available() else [])
ON_DEVICES = pytest.mark.parametrize("device", DEVICES, ids=str)


def cloud(n: int = 120, d: int = 256, seed: int = 0) -> torch.Tensor:
    """Probe-like: low-rank structure, an offset from the origin, and two near-duplicate tokens
    (where a Gram-matrix formula would cancel)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=g) @ torch.randn(8, d, generator=g)
    x += 0.1 * torch.randn(n, d, generator=g) + 3.0
    x[1] = x[0] + 1e-3 * torch.randn(d, generator=g)
    return x.double()


def euclidean_bound(points: torch.Tensor) -> torch.Tensor:
    """|e32 - e| for the Euclidean distance e of two rows x, y of ``points`` rounded to float32
    and summed directly: rounding x, y and their difference moves each coordinate difference by
    at most 2u(|x_k| + |y_k|), so the vector by 2u(|x| + |y|); the sum of d squares and the
    square root add a relative (d + 1)u / 2 + u, and e <= |x| + |y|: in all (d/2 + 5) u (|x| +
    |y|), with room for second-order terms."""
    d = points.shape[1]
    norms = points.norm(dim=1)
    return (d / 2 + 5) * U * (norms[:, None] + norms[None, :])


@ON_DEVICES
def test_raw_float32_distances_within_the_bound(device: torch.device) -> None:
    geometry = Raw()
    points = geometry.prepare(cloud())
    exact = geometry.pairwise(points)
    got = pairwise_distances(geometry, points, device)
    assert got.dtype == torch.float64 and got.device.type == "cpu"  # what statistics expect
    assert torch.equal(got, got.T) and bool((got.diagonal() == 0).all())
    error = (got - exact).abs()
    assert bool((error <= euclidean_bound(points)).all())
    assert float(error.max()) > 0  # really computed in float32, not handed the float64 matrix
    # the near-duplicate pair keeps a relative precision a Gram formula in float32 would lose
    assert float(got[0, 1]) == pytest.approx(float(exact[0, 1]), rel=1e-3)


@ON_DEVICES
def test_spherical_float32_angles_within_the_bound(device: torch.device) -> None:
    """theta = 2 asin(e / 2) of unit rows: the chord's bound times d theta / d e = 1 / cos(theta
    / 2), plus a few roundings of asin and the symmetrisation (4u theta)."""
    geometry = Spherical()
    points = geometry.prepare(cloud())
    exact = geometry.pairwise(points)
    got = pairwise_distances(geometry, points, device)
    bound = 1.01 * euclidean_bound(points) / torch.cos(exact / 2) + 4 * U * exact
    assert bool(((got - exact).abs() <= bound).all())
    assert torch.equal(got, got.T) and bool((got.diagonal() == 0).all())


@ON_DEVICES
@pytest.mark.parametrize(
    "params", [Hyperbolic.Params(), Hyperbolic.Params(radius=0.5, curvature=2)]
)
def test_hyperbolic_float32_distances_within_the_bound(
    params: Hyperbolic.Params, device: torch.device
) -> None:
    """f = arccosh(1 + z) / sqrt(c), z = 2c e^2 / rho, rho = (1 - c r^2)^2 for rows of norm r:
    z moves by 2 |de| / e (the Euclidean bound), the float32 sum of d squares in each factor of
    rho by (d + 2)u c r^2 / (1 - c r^2), and 4u of arithmetic; df = sqrt(z / (z + 2)) / sqrt(c)
    dz / z, plus 4u f for log1p and the symmetrisation."""
    geometry = Hyperbolic(params)
    c, r = params.curvature, params.radius
    points = geometry.prepare(cloud())
    exact = geometry.pairwise(points)
    got = pairwise_distances(geometry, points, device)
    d = points.shape[1]
    euclid = Raw().pairwise(points).fill_diagonal_(1.0)  # the diagonal is checked apart
    z = 2 * c * euclid.square() / (1 - c * r * r) ** 2
    relative = 2 * euclidean_bound(points) / euclid + 2 * (d + 2) * U * c * r * r / (1 - c * r * r)
    bound = 1.01 * (z / (z + 2)).sqrt() / math.sqrt(c) * (relative + 4 * U) + 4 * U * exact
    off = ~torch.eye(len(points), dtype=torch.bool)
    assert bool(((got - exact).abs() <= bound)[off].all())
    assert bool((got.diagonal() == 0).all())


class NumpyRaw(Raw):
    """A geometry that does not compute on any device (as a third-party one may not)."""

    pairwise_on_device: ClassVar[bool] = False


def test_a_geometry_not_on_device_gets_its_float64_cpu_points() -> None:
    geometry: Geometry = NumpyRaw()
    points = geometry.prepare(cloud())
    assert torch.equal(pairwise_distances(geometry, points, CPU), geometry.pairwise(points))


def test_the_cpu_path_of_a_measurement_is_the_plugins_own_float64_arithmetic() -> None:
    """On the CPU (no device, or 'cpu') every profile is exactly what the statistic gives when
    called on the plugins directly, without geospec's measurement around it."""
    x = cloud(n=40, d=16)
    clouds = [(x, x + 0.3 * torch.tanh(x))]
    pairs = ["shift/spherical", "gw/raw", "topology/hyperbolic"]
    expected = {
        "shift/spherical": Shift()(Spherical(), *clouds[0]),
        "gw/raw": GromovWasserstein()(Raw(), *clouds[0]),
        "topology/hyperbolic": Topology()(Hyperbolic(), *clouds[0]),
    }
    for device in (None, "cpu"):
        got = measure_profiles(clouds, pairs, workers=1, progress=False, device=device)
        assert got == {name: [value] for name, value in expected.items()}
