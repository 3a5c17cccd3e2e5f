"""Geometries: how distances between token states are measured (raw, spherical, hyperbolic).

Every geometry works in float64 on CPU tensors: ``prepare`` maps a cloud to its points,
``pairwise`` gives the n x n distance matrix of prepared points (exactly symmetric, zero
diagonal) and ``paired`` the n distances between corresponding rows of two prepared clouds.
``pairwise`` computes on the device of the points it is given (``pairwise_on_device``): on a GPU
run the measurement hands it float32 points on the GPU, whose distances it computes from the
differences of the points directly (:func:`euclidean_pairwise`).

torch is imported inside the functions so that importing this module (``geospec validate``,
``geospec plugins``) stays light.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, ClassVar, Literal

from pydantic import Field, model_validator

from geospec import hookimpl
from geospec.errors import GeospecError
from geospec.kinds import Geometry
from geospec.plugin import PluginParams, Register

if TYPE_CHECKING:
    import torch


class Raw(Geometry):
    """Euclidean distance between the states as they are (scale-sensitive; a control)."""

    scale_sensitive: ClassVar[bool] = True
    pairwise_on_device: ClassVar[bool] = True

    class Params(PluginParams):
        kind: Literal["raw"] = "raw"

    def prepare(self, cloud: torch.Tensor) -> torch.Tensor:
        return _float64(cloud)

    def pairwise(self, points: torch.Tensor) -> torch.Tensor:
        return euclidean_pairwise(points)

    def paired(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return (a - b).norm(dim=1)


class Spherical(Geometry):
    """Unit-normalise every state; the distance is the angle arccos(<u, v>) in radians, in [0, pi].

    Angles are computed from chord lengths (2 asin(|u - v| / 2)), which keeps small angles
    accurate where arccos of a dot product near 1 would lose half the digits.
    """

    pairwise_on_device: ClassVar[bool] = True

    class Params(PluginParams):
        kind: Literal["spherical"] = "spherical"

    def prepare(self, cloud: torch.Tensor) -> torch.Tensor:
        return unit_rows(cloud, "spherical")

    def pairwise(self, points: torch.Tensor) -> torch.Tensor:
        chords = euclidean_pairwise(points)
        return 2 * (chords / 2).clamp_(max=1.0).asin()

    def paired(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        import torch

        return 2 * torch.atan2((a - b).norm(dim=1), (a + b).norm(dim=1))


class Hyperbolic(Geometry):
    """Unit-normalise, scale to ``radius`` inside the Poincaré ball of curvature -``curvature``.

    The distance is the Poincaré distance
    d(x, y) = arccosh(1 + 2c |x - y|^2 / ((1 - c|x|^2)(1 - c|y|^2))) / sqrt(c),
    equal to geoopt's ``PoincareBall(c).dist``. With every state at the same radius it is a
    non-linear, increasing re-weighting of the angle between states.
    """

    pairwise_on_device: ClassVar[bool] = True

    class Params(PluginParams):
        kind: Literal["hyperbolic"] = "hyperbolic"
        radius: float = Field(0.9, gt=0.0)
        """Euclidean norm every state is scaled to; must lie inside the ball: radius < 1/sqrt(c)."""
        curvature: float = Field(1.0, gt=0.0, le=1e6)
        """c > 0: the ball has curvature -c and Euclidean radius 1/sqrt(c)."""

        @model_validator(mode="after")
        def _inside_ball(self) -> Hyperbolic.Params:
            edge = 1.0 / math.sqrt(self.curvature)
            if self.radius * math.sqrt(self.curvature) >= 1.0:
                raise ValueError(
                    f"radius {self.radius} is not inside the Poincaré ball of curvature "
                    f"{self.curvature}, whose radius is {edge:.6g}; use a radius below {edge:.6g}"
                )
            return self

    params: Params

    def prepare(self, cloud: torch.Tensor) -> torch.Tensor:
        return self.params.radius * unit_rows(cloud, "hyperbolic")

    def pairwise(self, points: torch.Tensor) -> torch.Tensor:
        squared = euclidean_pairwise(points).square_()
        room = 1 - self.params.curvature * points.square().sum(dim=1)
        return self._distance(squared, room[:, None] * room[None, :])

    def paired(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        c = self.params.curvature
        room = (1 - c * a.square().sum(dim=1)) * (1 - c * b.square().sum(dim=1))
        return self._distance((a - b).square().sum(dim=1), room)

    def _distance(self, squared: torch.Tensor, room: torch.Tensor) -> torch.Tensor:
        c = self.params.curvature
        z = 2 * c * squared / room
        # arccosh(1 + z) written with log1p: exact for small z, where 1 + z would round.
        return (z + (z * (z + 2)).sqrt()).log1p_() / math.sqrt(c)


def _float64(cloud: torch.Tensor) -> torch.Tensor:
    import torch

    return cloud.detach().to(device="cpu", dtype=torch.float64)


def unit_rows(cloud: torch.Tensor, geometry: str) -> torch.Tensor:
    """Rows scaled to unit norm; a zero row cannot be, and raises a :class:`GeospecError`."""
    points = _float64(cloud)
    norms = points.norm(dim=1, keepdim=True)
    zero = (norms[:, 0] == 0).nonzero().flatten().tolist()
    if zero:
        tokens = ", ".join(str(i) for i in zero[:5]) + (", ..." if len(zero) > 5 else "")
        raise GeospecError(
            f"{len(zero)} token(s) are zero vectors (token {tokens}); the {geometry} geometry "
            "unit-normalises every state and cannot place them. Drop those tokens or measure "
            "with the raw geometry"
        )
    return points / norms


#: Squared distances below this fraction of the largest squared norm are recomputed directly.
CANCELLATION = 1e-4
#: Pairs recomputed at a time (bounds the memory of the direct differences).
CHUNK = 8192


def euclidean_pairwise(points: torch.Tensor) -> torch.Tensor:
    """Euclidean distances between all rows, exactly symmetric with a zero diagonal.

    In float64 (the CPU path) computed from the Gram matrix of the centred rows,
    |x|^2 + |y|^2 - 2<x, y>, which is fast (one matrix product) but loses digits to cancellation
    when x and y are close: centring (distances do not change) helps for clouds far from the
    origin, and the few close pairs are recomputed directly as |x - y|^2, so every distance has
    full relative precision. In float32 (points on a GPU) the cancellation would cost too many of
    float32's digits: every distance is computed from the differences directly.
    """
    import torch

    if points.dtype != torch.float64:
        return direct_pairwise(points)
    centred = points - points.mean(dim=0)
    norms = centred.square().sum(dim=1)
    squared = norms[:, None] + norms[None, :] - 2 * (centred @ centred.T)
    squared = (squared + squared.T).mul_(0.5).clamp_(min=0.0)
    close = squared < CANCELLATION * float(norms.max())
    rows, cols = close.triu_(diagonal=1).nonzero(as_tuple=True)
    for start in range(0, len(rows), CHUNK):
        a, b = rows[start : start + CHUNK], cols[start : start + CHUNK]
        exact = (centred[a] - centred[b]).square().sum(dim=1)
        squared[a, b] = exact
        squared[b, a] = exact
    squared.fill_diagonal_(0.0)
    return squared.sqrt_()


def direct_pairwise(points: torch.Tensor) -> torch.Tensor:
    """|x - y| for all rows from the differences themselves (no Gram matrix, no cancellation),
    exactly symmetric with a zero diagonal: each distance is within (d/2 + 5) 2^-24 (|x| + |y|)
    of the exact one in float32 (docs/engine.md)."""
    import torch

    distances = torch.cdist(points, points, compute_mode="donot_use_mm_for_euclid_dist")
    distances = (distances + distances.T).mul_(0.5)
    return distances.fill_diagonal_(0.0)


@hookimpl
def geospec_register_geometries(register: Register) -> None:
    register(Raw)
    register(Spherical)
    register(Hyperbolic)
