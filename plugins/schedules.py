"""Width schedules: uniform, the TLM tapers (cosine, linear, sigmoid), the geometry-derived
schedule with its controls (anti, permuted), the schedule from measured demand (calibrated), an
explicit list (manual), the controls derived from another arm's widths (fitted, sorted), the
pruning control that keeps the first and last layers whole (protect), and the pruning
allocations from the calibration of the model being pruned (flap, owl, owl_neuron, and the
searches on the calibration text, greedy and evolve).

Every schedule returns integer widths, multiples of ``dims.multiple_of``, summing exactly to
``dims.budget`` (so every arm has the uniform model's FFN parameter count). Schedules that hold a
smoother or a solver create it through the registries, so third-party ones work the same way.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Callable, Mapping, Sequence
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from geospec import hookimpl
from geospec.errors import PluginError, SpecError, UsageError
from geospec.kinds import (
    BlockLinears,
    CutLosses,
    ModelDims,
    Schedule,
    ScoreAllocation,
    Search,
    Smoother,
    Solver,
    WidthProblem,
    check_profile,
    reads_scores,
    resample_profile,
    round_to_budget,
    units_between,
)
from geospec.plugin import (
    ADDED_LATER,
    PluginParams,
    Register,
    ScheduleRef,
    SmootherRef,
    SolverRef,
    create_plugin,
)


class Uniform(Schedule):
    """Every layer gets the uniform width."""

    class Params(PluginParams):
        kind: Literal["uniform"] = "uniform"

    def widths(self, dims: ModelDims, profiles: Mapping[str, Sequence[float]]) -> list[int]:
        if dims.total_width is None and dims.ffn_width % dims.multiple_of == 0:
            return [dims.ffn_width] * dims.n_layers
        # a part of a model (protect's middle): its share need not be a whole multiple per layer
        share = [dims.uniform_width] * dims.n_layers
        return round_to_budget(share, dims.budget, dims.multiple_of, upper=dims.max_width)


class TaperParams(PluginParams):
    start: float = Field(1.5, gt=0, le=100)
    """Width of the first layer as a multiple of the uniform width."""
    end: float = Field(0.5, gt=0, le=100)
    """Width of the last layer as a multiple of the uniform width."""


class Taper(Schedule):
    """A fixed taper from ``start`` to ``end`` times the uniform width (Tapered Language Models).

    w_l = w_end + (w_start - w_end) * shape(l / (L - 1)) for l = 0..L-1, where ``shape`` falls
    from 1 at the first layer to 0 at the last. The profile is rescaled so its mean is the uniform
    width (a no-op when the shape is symmetric and start + end = 2), then rounded to the model's
    multiple with the sum kept exactly on budget.
    """

    params: TaperParams

    def shape(self, depth: float) -> float:
        raise NotImplementedError

    def continuous(self, n_layers: int, uniform_width: float) -> list[float]:
        """The taper before rounding (rescaled so the mean is the uniform width)."""
        p = self.params
        if n_layers == 1:
            return [uniform_width]
        w_start, w_end = p.start * uniform_width, p.end * uniform_width
        raw = [
            w_end + (w_start - w_end) * self.shape(layer / (n_layers - 1))
            for layer in range(n_layers)
        ]
        scale = n_layers * uniform_width / sum(raw)
        return [w * scale for w in raw]

    def widths(self, dims: ModelDims, profiles: Mapping[str, Sequence[float]]) -> list[int]:
        values = self.continuous(dims.n_layers, dims.uniform_width)
        return round_to_budget(values, dims.budget, dims.multiple_of)


class Cosine(Taper):
    """The cosine taper of Tapered Language Models (Bayat et al. 2026).

    w_l = w_end + (w_start - w_end) * (1 + cos(pi * l / (L - 1))) / 2 for l = 0..L-1, with
    w_start = start * w_uniform and w_end = end * w_uniform. When start + end = 2 the mean is
    exactly w_uniform before rounding; otherwise the profile is rescaled to the budget. Widths are
    then rounded to the model's multiple with the sum kept exactly on budget.
    """

    class Params(TaperParams):
        kind: Literal["cosine"] = "cosine"

    def shape(self, depth: float) -> float:
        return (1 + math.cos(math.pi * depth)) / 2


class Linear(Taper):
    """A linear taper: w_l = w_start + (w_end - w_start) * l / (L - 1), rescaled to the budget."""

    class Params(TaperParams):
        kind: Literal["linear"] = "linear"

    def shape(self, depth: float) -> float:
        return 1.0 - depth


class Sigmoid(Taper):
    """A sigmoid taper centred at mid-depth: a plateau near ``start``, a drop, a plateau near
    ``end``. shape(t) = (s(k (1/2 - t)) - s(-k/2)) / (s(k/2) - s(-k/2)) with s the logistic
    function and k the steepness, so it runs exactly from 1 to 0; rescaled to the budget."""

    class Params(TaperParams):
        kind: Literal["sigmoid"] = "sigmoid"
        steepness: float = Field(10.0, gt=0, le=1000)
        """How sharp the drop is: about 4 is nearly linear, 30 nearly a step."""

    params: Params

    def shape(self, depth: float) -> float:
        k = self.params.steepness
        top, bottom = _logistic(k / 2), _logistic(-k / 2)
        return (_logistic(k * (0.5 - depth)) - bottom) / (top - bottom)


def _logistic(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


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


class Geometric(Schedule):
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

    def profiles_file(self) -> str | None:
        return self.params.profiles

    def check(self, dims: ModelDims) -> list[str]:
        return self.solver().check(dims)

    def smoother(self) -> Smoother:
        return create_plugin("smoother", self.params.smoother)

    def solver(self) -> Solver:
        return create_plugin("solver", self.params.solver)

    def bounds(self, dims: ModelDims) -> tuple[int, int] | None:
        # The solver's bounds do not depend on the work: any profile gives the same ones.
        return self.solver().bounds(dims.width_problem([1.0] * dims.n_layers))

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

    def widths(self, dims: ModelDims, profiles: Mapping[str, Sequence[float]]) -> list[int]:
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
        problem = dims.width_problem(self.work(dims, profiles), exponents, sensitivities)
        return self.solver().solve(problem)


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


class Calibrated(Schedule):
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

    def profiles_file(self) -> str | None:
        return self.params.profiles

    def check(self, dims: ModelDims) -> list[str]:
        return self.solver().check(dims)

    def solver(self) -> Solver:
        return create_plugin("solver", self.params.solver)

    def bounds(self, dims: ModelDims) -> tuple[int, int] | None:
        # The solver's bounds do not depend on the profiles: any gives the same ones.
        return self.solver().bounds(dims.width_problem([1.0] * dims.n_layers))

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

    def widths(self, dims: ModelDims, profiles: Mapping[str, Sequence[float]]) -> list[int]:
        return self.solver().solve(self.problem(dims, profiles))


class Manual(Schedule):
    """An explicit list of widths, one per layer (multiples of the model's multiple, on budget)."""

    class Params(PluginParams):
        kind: Literal["manual"] = "manual"
        widths: list[Annotated[int, Field(ge=1)]] = Field(min_length=1, max_length=4096)
        """The FFN width of every layer, first to last."""

    params: Params

    def check(self, dims: ModelDims) -> list[str]:
        widths = self.params.widths
        problems = []
        if len(widths) != dims.n_layers:
            problems.append(
                f"widths has {len(widths)} entries; the model has {dims.n_layers} layers"
            )
        total = sum(widths)
        if total != dims.budget:
            fix = "remove" if total > dims.budget else "add"
            shares = (
                f" (n_layers x ffn_width = {dims.n_layers} x {dims.ffn_width})"
                if dims.total_width is None
                else ""
            )
            problems.append(
                f"widths sum to {total}, but the budget is {dims.budget}{shares}; "
                f"{fix} {abs(total - dims.budget)}"
            )
        odd = [f"layer {i}: {w}" for i, w in enumerate(widths) if w % dims.multiple_of]
        if odd:
            problems.append(
                f"widths must be multiples of model.multiple_of {dims.multiple_of}; not: "
                + ", ".join(odd)
            )
        return problems

    def widths(self, dims: ModelDims, profiles: Mapping[str, Sequence[float]]) -> list[int]:
        problems = self.check(dims)
        if problems:
            raise SpecError("manual schedule", problems)
        return list(self.params.widths)


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


class Protect(Schedule):
    """The first ``first`` and the last ``last`` layers at full width, the others sharing what
    is left of the budget: uniformly (in multiples, the sum exact), or as the schedule
    ``around`` allocates them.

    Full width is ``width`` when set, else the pretrained width (``dims.max_width``, rounded
    down to a multiple) under ``geospec prune``; a training arm has no pretrained width, so there
    ``width`` is required (``geospec validate`` says so). This is LLM-Pruner's recipe (the first
    and last layers left alone, the rest pruned uniformly), the control a pruning allocation
    must beat: most of what front-loading gains may be "keep layer 0 whole".

    With ``around``, the unprotected layers are solved as a model of their own: the inner
    schedule gets a :class:`~geospec.kinds.ModelDims` of those layers only whose budget is the
    remainder exactly (``dims.part``), and the profiles it reads resampled to the model's depth
    and cut to those layers (smoothed there, as a model of those layers alone would be). Its
    profiles, profiles file, bounds and checks are protect's; a schedule that reads other arms'
    widths or neuron scores cannot run inside it (those describe the whole model).
    """

    class Params(PluginParams):
        kind: Literal["protect"] = "protect"
        first: int = Field(1, ge=0, le=4096)
        """How many of the first layers keep full width."""
        last: int = Field(0, ge=0, le=4096)
        """How many of the last layers keep full width."""
        width: int | None = Field(None, ge=1)
        """The protected layers' width in neurons (default: the pretrained width, under
        geospec prune; required in a training arm, which has none)."""
        around: ScheduleRef | None = None
        """The schedule of the unprotected layers (a schedule table; default: uniform)."""

    params: Params

    def inner(self) -> Schedule:
        """The schedule of the unprotected layers."""
        if self.params.around is None:
            return Uniform()
        schedule: Schedule = create_plugin("schedule", self.params.around)
        return schedule

    def required_profiles(self) -> list[str]:
        return self.inner().required_profiles()

    def profiles_file(self) -> str | None:
        return self.inner().profiles_file()

    def full_width(self, dims: ModelDims) -> int | None:
        """The protected layers' width, or None where there is none (training, no ``width``)."""
        if self.params.width is not None:
            return self.params.width
        if dims.max_width is None:
            return None
        return dims.max_width // dims.multiple_of * dims.multiple_of

    def middle(self, dims: ModelDims) -> ModelDims:
        """The unprotected layers as a model of their own, with the budget the others leave."""
        protected = self.params.first + self.params.last
        full = self.full_width(dims) if protected else 0  # protecting none needs no width
        assert full is not None and protected < dims.n_layers  # check(dims) says otherwise
        return dims.part(dims.n_layers - protected, dims.budget - protected * full)

    def own_problems(self, dims: ModelDims) -> list[str]:
        """What keeps the protected layers from fitting this model (the inner schedule's own
        problems come from :meth:`check`)."""
        p, n, m = self.params, dims.n_layers, dims.multiple_of
        protected = p.first + p.last
        if protected >= n:
            many = "all" if protected == n else "more than"
            return [
                f"first + last = {p.first} + {p.last} protects {many} the model's {n} layers; "
                "leave at least one layer to allocate (lower first or last)"
            ]
        if protected == 0:
            return []  # every layer is the inner schedule's
        full = self.full_width(dims)
        if full is None:
            return [
                "width is not set, and a training arm has no pretrained width to protect: set "
                "width (the protected layers' width in neurons), or list the arm under "
                "[prune] arms"
            ]
        if full % m or full < m:
            return [
                f"width {full} is not a positive multiple of model.multiple_of {m}; use "
                f"{max(m, round(full / m) * m)}"
            ]
        if dims.max_width is not None and full > dims.max_width:
            return [
                f"width {full} exceeds the pretrained width {dims.max_width}, and pruning never "
                "grows a layer; lower width or leave it unset"
            ]
        rest, middle = dims.budget - protected * full, n - protected
        layers = "layer" if protected == 1 else f"{protected} layers"
        takes = "takes" if protected == 1 else "take"
        taken = (
            f"the protected {layers} at width {full} {takes} {protected * full} of the budget "
            f"{dims.budget}"
        )
        if rest < middle * m:
            fix = "lower width" if p.width is not None else "keep more"
            return [
                f"{taken}; the other {middle} need at least one multiple ({m}) each, "
                f"{middle * m} in all; {fix} or protect fewer layers"
            ]
        if dims.max_width is not None and rest > middle * dims.max_width:
            return [
                f"{taken}; the other {middle} would need more than the pretrained width "
                f"{dims.max_width} each; raise width or leave it unset"
            ]
        return []

    def check(self, dims: ModelDims) -> list[str]:
        inner = self.inner()
        kind = inner.kind_name()
        if reads_scores(inner):
            return [
                f"around: {kind!r} allocates from neuron scores of the whole model; around takes "
                "a schedule of widths (geometric, calibrated, a taper, manual)"
            ]
        if inner.required_arms():
            return [
                f"around: {kind!r} reads the widths of other arms, which are whole-model "
                "widths; derive a control from this arm instead (sorted or fitted of it)"
            ]
        problems = self.own_problems(dims)
        if problems:
            return problems
        return [f"around: {problem}" for problem in inner.check(self.middle(dims))]

    def middle_profiles(
        self, dims: ModelDims, profiles: Mapping[str, Sequence[float]]
    ) -> dict[str, list[float]]:
        """The profiles the inner schedule reads, resampled to the model's depth (a profile of
        another depth, from a pretrained reference or a file) and cut to the unprotected
        layers: the profile of a model of those layers alone."""
        n, p = dims.n_layers, self.params
        cut = {}
        for name in self.inner().required_profiles():
            if name in profiles:  # a missing one: the inner schedule says which are available
                values = check_profile(name, profiles[name], nonzero=False)
                cut[name] = resample_profile(values, n)[p.first : n - p.last]
        return cut

    def widths(self, dims: ModelDims, profiles: Mapping[str, Sequence[float]]) -> list[int]:
        problems = self.check(dims)
        if problems:
            raise UsageError("protect: " + "; ".join(problems))
        inner, middle = self.inner(), self.middle(dims)
        widths = inner.widths_from(middle, self.middle_profiles(dims, profiles), {})
        problems = _part_problems(widths, middle, inner.bounds(middle))
        if problems:  # an inner plugin broke its contract on a part of a model: say which
            raise PluginError(
                f"protect: around schedule {inner.kind_name()!r} returned {widths} for "
                f"{middle.n_layers} layers sharing {middle.budget}: " + "; ".join(problems)
            )
        full = self.full_width(dims) or 0  # None only where no layer is protected
        return [full] * self.params.first + [int(w) for w in widths] + [full] * self.params.last

    def bounds(self, dims: ModelDims) -> tuple[int, int] | None:
        """The inner schedule's bounds widened to the full width (a protected layer's width is
        set by the params, not by a profile, and reports say so); None without ``around`` or
        where the inner schedule sets none."""
        if self.params.around is None or self.check(dims):
            return None
        inner = self.inner().bounds(self.middle(dims))
        full = self.full_width(dims)
        if inner is None or full is None or self.params.first + self.params.last == 0:
            return inner
        return min(inner[0], full), max(inner[1], full)


def _part_problems(
    widths: Sequence[int], dims: ModelDims, bounds: tuple[int, int] | None
) -> list[str]:
    """What keeps ``widths`` from being a schedule of the part ``dims`` within ``bounds``."""
    problems = []
    if len(widths) != dims.n_layers:
        problems.append(f"{len(widths)} widths for {dims.n_layers} layers")
    if sum(widths) != dims.budget:
        problems.append(f"they sum to {sum(widths)}, not the budget {dims.budget}")
    m = dims.multiple_of
    if any(w < m or w % m for w in widths):
        problems.append(f"every width must be a positive multiple of {m}")
    cap = dims.max_width or dims.budget
    if any(w > cap for w in widths):
        problems.append(f"no width may exceed {cap}")
    if bounds is not None and any(not bounds[0] <= w <= bounds[1] for w in widths):
        problems.append(f"widths outside its own bounds {list(bounds)}")
    return problems


class NeuronScoreParams(PluginParams):
    """What the pruning allocations share (they read neuron scores, not profiles)."""


class Flap(ScoreAllocation):
    """FLAP's allocation (An et al., 2024) restricted to FFNs (attention heads are not pruned):
    every layer's neuron scores are standardised within the layer (minus its mean, over its
    sample standard deviation), one global threshold over all the model's FFN neurons removes
    the ``N - dims.budget`` worst standardised ones (N: all neurons), and a layer's width is its
    number of neurons strictly above that threshold (:meth:`counts`), rounded to multiples with
    the exact budget (each layer at least one multiple and at most ``dims.max_width``).

    This is FLAP's own rule for FFN channels (CASIA-IVA-Lab/FLAP, ``lib/prune.py``: the
    standardisation ``(x - mean) / std`` over each layer's channels, line 368, ``torch.std``
    unbiased; the ``AL-MM`` threshold, lines 383-385, ``sorted_mlp[-remove]`` with the mask
    ``metric > threshold``, which prunes FFN channels under one threshold and heads under
    another; with no head pruned, that is FLAP's allocation of the FFNs). Where it differs:
    FLAP keeps exact counts, geospec rounds to ``model.multiple_of``; and with nothing to
    remove (keep 1) every neuron is kept (FLAP's ``sorted[-0]`` would index the best). The
    scores are the arm's importance: FLAP's own metric is ``fluctuation`` (WIFV), and FLAP also
    compensates the removed channels with a bias, ``compensate = "mean"``; FLAP as its paper
    runs it is the arm ``{ schedule = { kind = "flap" }, importance = { kind = "fluctuation"
    }, compensate = "mean" }``.
    """

    class Params(NeuronScoreParams):
        kind: Literal["flap"] = "flap"

    def counts(self, scores: Sequence[Sequence[float]], budget: int) -> list[int]:
        """FLAP's kept count per layer before rounding: the neurons whose standardised score is
        strictly above the best of the ``N - budget`` removed ones (a tie at the threshold
        removes every neuron of the tie, as FLAP's ``>`` does)."""
        standardised = [_standardised(layer) for layer in scores]
        pooled = sorted((z for layer in standardised for z in layer), reverse=True)
        if budget > len(pooled):
            raise UsageError(
                f"flap: the budget {budget} exceeds the {len(pooled)} neurons there are"
            )
        removed = len(pooled) - budget
        if removed == 0:
            return [len(layer) for layer in scores]
        threshold = pooled[-removed]
        return [sum(1 for z in layer if z > threshold) for layer in standardised]

    def widths_from_scores(self, dims: ModelDims, scores: Sequence[Sequence[float]]) -> list[int]:
        counts = [float(c) for c in self.counts(scores, dims.budget)]
        # a tie at the threshold can keep fewer than the budget: rounding fixes the sum
        return _rounded(dims, counts, scores)


class OwlParams(NeuronScoreParams):
    """OWL's two hyperparameters."""

    m: float = Field(5.0, gt=0.0, le=1000.0)
    """A score above m x the layer's mean score is an outlier (OWL's M)."""
    lam: float = Field(0.08, ge=0.0, le=0.5)
    """Keep ratios spread over the overall keep ratio +- lam (OWL's lambda)."""


class Owl(ScoreAllocation):
    """OWL's allocation (Yin et al., 2024) applied to FFN widths. A layer's outlier ratio D_l is
    the share of the per-weight Wanda scores |W_ij| x ‖X_j‖₂ of every linear map of decoder
    layer l (attention q/k/v/o and the MLP's gate/up/down; GPT-2's c_attn, c_proj, c_fc,
    mlp.c_proj) above ``m`` times their mean, all the block's weights pooled; the keep ratios
    are the ratios mapped linearly onto [0, 2 ``lam``] and shifted to mean the overall keep
    ratio; a layer's width is its keep ratio x its pretrained width, rounded to multiples with
    the exact budget (at least one multiple, at most ``dims.max_width``).

    OWL's code (luuyin/OWL, ``lib/prune_all.py``, ``prune_wanda_outlier``): the scores of every
    ``nn.Linear`` of the layer concatenated, lines 915-943; D_l = the share above
    ``mean x Hyper_m`` (``check_outlier_mean``, lines 139-154, in percent, a scale the
    normalisation removes); ``(D - min) / (max - min) x 2 Lamda``, minus its mean, plus the
    target density, lines 962-966. Where it differs: OWL sets each layer's unstructured sparsity
    (a layer sparsity at or below 0 becomes 0.01, lines 1054-1058); here the ratio sets the
    FFN's width, capped at the pretrained width with the surplus rounded onto the other layers
    so the budget stays exact, and which neurons go is the arm's importance (``wanda_sp`` is
    Wanda's structured score). Equal outlier ratios give uniform widths (OWL divides by zero).
    OWL's defaults: ``lam`` 0.08 with ``m`` 5 in its README's unstructured recipes
    (``main.py``'s own default ``m`` is 3). The ratios come from ``[prune]``'s calibration
    (:class:`~geospec.kinds.BlockLinears`, :attr:`reads_block_linears`); ``owl_neuron`` counts
    outliers among the neuron scores instead.
    """

    reads_block_linears = True

    class Params(OwlParams):
        kind: Literal["owl"] = "owl"

    params: Params

    def outlier_ratios(self, blocks: Sequence[BlockLinears]) -> list[float]:
        """D_l: the share of layer l's per-weight Wanda scores above m x their mean."""
        ratios = []
        for block in blocks:
            scores = [linear.wanda_scores() for linear in block.linears]
            if not scores:
                raise UsageError(f"owl: decoder layer {block.layer} has no linear map")
            count = sum(s.numel() for s in scores)
            threshold = self.params.m * float(sum(s.sum() for s in scores)) / count
            outliers = sum(int((s > threshold).sum()) for s in scores)
            ratios.append(outliers / count)
        return ratios

    def keep_ratios(self, blocks: Sequence[BlockLinears], keep: float) -> list[float]:
        """OWL's per-layer keep ratios around the overall ``keep``."""
        return _owl_keep_ratios(self.outlier_ratios(blocks), keep, self.params.lam)

    def widths_from_scores(self, dims: ModelDims, scores: Sequence[Sequence[float]]) -> list[int]:
        raise UsageError(
            "'owl' reads every linear map of each decoder layer with its calibration inputs "
            "(OWL's per-weight scores), which geospec prune gives it; 'owl_neuron' allocates "
            "from neuron scores alone"
        )

    def widths_from_blocks(
        self,
        dims: ModelDims,
        scores: Sequence[Sequence[float]],
        blocks: Sequence[BlockLinears],
    ) -> list[int]:
        if len(blocks) != dims.n_layers:
            raise UsageError(f"owl: {len(blocks)} decoder layers measured for {dims.n_layers}")
        total = sum(len(layer) for layer in scores)
        ratios = self.keep_ratios(blocks, dims.budget / total)
        counts = [r * len(layer) for r, layer in zip(ratios, scores, strict=True)]
        return _rounded(dims, counts, scores)


class OwlNeuron(ScoreAllocation):
    """OWL's rule on neuron scores alone (what ``owl`` was before 0.2's faithful one): a layer's
    outlier ratio D_l is the share of its neuron scores (the arm's importance) above ``m`` times
    the layer's mean score, mapped to keep ratios as ``owl`` does. Cheaper (no calibration of
    the attention and MLP inputs), and not OWL: one score per FFN neuron, not per weight of the
    block."""

    class Params(OwlParams):
        kind: Literal["owl_neuron"] = "owl_neuron"

    params: Params

    def outlier_ratios(self, scores: Sequence[Sequence[float]]) -> list[float]:
        """D_l: the share of layer l's scores above m x its mean score."""
        ratios = []
        for layer in scores:
            mean = sum(layer) / len(layer)
            ratios.append(sum(1 for s in layer if s > self.params.m * mean) / len(layer))
        return ratios

    def keep_ratios(self, scores: Sequence[Sequence[float]], keep: float) -> list[float]:
        """OWL's per-layer keep ratios around the overall ``keep``."""
        return _owl_keep_ratios(self.outlier_ratios(scores), keep, self.params.lam)

    def widths_from_scores(self, dims: ModelDims, scores: Sequence[Sequence[float]]) -> list[int]:
        total = sum(len(layer) for layer in scores)
        ratios = self.keep_ratios(scores, dims.budget / total)
        counts = [r * len(layer) for r, layer in zip(ratios, scores, strict=True)]
        return _rounded(dims, counts, scores)


class Greedy(ScoreAllocation):
    """A search on the calibration loss, the headroom every heuristic allocation is measured
    against: from every layer at its pretrained width (rounded down to a multiple), remove
    ``step`` multiples (the last move: what is left) from the layer whose cut raises the
    calibration loss least, until the budget is met; ties go to the lower layer. The losses are
    the mean next-token loss on the prune's calibration windows (the training split, never eval
    text), each layer keeping its best neurons by the arm's importance, without compensation
    (:class:`~geospec.kinds.CutLosses`; geospec prune computes a move from the cut layer on).

    What it guarantees: every move is the best single move from where it stands, so its widths
    score no worse than any other last move from its own second-to-last widths. It guarantees
    nothing against uniform or any other allocation (a greedy path can end worse than one cut
    it never walked towards), and it costs one calibration pass per layer per move (coarser
    ``step``, fewer moves)."""

    reads_cut_losses = True

    class Params(NeuronScoreParams):
        kind: Literal["greedy"] = "greedy"
        step: int = Field(1, ge=1, le=100_000)
        """Multiples of model.multiple_of removed per move."""

    params: Params

    def widths_from_scores(self, dims: ModelDims, scores: Sequence[Sequence[float]]) -> list[int]:
        raise UsageError(
            "'greedy' searches on the calibration loss of the model being pruned, which geospec "
            "prune gives it"
        )

    def widths_from_losses(
        self, dims: ModelDims, scores: Sequence[Sequence[float]], losses: CutLosses
    ) -> list[int]:
        m = dims.multiple_of
        widths = [min(len(layer), dims.max_width or len(layer)) // m * m for layer in scores]
        excess = sum(widths) - dims.budget
        if excess < 0 or excess % m or len(widths) != dims.n_layers:
            raise UsageError(
                f"greedy: {len(widths)} layers of at most {widths} neurons cannot keep the budget "
                f"{dims.budget} of {dims.n_layers} layers in multiples of {m}"
            )
        while excess > 0:
            size = min(self.params.step * m, excess)
            moves = [(layer, w - size) for layer, w in enumerate(widths) if w - size >= m]
            if not moves:
                raise UsageError(f"greedy: no layer can lose {size} more neurons from {widths}")
            values = losses(widths, moves)
            best = min(range(len(moves)), key=lambda i: (values[i], moves[i][0]))
            layer, width = moves[best]
            widths[layer] = width
            excess -= size
        return widths


class EvolveStage(BaseModel):
    """One selection stage of ``evolve``: every candidate left is scored on ``tokens``
    calibration tokens (the nearest number of whole windows, freshly drawn), and the best
    ``survivors`` go on."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    tokens: int = Field(ge=1, le=100_000_000)
    """Calibration tokens each candidate is scored on (rounded to whole windows, at least one)."""
    survivors: int = Field(ge=1, le=10_000)
    """How many candidates go on to the next stage (1 in the last: the one that may replace
    the parent)."""


def _default_stages() -> list[EvolveStage]:
    # about 10k scored tokens a generation, about 10 s on 2 cores for SmolLM2-135M: 16 x 256 on
    # the first stage (EvoPress's first stage gave the same result from 64 to 1,024 tokens), 2
    # offspring and the parent on 2048
    return [EvolveStage(tokens=256, survivors=2), EvolveStage(tokens=2048, survivors=1)]


class Evolve(ScoreAllocation):
    """An evolutionary search of the allocation on the calibration text, as EvoPress
    (Sieberling et al., 2025) runs it: one level per layer, a level ``step`` multiples of
    neurons, the layer keeping its best neurons by the arm's importance at every level (nested
    levels), repaired as the arm's ``repair`` says (mean compensation, or the least-squares
    re-fit from the unpruned model's inputs, each level solved once; the winner is then
    repaired as the arm says, sequentially where it says so). A generation draws
    ``offspring`` mutations of the parent, each ``min(U{1,3}, U{1,3})`` swaps (one layer a step
    down, another a step up, so the budget stays exact; an offspring equal to its parent or to
    another is drawn again), and selects in ``stages``: each stage scores the candidates left
    on freshly drawn calibration windows and keeps the best; the parent joins the last stage,
    scored again, and is replaced only by an offspring that beats it there. The fitness is the
    mean per-token KL divergence from the unpruned model's next-token distribution (or the
    calibration loss), on the prune's calibration windows (training split, never eval text):
    :class:`~geospec.kinds.Search`.

    It starts from ``start`` (a schedule that needs no profile, score or arm: uniform,
    protect, a taper, manual) or from the widths of any other prune arm (``start_arm``: a
    geometric arm, protect-ends, flap, an owl setting, another search). It runs ``generations``
    generations, or with ``patience`` stops once that many generations have passed without a
    better parent on fixed tracked windows. Generation g draws from ``(seed, g)`` alone and the
    stop is a function of the trajectory, so a search resumed from its state after generation
    g continues and stops as if never interrupted.

    This class holds the search's settings and checks them; the search itself is
    :class:`geospec.prune.evolve.Evolution`."""

    reads_search = True

    class Params(NeuronScoreParams):
        kind: Literal["evolve"] = "evolve"
        start: ScheduleRef = Field(default_factory=Uniform.Params)
        """The allocation the search starts from: a schedule table that reads no profile,
        neuron score or arm (uniform, protect, a taper, manual)."""
        start_arm: ArmName | None = None
        """Start from this other prune arm's widths instead (any arm: a geometric arm,
        protect-ends, flap, an owl setting, another search; not a grid's name)."""
        generations: int = Field(150, ge=1, le=1_000_000)
        """Generations of the search."""
        offspring: int = Field(16, ge=1, le=10_000)
        """Mutations of the parent drawn each generation."""
        stages: list[EvolveStage] = Field(default_factory=_default_stages, min_length=1)
        """The selection stages, in order (the last keeps 1 survivor)."""
        step: int = Field(1, ge=1, le=100_000)
        """A level, in multiples of model.multiple_of: what a swap moves between two layers."""
        min_width: int | None = Field(None, ge=1)
        """The narrowest a layer may become, in neurons (default: one multiple)."""
        max_width: int | None = Field(None, ge=1)
        """The widest a layer may become, in neurons (default: the pretrained width)."""
        fitness: Literal["kl", "loss"] = "kl"
        """What a candidate is scored by: the mean per-token KL divergence from the unpruned
        model's next-token distribution, or the mean next-token loss."""
        seed: int = Field(0, ge=0)
        """Seeds the mutations and the windows each stage draws."""
        kl_top_k: Annotated[int | None, ADDED_LATER, Field(ge=1, le=1_000_000)] = None
        """The KL fitness over the unpruned model's ``kl_top_k`` most likely tokens at each
        position, every other token lumped into one bucket (cheaper over a large vocabulary,
        and its teacher kept as those tokens alone); default: the whole vocabulary."""
        patience: Annotated[int | None, ADDED_LATER, Field(ge=1, le=1_000_000)] = None
        """Stop after this many generations without a better parent on the tracked windows
        (fixed windows, drawn once from the seed, on which every new parent is scored);
        default: no early stop, every one of ``generations`` runs and nothing is tracked."""

        @field_validator("stages")
        @classmethod
        def _narrowing(cls, stages: list[EvolveStage]) -> list[EvolveStage]:
            counts = [stage.survivors for stage in stages]
            if counts[-1] != 1:
                raise ValueError(
                    f"the last stage keeps {counts[-1]} survivors; it keeps 1 (the candidate "
                    "that may replace the parent)"
                )
            if any(b > a for a, b in itertools.pairwise(counts)):
                raise ValueError(f"survivors must not grow from stage to stage, got {counts}")
            return stages

        @model_validator(mode="after")
        def _one_start(self) -> Evolve.Params:
            # start's default (uniform) beside start_arm: the table read back from its dump
            if self.start_arm is not None and self.start != Uniform.Params():
                raise ValueError("give start or start_arm, not both")
            if self.kl_top_k is not None and self.fitness != "kl":
                raise ValueError(
                    f"kl_top_k lumps the KL's tail, and fitness is {self.fitness!r}: drop "
                    'kl_top_k or set fitness = "kl"'
                )
            if self.stages[0].survivors > self.offspring:
                raise ValueError(
                    f"stages[0].survivors {self.stages[0].survivors} exceeds offspring "
                    f"{self.offspring}"
                )
            return self

    params: Params

    def required_arms(self) -> list[str]:
        return [] if self.params.start_arm is None else [self.params.start_arm]

    def start_schedule(self) -> Schedule:
        schedule: Schedule = create_plugin("schedule", self.params.start)
        return schedule

    def check(self, dims: ModelDims) -> list[str]:
        from geospec.prune.evolve import Evolution

        problems = self._start_problems(dims)
        if problems or dims.max_width is None:  # no pretrained width: a training arm's dims
            return problems
        # what geospec prune will refuse, said by geospec validate: the levels and the step
        # at the pretrained width (the checkpoint's, as every layer has under prune)
        try:
            evolution = Evolution(self.params)
            low, high, size = evolution.levels(dims, dims.max_width)
            if self.params.start_arm is None:
                start = self.start_schedule().widths_from(dims, {}, {})
                evolution.check_start(start, dims, low, high, size)
        except UsageError as error:
            return [str(error)]
        return []

    def _start_problems(self, dims: ModelDims) -> list[str]:
        """What keeps ``start`` from giving the search its first widths."""
        if self.params.start_arm is not None:
            return []
        start = self.start_schedule()
        kind = start.kind_name()
        if reads_scores(start):
            searched = isinstance(start, ScoreAllocation) and (
                start.reads_search or start.reads_cut_losses
            )
            what = "is a search" if searched else "reads neuron scores"
            return [
                f"start: {kind!r} {what}; list it as its own [[prune.arms]] and name it in "
                "start_arm" + (", or start from uniform" if searched else "")
            ]
        if start.required_profiles() or start.profiles_file() or start.required_arms():
            return [
                f"start: {kind!r} reads profiles or other arms; list it as its own "
                "[[prune.arms]] and name it in start_arm"
            ]
        return start.check(dims)

    def widths_from_scores(self, dims: ModelDims, scores: Sequence[Sequence[float]]) -> list[int]:
        raise UsageError(
            "'evolve' searches on the calibration text of the model being pruned, which geospec "
            "prune gives it"
        )

    def widths_from_search(
        self,
        dims: ModelDims,
        scores: Sequence[Sequence[float]],
        arms: Mapping[str, Sequence[int]],
        search: Search,
    ) -> list[int]:
        from geospec.prune.evolve import Evolution

        def start() -> list[int]:
            if self.params.start_arm is not None:
                return list(arms[self.params.start_arm])
            problems = self._start_problems(dims)
            if problems:
                raise UsageError(problems[0])
            return list(self.start_schedule().widths_from(dims, {}, {}))

        return Evolution(self.params).run(dims, scores, start, search)


