"""Widths from measured profiles: the geometry-derived schedule (geometric) with its controls
(anti: the inverted profile; permuted: its widths shuffled), and the schedule from measured
demand (calibrated); each hands a solver its problem with the exact budget."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Annotated, Literal

from pydantic import Field

from geospec.errors import UsageError
from geospec.kinds import (
    ModelDims,
    Schedule,
    Smoother,
    Solver,
    WidthProblem,
    check_profile,
    resample_profile,
)
from geospec.plugin import (
    PluginParams,
    SmootherRef,
    SolverRef,
    create_plugin,
)

ProfileName = Annotated[str, Field(min_length=1, max_length=200)]


class ProfileParams(PluginParams):
    profile: ProfileName
    """The measured work profile, named 'statistic/geometry' (for example 'topology/hyperbolic')."""
    smoother: SmootherRef = Field({"kind": "none"}, validate_default=True)
    """How the profile is smoothed before it is resampled and solved (a smoother table)."""
    solver: SolverRef = Field({"kind": "power_law"}, validate_default=True)
    """How work becomes widths with the exact budget (a solver table, with its bounds)."""
    sensitivity: ProfileName | None = None
    """A measured profile used as the per-layer loss sensitivity lambda_l (default: all 1)."""
    intrinsic_dimension: ProfileName | None = None
    """A measured profile of intrinsic dimensions d_l; the exponents become a_l = 2 / d_l."""
    profiles: Annotated[str, Field(min_length=1, max_length=4096)] | None = None
    """Read the profiles from this file (another run's profiles.json; a path relative to the
    current directory, like out) instead of this run's measurements. A profile of another depth
    is resampled to this model's: widths from a shallower reference's profiles."""


class Solved(Schedule):
    """A schedule that is a solver's problem built from measured profiles (this run's, or another
    run's file: ``params.profiles``): :meth:`problem` builds it, and the solver plugin
    (``params.solver``) solves it with the exact budget, checks the model and sets the bounds."""

    params: ProfileParams | Calibrated.Params

    def profiles_file(self) -> str | None:
        return self.params.profiles

    def check(self, dims: ModelDims) -> list[str]:
        return self.solver().check(dims)

    def solver(self) -> Solver:
        return create_plugin("solver", self.params.solver)

    def bounds(self, dims: ModelDims) -> tuple[int, int] | None:
        # The solver's bounds do not depend on the work: any profile gives the same ones.
        return self.solver().bounds(dims.width_problem([1.0] * dims.n_layers))

    def problem(self, dims: ModelDims, profiles: Mapping[str, Sequence[float]]) -> WidthProblem:
        """The solver's problem at ``dims`` from ``profiles``."""
        raise NotImplementedError

    def widths(self, dims: ModelDims, profiles: Mapping[str, Sequence[float]]) -> list[int]:
        return self.solver().solve(self.problem(dims, profiles))


class Geometric(Solved):
    """Widths from a measured work profile: smooth, resample to the target depth, solve.

    The profile is validated (non-empty, finite, non-negative, not all zero), smoothed at the
    reference model's depth, resampled to the target depth by linear interpolation over normalised
    depth (first layer to first, last to last), and handed to the solver with the exact budget.
    With ``profiles = FILE`` the profiles come from that file (another run's profiles.json, of any
    depth) instead of this run's measurements: widths transferred from another model's profiles.
    """

    class Params(ProfileParams):
        kind: Literal["geometric"] = "geometric"

    params: ProfileParams

    def required_profiles(self) -> list[str]:
        p = self.params
        names = [p.profile, p.sensitivity, p.intrinsic_dimension]
        return list(dict.fromkeys(name for name in names if name is not None))

    def smoother(self) -> Smoother:
        return create_plugin("smoother", self.params.smoother)

    def work(self, dims: ModelDims, profiles: Mapping[str, Sequence[float]]) -> list[float]:
        """The per-layer work the solver receives (validated, smoothed, resampled)."""
        name = self.params.profile
        raw = check_profile(name, _lookup(profiles, name))
        smoother = self.smoother()
        smoothed = smoother(raw)
        if len(smoothed) != len(raw):
            raise UsageError(
                f"smoother {smoother.kind_name()!r} returned {len(smoothed)} values for the "
                f"{len(raw)} of profile {name!r}"
            )
        label = f"{name} after {smoother.kind_name()} smoothing"
        return resample_profile(check_profile(label, smoothed), dims.n_layers)

    def problem(self, dims: ModelDims, profiles: Mapping[str, Sequence[float]]) -> WidthProblem:
        """The solver's problem: the work (:meth:`work`), with the exponents 2 / d_l from the
        intrinsic dimensions and the sensitivities where the params name them."""
        p = self.params
        exponents = sensitivities = None
        if p.intrinsic_dimension is not None:
            d_int = check_profile(
                p.intrinsic_dimension, _lookup(profiles, p.intrinsic_dimension), positive=True
            )
            exponents = [2.0 / d for d in resample_profile(d_int, dims.n_layers)]
        if p.sensitivity is not None:
            lam = check_profile(p.sensitivity, _lookup(profiles, p.sensitivity))
            sensitivities = resample_profile(lam, dims.n_layers)
        return dims.width_problem(self.work(dims, profiles), exponents, sensitivities)


