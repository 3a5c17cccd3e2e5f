"""The pruning control that keeps the first and last layers whole (protect): the other layers
share what is left of the budget, uniformly or as an inner schedule allocates them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

from pydantic import Field

from geospec.errors import PluginError, UsageError
from geospec.kinds import (
    ModelDims,
    Schedule,
    check_profile,
    reads_scores,
    resample_profile,
)
from geospec.plugin import (
    PluginParams,
    ScheduleRef,
    create_plugin,
)

from .tapers import Uniform


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
