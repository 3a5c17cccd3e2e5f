"""Intrinsic dimension of a point cloud: the TwoNN estimator (Facco et al. 2017).

For every point, mu = r2 / r1 is the ratio of the distances to its second and first nearest
neighbours. On a d-dimensional manifold with locally uniform density mu follows a Pareto law,
F(mu) = 1 - mu^(-d), so -log(1 - F(mu)) = d log(mu): a line through the origin whose slope is d.
The estimate is the least-squares slope of that line over the empirical distribution, after the
largest ratios (a ``discard`` fraction, the paper's heuristic against outliers) are dropped. This
is exactly scikit-dimension's ``skdim.id.TwoNN(discard_fraction=...)`` (same empirical
distribution i / N, same trimming), checked in the tests.

Fit quality: ``r2`` is the coefficient of determination of that line (1 - residual sum of squares
/ total sum of squares about the mean), low when the ratios are not Pareto (several scales, strong
curvature, a cloud too small); ``discarded`` is the fraction of points not used in the fit (the
trimmed ratios plus exact duplicates, whose ratio is undefined).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from geospec.errors import GeospecError

if TYPE_CHECKING:
    from geospec.engine.distributed import DistContext

#: Candidates per point whose distances are recomputed exactly (see :func:`two_nearest`).
CANDIDATES = 8
#: Rows of the distance matrix held at once.
ROWS = 1024


@dataclass(frozen=True)
class TwoNN:
    """A TwoNN estimate with its fit quality."""

    dimension: float
    r2: float
    discarded: float
    """Fraction of the points not used in the fit (trimmed ratios and exact duplicates)."""
    points: int
    duplicates: int


def two_nearest(points: Any) -> tuple[Any, Any]:
    """Distances of every point to its first and second nearest neighbour (float64 numpy arrays).

    Candidates come from the Gram matrix of the centred cloud (one matrix product); the distances
    to the closest few are then recomputed as norms of differences, so close pairs keep full
    relative precision even when the states are far from the origin.
    """
    import torch

    x = torch.as_tensor(points).to(torch.float64)
    if x.dim() != 2 or x.shape[0] < 3:
        raise GeospecError(f"TwoNN needs an n x d cloud with n >= 3 points, got {tuple(x.shape)}")
    x = x - x.mean(dim=0)
    squared = (x * x).sum(dim=1)
    k = min(CANDIDATES, x.shape[0] - 1)
    nearest = []
    for start in range(0, x.shape[0], ROWS):  # row blocks bound the memory to ROWS x n
        block = x[start : start + ROWS]
        gram = squared[start : start + ROWS, None] + squared[None, :] - 2.0 * (block @ x.T)
        rows = torch.arange(len(block))
        gram[rows, rows + start] = float("inf")  # a point is not its own neighbour
        candidates = gram.topk(k, dim=1, largest=False).indices
        exact = (block[:, None, :] - x[candidates]).norm(dim=2)
        nearest.append(exact.sort(dim=1).values[:, :2])
    both = torch.cat(nearest)
    return both[:, 0].numpy(), both[:, 1].numpy()


def two_nn(points: Any, discard: float = 0.1) -> TwoNN:
    """TwoNN intrinsic dimension of an n x d cloud (tensor or array); see the module docstring."""
    r1, r2 = two_nearest(points)
    return fit_two_nn(r1, r2, discard)


def layer_dimensions(
    clouds: Sequence[tuple[Any, Any]],
    discard: float,
    progress: Callable[[int], None] | None = None,
    dist: DistContext | None = None,
) -> list[TwoNN]:
    """Each layer's TwoNN dimension of the cloud entering its FFN (``x`` of each ``(x, y)``);
    with ``dist`` (under torchrun) every rank fits its share of the layers and gets them all.
    A cloud TwoNN cannot measure is named by its layer."""
    from geospec.engine.distributed import spread_over_ranks

    def fit(mine: list[int]) -> list[TwoNN]:
        found = []
        for layer in mine:
            try:
                found.append(two_nn(clouds[layer][0], discard))
            except GeospecError as error:
                raise GeospecError(f"layer {layer}: {error}") from None
            if progress is not None:
                progress(1)
        return found

    return spread_over_ranks(len(clouds), fit, dist)


def fit_two_nn(r1: Any, r2: Any, discard: float = 0.1) -> TwoNN:
    """The TwoNN line fit from each point's first and second nearest-neighbour distances."""
    import numpy as np

    if not 0.0 < discard < 1.0:
        raise GeospecError(f"TwoNN discard fraction must be in (0, 1), got {discard}")
    r1, r2 = np.asarray(r1, dtype=np.float64), np.asarray(r2, dtype=np.float64)
    total = len(r1)
    unique = r1 > 0
    mu = r2[unique] / r1[unique]
    n = len(mu)
    keep = int(n * (1 - discard))  # the same expression as scikit-dimension
    if keep < 2:
        raise GeospecError(
            f"TwoNN: only {keep} of {total} points left after dropping "
            f"{total - n} duplicates and the largest {discard:.0%} of ratios; probe more tokens"
        )
    log_mu = np.log(np.sort(mu)[:keep])
    if not log_mu.any():
        raise GeospecError(
            "TwoNN: every point's two nearest neighbours are equidistant (a lattice?); "
            "the dimension is undefined"
        )
    target = -np.log(1.0 - np.arange(1, keep + 1) / n)
    dimension = float(log_mu @ target / (log_mu @ log_mu))
    residual = target - dimension * log_mu
    spread = float(((target - target.mean()) ** 2).sum())
    r2_fit = 1.0 - float(residual @ residual) / spread if spread > 0 else float("nan")
    return TwoNN(dimension, r2_fit, (total - keep) / total, total, total - n)