class Anti(Geometric):
    """The paper's control: the same pipeline and solver on the inverted profile.

    Inverted means reflected about its mid-range, W'_l = max(W) + min(W) - W_l, applied to the
    smoothed, resampled profile: the layer with the most work gets the least, the range of work is
    unchanged, and a profile that is linear in depth becomes its mirror image (so the widths come
    out in reverse layer order). A constant profile stays constant (uniform widths).
    """

    class Params(ProfileParams):
        kind: Literal["anti"] = "anti"

    def work(self, dims: ModelDims, profiles: Mapping[str, Sequence[float]]) -> list[float]:
        work = super().work(dims, profiles)
        top, bottom = max(work), min(work)
        return [top + bottom - w for w in work]


class Permuted(Geometric):
    """The cleaner control: the geometric schedule's widths in a seeded random layer order.

    Same widths (the same multiset), shuffled by ``random.Random(seed)``; for two or more layers
    the identity order is redrawn, so the control always moves something.
    """

    class Params(ProfileParams):
        kind: Literal["permuted"] = "permuted"
        seed: int = Field(0, ge=0)
        """Seed of the permutation."""

    params: Params

    def permutation(self, n_layers: int) -> list[int]:
        order = list(range(n_layers))
        rng = random.Random(self.params.seed)
        while True:
            rng.shuffle(order)
            if n_layers < 2 or order != sorted(order):
                return order

    def widths(self, dims: ModelDims, profiles: Mapping[str, Sequence[float]]) -> list[int]:
        geometric = super().widths(dims, profiles)
        return [geometric[i] for i in self.permutation(dims.n_layers)]


class Calibrated(Solved):
    """Widths from measured demand: minimise the sum of the layers' fitted errors at the budget.

    The demand stage cuts each layer's FFN of the reference model alone to several keep fractions
    f = w / W and fits d_l(f) = lambda_l (f^(-a_l) - 1) to the loss increases; the profiles
    ``sensitivity`` (lambda_l, default ``demand/lambda``) and ``exponent`` (a_l, default
    ``demand/exponent``) hold the fits. This schedule minimises sum_l lambda_l (w_l / W)^(-a_l),
    the sum of the fitted increases with their constants (-lambda_l) dropped, subject to the
    exact budget and the solver's bounds: the width allocation the measurements themselves ask
    for, with no geometric proxy in between.

    It is the ``power_law`` solver's problem with work = lambda and per-layer exponents = a. That
    solver measures widths in units of the uniform width u (it minimises sum lambda_l
    (w_l / u)^(-a_l)), and u is W when the target has the reference's own FFN width, so the
    objective is then exactly the fitted one. For a target of another width the reference's W
    has no counterpart; the fitted curves are then read with f = w / u, each layer's error
    relative to its share of the budget, which keeps the answer independent of the model's size
    (as the solver does for every schedule). A different solver gets the same problem
    (``proportional`` ignores the exponents: widths by lambda alone).

    lambda must be non-negative and not all zero (a layer whose cuts lower the loss has lambda 0
    and gets the lower bound), a positive; both are resampled to the target depth like a work
    profile (linear over normalised depth), not smoothed.
    """

    class Params(PluginParams):
        kind: Literal["calibrated"] = "calibrated"
        sensitivity: ProfileName = "demand/lambda"
        """The profile of fitted loss scales lambda_l (non-negative)."""
        exponent: ProfileName = "demand/exponent"
        """The profile of fitted exponents a_l (positive)."""
        solver: SolverRef = Field({"kind": "power_law"}, validate_default=True)
        """How lambda and a become widths with the exact budget (a solver table, with its
        bounds); ``power_law`` minimises the fitted errors."""
        profiles: Annotated[str, Field(min_length=1, max_length=4096)] | None = None
        """Read the profiles from this file (another run's profiles.json) instead of this run's
        measurements; a profile of another depth is resampled to this model's."""

    params: Params

    def required_profiles(self) -> list[str]:
        return list(dict.fromkeys([self.params.sensitivity, self.params.exponent]))

    def problem(self, dims: ModelDims, profiles: Mapping[str, Sequence[float]]) -> WidthProblem:
        """The solver's problem: lambda as the work, a as the per-layer exponents, both checked
        and resampled to the target depth."""
        p = self.params
        lam = check_profile(p.sensitivity, _lookup(profiles, p.sensitivity))
        exponents = check_profile(p.exponent, _lookup(profiles, p.exponent), positive=True)
        if len(lam) != len(exponents):
            # Both come from one fit per layer of one reference: different lengths mean profiles
            # of different models were mixed.
            raise UsageError(
                f"profile {p.sensitivity!r} has {len(lam)} values but {p.exponent!r} has "
                f"{len(exponents)}; both must come from the same reference model"
            )
        n = dims.n_layers
        # Resampling can land only on zeros of lambda (a 3-layer [1, 0, 0] read at mid-depth):
        # say so about the profile rather than let the solver fail on its work.
        work = check_profile(f"{p.sensitivity} resampled to {n} layers", resample_profile(lam, n))
        return dims.width_problem(work, resample_profile(exponents, n))


def _lookup(profiles: Mapping[str, Sequence[float]], name: str) -> Sequence[float]:
    if name not in profiles:
        available = ", ".join(repr(p) for p in profiles) or "none"
        raise UsageError(f"profile {name!r} is not available (available: {available})")
    return profiles[name]
