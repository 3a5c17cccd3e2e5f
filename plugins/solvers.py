"""Width solvers: the power-law surrogate of PAPER.md and a proportional rule.

Both take their width bounds as ratios of the uniform width (``min_ratio``/``max_ratio``, solver
params, so the same schedule can be re-run with looser or tighter bounds by changing one table).
The bounds are intersected with the problem's hard limits and rounded inward to the rounding
multiple; the continuous solution is then rounded with :func:`geospec.kinds.round_to_budget`,
so the widths sum exactly to the budget, stay inside the bounds and are multiples.

Everything here is plain Python: a profile has at most a few hundred layers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

from pydantic import Field

from geospec import hookimpl
from geospec.kinds import (
    InfeasibleBudget,
    ModelDims,
    Solver,
    WidthProblem,
    round_to_budget,
    units_between,
)
from geospec.plugin import PluginParams, Register


class BoundedParams(PluginParams):
    """Width bounds shared by the builtin solvers, as ratios of the uniform width."""

    min_ratio: float = Field(0.25, gt=0.0, le=1.0)
    """Smallest width a layer may get, as a multiple of the uniform width."""
    max_ratio: float = Field(2.0, ge=1.0, le=1000.0)
    """Largest width a layer may get, as a multiple of the uniform width."""


class BoundedSolver(Solver):
    """A solver that finds continuous widths within ratio bounds, then rounds them exactly."""

    params: BoundedParams

    def bounds(self, problem: WidthProblem) -> tuple[int, int]:
        """The width bounds in effect: the ratio bounds inside the hard limits, as multiples.

        Raises :class:`InfeasibleBudget` stating the feasible ratio range when no widths within
        the bounds, in multiples of ``problem.multiple``, can sum to the budget.
        """
        n, m, budget = problem.n_layers, problem.multiple, problem.budget
        if n == 0:
            raise ValueError("the work profile is empty")
        if budget % m:
            raise InfeasibleBudget(f"budget {budget} is not a multiple of {m}")
        target = budget // m
        hard_lo, hard_hi = units_between(problem.lower, problem.upper, m)
        if hard_lo > hard_hi or n * hard_lo > target or n * hard_hi < target:
            raise InfeasibleBudget(
                f"{n} widths within the hard limits [{problem.lower}, {problem.upper}] in "
                f"multiples of {m} cannot sum to the budget {budget}"
            )
        u = problem.uniform_width
        p = self.params
        lo, hi = units_between(
            max(problem.lower, p.min_ratio * u), min(problem.upper, p.max_ratio * u), m
        )
        if lo > hi or n * lo > target or n * hi < target:
            # A layer must be able to take floor(target / n) and ceil(target / n) multiples.
            most_min = math.floor(target / n) * m / u
            least_max = math.ceil(target / n) * m / u
            raise InfeasibleBudget(
                f"min_ratio {p.min_ratio:g} and max_ratio {p.max_ratio:g} of the uniform width "
                f"{u:g} allow widths {lo * m}..{hi * m} in multiples of {m}, which cannot sum to "
                f"the budget {budget} over {n} layers; the feasible range is min_ratio <= "
                f"{most_min:.6g} and max_ratio >= {least_max:.6g}"
            )
        return lo * m, hi * m

    def continuous(self, problem: WidthProblem) -> list[float]:
        """The real-valued widths before rounding (inside :meth:`bounds`, summing to the budget)."""
        lo, hi = self.bounds(problem)
        return self.allocate(problem, lo, hi)

    def allocate(self, problem: WidthProblem, lower: int, upper: int) -> list[float]:
        raise NotImplementedError

    def solve(self, problem: WidthProblem) -> list[int]:
        lo, hi = self.bounds(problem)
        values = self.allocate(problem, lo, hi)
        # Ties in the remainders go to the layer with more work, so more work never gets less width
        # even when floating point makes two different work values give equal continuous widths.
        return round_to_budget(
            values, problem.budget, problem.multiple, lo, hi, priority=_costs(problem)
        )

    def check(self, dims: ModelDims) -> list[str]:
        try:
            self.bounds(dims.width_problem([1.0] * dims.n_layers))
        except InfeasibleBudget as error:
            return [f"solver {self.kind_name()}: {error}"]
        return []


class PowerLaw(BoundedSolver):
    """The surrogate of PAPER.md: minimise sum_l lambda_l W_l (w_l / u)^(-a_l) subject to
    sum_l w_l = budget and lower <= w_l <= upper, with u the uniform width.

    Widths are measured in units of the uniform width, so W_l reads as the layer's error at the
    uniform width; with a shared exponent the unit does not change the solution, with per-layer
    exponents it does, and this choice makes the answer independent of the model's size.

    KKT: w_l = clip((a_l lambda_l W_l / mu)^(1 / (a_l + 1)), lower, upper). With a shared
    exponent the unclipped solution is the closed form w_l proportional to (lambda_l W_l)^(1/(a+1));
    when a bound binds, the exact water level is found among the breakpoints of the piecewise-linear
    budget function. With per-layer exponents, mu is found by bisection to machine precision.
    Layers with zero work have a flat objective: they get the lower bound, plus an equal share of
    whatever the other layers cannot take once they all sit at the upper bound.
    """

    class Params(BoundedParams):
        kind: Literal["power_law"] = "power_law"
        a: float = Field(1.0, gt=0.0, le=100.0)
        """Shared exponent a (error falls as w^-a); per-layer exponents of the problem win."""

    params: Params

    def allocate(self, problem: WidthProblem, lower: int, upper: int) -> list[float]:
        n = problem.n_layers
        costs = _costs(problem)
        exponents = _per_layer(problem.exponents, n, "exponents", positive=True)
        if exponents is None or len(set(exponents)) == 1:
            a = exponents[0] if exponents is not None else self.params.a
            weights = [c ** (1.0 / (a + 1.0)) for c in costs]
            return water_fill(weights, problem.budget, lower, upper)
        # Widths in units of the uniform width: with per-layer exponents the unit matters, and this
        # one makes W_l the layer's error at the uniform width, whatever the model's size.
        u = problem.uniform_width
        scaled = _bisect_power_law(costs, exponents, problem.n_layers, lower / u, upper / u)
        return [x * u for x in scaled]


class Proportional(BoundedSolver):
    """Widths proportional to (lambda_l W_l)^beta, clipped into the bounds (water-filling).

    Per-layer exponents in the problem are ignored; sensitivities multiply the work. beta = 0
    gives the uniform schedule, beta = 1 widths proportional to work.
    """

    class Params(BoundedParams):
        kind: Literal["proportional"] = "proportional"
        beta: float = Field(1.0, ge=0.0, le=100.0)
        """Exponent applied to the work."""

    params: Params

    def allocate(self, problem: WidthProblem, lower: int, upper: int) -> list[float]:
        weights = [c**self.params.beta for c in _costs(problem)]
        return water_fill(weights, problem.budget, lower, upper)


def _per_layer(
    values: Sequence[float] | None, n: int, what: str, positive: bool
) -> list[float] | None:
    if values is None:
        return None
    if len(values) != n:
        raise ValueError(f"{len(values)} {what} for {n} layers")
    for v in values:
        if not math.isfinite(v) or v < 0 or (positive and v == 0):
            sign = "positive" if positive else "non-negative"
            raise ValueError(f"{what} must be finite and {sign}, got {list(values)}")
    return [float(v) for v in values]


def _costs(problem: WidthProblem) -> list[float]:
    """lambda_l * W_l for every layer, checked: finite, non-negative, not all zero."""
    n = problem.n_layers
    work = _per_layer(problem.work, n, "work values", positive=False)
    assert work is not None
    sensitivities = _per_layer(problem.sensitivities, n, "sensitivities", positive=False)
    costs = (
        work if sensitivities is None else [w * s for w, s in zip(work, sensitivities, strict=True)]
    )
    if not any(c > 0 for c in costs):
        raise ValueError("every layer has zero work (times sensitivity): nothing to allocate by")
    return costs


def water_fill(weights: Sequence[float], budget: float, lower: float, upper: float) -> list[float]:
    """Solve sum_l clip(k_l * t, lower, upper) = budget for t and return the clipped widths.

    Exact: the sum is piecewise linear and non-decreasing in t with breakpoints lower / k_l and
    upper / k_l, so the level lies in one linear piece found by binary search. Zero weights sit at
    ``lower`` unless every positive-weight layer reaches ``upper``; then they share the rest
    equally.
    """
    n = len(weights)
    positive = [i for i in range(n) if weights[i] > 0]
    zero = [i for i in range(n) if weights[i] <= 0]
    widths = [float(lower)] * n
    if len(positive) * upper + len(zero) * lower <= budget:
        for i in positive:
            widths[i] = float(upper)
        if zero:
            share = (budget - len(positive) * upper) / len(zero)
            for i in zero:
                widths[i] = share
        return widths
    remaining = budget - len(zero) * lower
    k = [weights[i] for i in positive]
    closed = [w * remaining / sum(k) for w in k]
    if all(lower <= w <= upper for w in closed):  # no bound binds: the closed form
        levels = closed
    else:
        levels = _clipped_level(k, remaining, lower, upper)
    for i, w in zip(positive, levels, strict=True):
        widths[i] = w
    return widths


def _clipped_level(k: list[float], budget: float, lower: float, upper: float) -> list[float]:
    def total(t: float) -> float:
        return sum(min(max(w * t, lower), upper) for w in k)

    breakpoints = sorted({lower / w for w in k} | {upper / w for w in k})
    # The last breakpoint at or below the level: total() is non-decreasing in t.
    lo_index, hi_index = 0, len(breakpoints) - 1
    if total(breakpoints[0]) >= budget:
        hi_index = 0
    while lo_index < hi_index:
        mid = (lo_index + hi_index + 1) // 2
        if total(breakpoints[mid]) <= budget:
            lo_index = mid
        else:
            hi_index = mid - 1
    start = breakpoints[lo_index]
    # On the piece after ``start`` every layer is either clipped or free (linear in t).
    end = breakpoints[lo_index + 1] if lo_index + 1 < len(breakpoints) else 2 * start + 1.0
    probe = (start + end) / 2
    fixed = 0.0
    slope = 0.0
    for w in k:
        if w * probe <= lower:
            fixed += lower
        elif w * probe >= upper:
            fixed += upper
        else:
            slope += w
    t = start if slope == 0 else (budget - fixed) / slope
    return [min(max(w * t, lower), upper) for w in k]


def _bisect_power_law(
    costs: list[float], exponents: list[float], budget: float, lower: float, upper: float
) -> list[float]:
    """Per-layer exponents: find log(mu) by bisection so the clipped KKT widths meet the budget."""
    n = len(costs)
    positive = [i for i in range(n) if costs[i] > 0]
    zero = [i for i in range(n) if costs[i] <= 0]
    if len(positive) * upper + len(zero) * lower <= budget:
        return water_fill(costs, budget, lower, upper)  # saturated: the same split as water_fill
    remaining = budget - len(zero) * lower
    # Summed logs: the product of a tiny cost and an exponent below 1 may underflow to 0.
    logs = {i: math.log(exponents[i]) + math.log(costs[i]) for i in positive}

    def widths_at(s: float) -> dict[int, float]:
        out = {}
        for i in positive:
            w = math.exp(min((logs[i] - s) / (exponents[i] + 1.0), 700.0))
            out[i] = min(max(w, lower), upper)
        return out

    # At s_low every layer is at upper (sum too large), at s_high every layer is at lower.
    s_low = min(logs[i] - (exponents[i] + 1.0) * math.log(upper) for i in positive)
    s_high = max(logs[i] - (exponents[i] + 1.0) * math.log(lower) for i in positive)
    for _ in range(200):
        mid = (s_low + s_high) / 2
        if mid in (s_low, s_high):
            break
        if sum(widths_at(mid).values()) > remaining:
            s_low = mid
        else:
            s_high = mid
    chosen = widths_at((s_low + s_high) / 2)
    result = [float(lower)] * n
    for i, w in chosen.items():
        result[i] = w
    return result


@hookimpl
def geospec_register_solvers(register: Register) -> None:
    register(PowerLaw)
    register(Proportional)