def _owl_keep_ratios(ratios: Sequence[float], keep: float, lam: float) -> list[float]:
    """OWL's map from outlier ratios to keep ratios (``lib/prune_all.py`` lines 962-966):
    min-max onto [0, 2 lam], shifted to mean ``keep``; equal ratios give ``keep`` everywhere."""
    low, high = min(ratios), max(ratios)
    spread = (
        [0.0] * len(ratios) if high == low else [(r - low) / (high - low) * 2 * lam for r in ratios]
    )
    mean = sum(spread) / len(spread)
    return [keep + s - mean for s in spread]


def _standardised(layer: Sequence[float]) -> list[float]:
    """(s - mean) / sd with the sample standard deviation (n - 1, as ``torch.std``)."""
    n = len(layer)
    mean = sum(layer) / n
    sd = math.sqrt(sum((s - mean) ** 2 for s in layer) / (n - 1)) if n > 1 else 0.0
    return [0.0] * n if sd == 0 else [(s - mean) / sd for s in layer]


def _rounded(
    dims: ModelDims, counts: Sequence[float], scores: Sequence[Sequence[float]]
) -> list[int]:
    """Widths near ``counts`` in multiples, summing to the budget, at least one multiple and at
    most the narrowest layer's neuron count (pruning never grows a layer; pretrained models have
    one width)."""
    if len(scores) != dims.n_layers:
        raise UsageError(f"{len(scores)} layers of neuron scores for {dims.n_layers} layers")
    upper = min(len(layer) for layer in scores)
    if dims.max_width is not None:
        upper = min(upper, dims.max_width)
    return round_to_budget(counts, dims.budget, dims.multiple_of, dims.multiple_of, upper, counts)


def _lookup(profiles: Mapping[str, Sequence[float]], name: str) -> Sequence[float]:
    if name not in profiles:
        available = ", ".join(repr(p) for p in profiles) or "none"
        raise UsageError(f"profile {name!r} is not available (available: {available})")
    return profiles[name]


@hookimpl
def geospec_register_schedules(register: Register) -> None:
    register(Uniform)
    register(Cosine)
    register(Linear)
    register(Sigmoid)
    register(Geometric)
    register(Anti)
    register(Permuted)
    register(Calibrated)
    register(Manual)
    register(Fitted)
    register(Sorted)
    register(Protect)
    register(Flap)
    register(Owl)
    register(OwlNeuron)
    register(Greedy)
    register(Evolve)
