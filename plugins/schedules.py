"""Width schedules: uniform and the TLM cosine taper."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Literal

from pydantic import Field

from geospec import hookimpl
from geospec.hookspecs import Register
from geospec.kinds import ModelDims, Schedule
from geospec.plugin import PluginParams
from geospec.rounding import round_to_budget


class Uniform(Schedule):
    """Every layer gets the uniform width."""

    class Params(PluginParams):
        kind: Literal["uniform"] = "uniform"

    def widths(self, dims: ModelDims, profiles: Mapping[str, Sequence[float]]) -> list[int]:
        return [dims.ffn_width] * dims.n_layers


class Cosine(Schedule):
    """The cosine taper of Tapered Language Models (Bayat et al. 2026).

    w_l = w_end + (w_start - w_end) * (1 + cos(pi * l / (L - 1))) / 2 for l = 0..L-1, with
    w_start = start * w_uniform and w_end = end * w_uniform. When start + end = 2 the mean is
    exactly w_uniform before rounding; otherwise the profile is rescaled to the budget. Widths are
    then rounded to the model's multiple with the sum kept exactly on budget.
    """

    class Params(PluginParams):
        kind: Literal["cosine"] = "cosine"
        start: float = Field(1.5, gt=0, le=100)
        """Width of the first layer as a multiple of the uniform width."""
        end: float = Field(0.5, gt=0, le=100)
        """Width of the last layer as a multiple of the uniform width."""

    params: Params

    def continuous(self, n_layers: int, uniform_width: float) -> list[float]:
        """The taper before rounding (rescaled so the mean is the uniform width)."""
        p = self.params
        if n_layers == 1:
            return [uniform_width]
        w_start, w_end = p.start * uniform_width, p.end * uniform_width
        raw = [
            w_end + (w_start - w_end) * (1 + math.cos(math.pi * layer / (n_layers - 1))) / 2
            for layer in range(n_layers)
        ]
        scale = n_layers * uniform_width / sum(raw)
        return [w * scale for w in raw]

    def widths(self, dims: ModelDims, profiles: Mapping[str, Sequence[float]]) -> list[int]:
        values = self.continuous(dims.n_layers, dims.ffn_width)
        return round_to_budget(values, dims.budget, dims.multiple_of)


@hookimpl
def geospec_register_schedules(register: Register) -> None:
    register(Uniform)
    register(Cosine)
