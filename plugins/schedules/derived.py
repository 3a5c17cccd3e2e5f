"""The controls derived from another arm's widths: the same widths sorted (sorted), and the
best smooth monotone taper imitating them (fitted)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Annotated, Literal

from pydantic import Field

from geospec.kinds import (
    ModelDims,
    Schedule,
    round_to_budget,
    units_between,
)
from geospec.plugin import (
    PluginParams,
)

ArmName = Annotated[str, Field(min_length=1, max_length=100)]


class Sorted(Schedule):
    """Another arm's widths in decreasing order: the same widths (the same multiset), monotone.

    It separates a profile's non-monotone structure (a dip in the middle, a rise at the last
    layers) from how much it front-loads; for an arm that is already monotone it is that arm
    (``geospec validate`` and ``geospec widths`` say so).
    """

    class Params(PluginParams):
        kind: Literal["sorted"] = "sorted"
        of: ArmName
        """The arm whose widths are sorted (its name)."""

    params: Params

    def required_arms(self) -> list[str]:
        return [self.params.of]

    def widths_from(
        self,
        dims: ModelDims,
        profiles: Mapping[str, Sequence[float]],
        arms: Mapping[str, Sequence[int]],
    ) -> list[int]:
        return sorted(arms[self.params.of], reverse=True)

    def bounds_from(
        self, dims: ModelDims, arms: Mapping[str, tuple[int, int] | None]
    ) -> tuple[int, int] | None:
        return arms[self.params.of]  # the same widths: a layer at a bound of the source stays so


#: The largest |theta| a fitted family is searched over (beyond it the widths no longer change
#: within floating point, and every bound below the whole budget is crossed long before).
THETA_MAX = 64.0


#: Points of the grid that brackets the best theta before golden-section refinement.
GRID = 1024


class Fitted(Schedule):
    """The best plain taper imitating another arm: the member of a smooth monotone family closest
    to that arm's widths in least squares, at the exact budget and within the bounds.

    Each family has one free parameter theta once its mean is held at the uniform width u (so the
    continuous widths sum exactly to the budget); t_l = l / (L - 1):

    - cosine: w_l = u (1 + theta (c_l - mean(c))), c_l = (1 + cos(pi t_l)) / 2 (theta = 1 is the
      cosine taper 1.5 -> 0.5);
    - linear: w_l = u (1 + theta (1/2 - t_l));
    - exponential: w_l proportional to exp(-theta t_l);
    - power: w_l proportional to (l + 1)^(-theta).

    theta = 0 is uniform and theta > 0 front-loads. theta minimises sum_l (w_l - s_l)^2 over the
    source widths s_l, subject to every w_l lying within [min_ratio u, max_ratio u] (and the hard
    limits: one multiple, the whole budget); the feasible thetas form an interval around 0. The
    widths are then rounded to the model's multiple with the sum kept exactly on budget.
    """

    class Params(PluginParams):
        kind: Literal["fitted"] = "fitted"
        of: ArmName
        """The arm whose widths are imitated (its name)."""
        family: Literal["cosine", "linear", "exponential", "power"] = "cosine"
        """The smooth monotone family fitted to the arm's widths."""
        min_ratio: float = Field(0.25, gt=0, le=1)
        """Smallest width as a multiple of the uniform width."""
        max_ratio: float = Field(2.0, ge=1, le=1000)
        """Largest width as a multiple of the uniform width."""

    params: Params

    def required_arms(self) -> list[str]:
        return [self.params.of]

    def interval(self, dims: ModelDims) -> tuple[float, float]:
        """The interval the fitted continuous widths lie in: the ratios of the uniform width,
        within one multiple and the whole budget."""
        p = self.params
        lower = max(p.min_ratio * dims.uniform_width, dims.multiple_of)
        return lower, min(p.max_ratio * dims.uniform_width, dims.budget)

    def bounds(self, dims: ModelDims) -> tuple[int, int]:
        """The interval rounded inward to multiples: the bounds every rounded width lies in."""
        m = dims.multiple_of
        low, high = units_between(*self.interval(dims), m)
        return low * m, high * m

    def family(self, n_layers: int, uniform_width: float) -> Callable[[float], list[float]]:
        """theta -> the family's continuous widths (mean exactly ``uniform_width``)."""
        u, n = uniform_width, n_layers
        depth = [layer / (n - 1) if n > 1 else 0.5 for layer in range(n)]
        kind = self.params.family
        if kind in ("cosine", "linear"):
            if kind == "cosine":
                shape = [(1 + math.cos(math.pi * t)) / 2 for t in depth]
            else:
                shape = [1 - t for t in depth]
            mean = sum(shape) / n
            centred = [c - mean for c in shape]
            return lambda theta: [u * (1 + theta * c) for c in centred]
        if kind == "exponential":
            logs = [-t for t in depth]
        else:
            logs = [-math.log(layer + 1) for layer in range(n)]

        def proportional(theta: float) -> list[float]:
            top = max(theta * g for g in logs)  # factor out the largest term: no overflow
            weights = [math.exp(theta * g - top) for g in logs]
            total = sum(weights)
            return [n * u * w / total for w in weights]

        return proportional

    def fit(self, dims: ModelDims, source: Sequence[int]) -> tuple[float, list[float]]:
        """The best theta and its continuous widths for the ``source`` widths."""
        widths_at = self.family(dims.n_layers, dims.uniform_width)
        lower, upper = self.interval(dims)
        slack = 1e-12 * dims.budget  # floating-point noise, not a loosening of the bounds

        def feasible(theta: float) -> bool:
            return all(lower - slack <= w <= upper + slack for w in widths_at(theta))

        def edge(sign: float) -> float:
            """The feasible interval's end on one side of 0 (the interval holds 0: uniform)."""
            if feasible(sign * THETA_MAX):
                return sign * THETA_MAX
            inside, outside = 0.0, sign * THETA_MAX
            for _ in range(200):
                middle = (inside + outside) / 2
                if middle in (inside, outside):
                    break
                inside, outside = (middle, outside) if feasible(middle) else (inside, middle)
            return inside

        def loss(theta: float) -> float:
            return sum((w - s) ** 2 for w, s in zip(widths_at(theta), source, strict=True))

        low, high = edge(-1.0), edge(1.0)
        grid = [low + (high - low) * k / GRID for k in range(GRID + 1)]
        best = min(range(GRID + 1), key=lambda k: loss(grid[k]))
        theta = _golden_minimum(loss, grid[max(best - 1, 0)], grid[min(best + 1, GRID)])
        return theta, widths_at(theta)

    def widths_from(
        self,
        dims: ModelDims,
        profiles: Mapping[str, Sequence[float]],
        arms: Mapping[str, Sequence[int]],
    ) -> list[int]:
        _, continuous = self.fit(dims, arms[self.params.of])
        low, high = self.bounds(dims)
        return round_to_budget(
            continuous, dims.budget, dims.multiple_of, lower=low, upper=high, priority=continuous
        )


def _golden_minimum(f: Callable[[float], float], low: float, high: float) -> float:
    """The minimum of ``f`` on [low, high] by golden-section search (``f`` unimodal there)."""
    ratio = (math.sqrt(5) - 1) / 2
    a, b = low, high
    c, d = b - ratio * (b - a), a + ratio * (b - a)
    fc, fd = f(c), f(d)
    for _ in range(200):
        if b - a <= 1e-12 * max(1.0, abs(a), abs(b)):
            break
        if fc <= fd:
            b, d, fd = d, c, fc
            c = b - ratio * (b - a)
            fc = f(c)
        else:
            a, c, fc = c, d, fd
            d = a + ratio * (b - a)
            fd = f(d)
    candidates = [low, high, (a + b) / 2]
    return min(candidates, key=f)
