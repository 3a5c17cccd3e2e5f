"""The schedules whose shape is fixed by their params: uniform and the TLM tapers (cosine,
linear, sigmoid), each rescaled to the budget and rounded to the model's multiple."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Literal

from pydantic import Field

from geospec.kinds import (
    ModelDims,
    Schedule,
    round_to_budget,
)
from geospec.plugin import (
    PluginParams,
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
