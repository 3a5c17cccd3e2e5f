"""Work statistics: how far an FFN moved a cloud of token states (shift, gw, topology).

Each statistic is called as ``statistic(geometry, x, y)`` on the clouds before (x) and after
(y) one FFN sub-layer, n x d each with the same tokens in the same order, and measures in that
geometry. Heavy libraries (torch, numpy, POT, giotto-ph) are imported when a statistic runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import Field

from geospec import hookimpl
from geospec.kinds import Geometry, Statistic
from geospec.plugin import PluginParams, Register

if TYPE_CHECKING:
    import numpy as np
    import torch


class Shift(Statistic):
    """Mean distance between corresponding tokens: mean_i d(x_i, y_i)."""

    class Params(PluginParams):
        kind: Literal["shift"] = "shift"

    def __call__(self, geometry: Geometry, x: torch.Tensor, y: torch.Tensor) -> float:
        return float(geometry.paired(geometry.prepare(x), geometry.prepare(y)).mean())


class GromovWasserstein(Statistic):
    """Gromov–Wasserstein discrepancy between the pairwise-distance matrices of x and y.

    Uniform weights 1/n and the square loss. The value reported is the objective of POT's
    ``gromov_wasserstein2``: GW = sum_{i,j,k,l} (Cx[i,k] - Cy[j,l])^2 T[i,j] T[k,l] at the
    coupling T found (no factor 1/2, no square root). With ``coupling = "identity"`` T = I/n (the
    known token correspondence) and GW = mean((Cx - Cy)^2), computed directly. With
    ``"optimal"`` (the default) POT's conditional gradient starts from that identity coupling;
    its exact line search never increases the objective, so the optimal value is never above
    the identity value. (POT's default start, the product coupling, tends to stop in a much
    worse local optimum on FFN updates.) The problem is non-convex: "optimal" is the local
    optimum reached from the identity.

    Without normalisation raw GW scales with the square of a global rescaling of both clouds.
    """

    class Params(PluginParams):
        kind: Literal["gw"] = "gw"
        coupling: Literal["optimal", "identity"] = "optimal"
        """optimal: conditional gradient from the identity coupling; identity: T = I/n."""
        normalize: Literal["none", "max", "mean"] = "none"
        """Divide each distance matrix by its largest entry (max) or its mean off-diagonal
        entry (mean) first, so GW compares shapes regardless of scale."""
        max_iter: int = Field(10_000, ge=1, le=10_000_000)
        """Conditional-gradient iterations at most (POT's max_iter)."""
        tol_rel: float = Field(1e-9, gt=0.0, lt=1.0)
        """Stop when the objective changes by less than this, relatively (POT's tol_rel)."""
        tol_abs: float = Field(1e-9, gt=0.0, lt=1.0)
        """Stop when the objective changes by less than this, absolutely (POT's tol_abs)."""
        max_iter_emd: int = Field(1_000_000, ge=1_000, le=1_000_000_000)
        """Network-simplex iterations at most in each linear sub-problem (POT's numItermaxEmd)."""

    params: Params

    def __call__(self, geometry: Geometry, x: torch.Tensor, y: torch.Tensor) -> float:
        cx = self._normalized(geometry.pairwise(geometry.prepare(x)).numpy())
        cy = self._normalized(geometry.pairwise(geometry.prepare(y)).numpy())
        identity = float(((cx - cy) ** 2).mean())
        if self.params.coupling == "identity":
            return identity
        # The solver starts at the identity and never goes up, but its objective is computed
        # another way and may differ from the closed form in the last digit.
        return min(identity, self.optimal(cx, cy))

    def optimal(self, cx: np.ndarray, cy: np.ndarray) -> float:
        """GW from the identity coupling: POT's conditional gradient (see ``_gromov``)."""
        from geospec_plugins._gromov import Solver, gw_from_identity

        p = self.params
        solver = Solver(p.max_iter, p.tol_rel, p.tol_abs, p.max_iter_emd)
        # The objective is a sum of squares; rounding can leave -1e-18 where it is zero.
        return max(0.0, gw_from_identity(cx, cy, solver))

    def _normalized(self, distances: np.ndarray) -> np.ndarray:
        how = self.params.normalize
        if how == "none":
            return distances
        n = len(distances)
        scale = distances.max() if how == "max" else distances.sum() / (n * (n - 1))
        return distances / scale if scale > 0 else distances


class Topology(Statistic):
    """p-Wasserstein distance between the persistence diagrams of x and y.

    Diagrams: degree-``degree`` homology of the Vietoris–Rips filtrations of the two clouds in
    the geometry's metric (Z/2 coefficients, bars of zero length dropped), computed exactly
    by giotto-ph. Distance: gudhi's ``wasserstein_distance(order=p, internal_p=2)``, solved
    exactly; points are matched to each other or to the diagonal at Euclidean cost.

    Infinite bars: only degree 0 has one (the component that never dies, born at 0 in both
    clouds); infinite bars are matched only with each other, by birth, so it adds nothing.
    From degree 1 up the filtration ends in a cone and every bar is finite.
    """

    class Params(PluginParams):
        kind: Literal["topology"] = "topology"
        degree: int = Field(1, ge=0, le=3)
        """Homology degree: 0 components, 1 loops, 2 voids (slow beyond a few hundred tokens)."""
        p: float = Field(2.0, ge=1.0, le=100.0)
        """Order of the Wasserstein distance between the diagrams."""

    params: Params

    def __call__(self, geometry: Geometry, x: torch.Tensor, y: torch.Tensor) -> float:
        from geospec_plugins._matching import diagram_distance

        return diagram_distance(self.diagram(geometry, x), self.diagram(geometry, y), self.params.p)

    def diagram(self, geometry: Geometry, cloud: torch.Tensor) -> np.ndarray:
        """The persistence diagram of one cloud, as (birth, death) rows."""
        from geospec_plugins._persistence import rips_diagram

        distances = geometry.pairwise(geometry.prepare(cloud)).numpy()
        return rips_diagram(distances, self.params.degree)


@hookimpl
def geospec_register_statistics(register: Register) -> None:
    register(Shift)
    register(GromovWasserstein)
    register(Topology)
