"""The `step` schedule: the layers before ``split`` are ``ratio`` times wider than the others."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

from pydantic import Field

from geospec import hookimpl
from geospec.kinds import ModelDims, Schedule, round_to_budget
from geospec.plugin import PluginParams, Register


class Step(Schedule):
    """Two widths: w for the first ``split`` share of the layers, w / ``ratio`` for the rest,
    with the budget kept exactly (rounded to the model's multiple by geospec's own rounding)."""

    class Params(PluginParams):
        kind: Literal["step"] = "step"
        ratio: float = Field(2.0, gt=0, le=100)
        """How many times wider the first layers are than the last ones."""
        split: float = Field(0.5, gt=0, lt=1)
        """The share of the layers (from the first) that get the wider width."""

    params: Params

    def check(self, dims: ModelDims) -> list[str]:
        if self._first(dims) in (0, dims.n_layers):
            return [f"split {self.params.split} leaves no layer on one side of the step"]
        return []

    def widths(self, dims: ModelDims, profiles: Mapping[str, Sequence[float]]) -> list[int]:
        first = self._first(dims)
        ratio = self.params.ratio
        narrow = dims.budget / (first * ratio + dims.n_layers - first)
        shape = [narrow * ratio] * first + [narrow] * (dims.n_layers - first)
        return round_to_budget(shape, dims.budget, dims.multiple_of, upper=dims.max_width)

    def _first(self, dims: ModelDims) -> int:
        return round(self.params.split * dims.n_layers)


@hookimpl
def geospec_register_schedules(register: Register) -> None:
    register(Step)
