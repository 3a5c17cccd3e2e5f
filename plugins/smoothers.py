"""Profile smoothers: L floats in, L floats out, non-negative in gives non-negative out.

Edge handling (documented in docs/schedules.md): the moving average and the Gaussian truncate
their kernel at the first and last layer and renormalise the weights that remain, so a constant
profile stays constant and nothing is invented beyond the ends. Savitzky-Golay fits its polynomial
to the first (last) window for the edge layers (scipy's ``mode="interp"``). Isotonic regression
needs no edge rule.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

from pydantic import Field, model_validator

from geospec import hookimpl
from geospec.kinds import Smoother
from geospec.plugin import PluginParams, Register


class NoSmoothing(Smoother):
    """Leaves the profile as measured."""

    class Params(PluginParams):
        kind: Literal["none"] = "none"

    def __call__(self, profile: Sequence[float]) -> list[float]:
        return [float(v) for v in profile]


class MovingAverage(Smoother):
    """Centred moving average over ``window`` layers (truncated and renormalised at the ends)."""

    class Params(PluginParams):
        kind: Literal["moving_average"] = "moving_average"
        window: int = Field(3, ge=1, le=1001)
        """Odd number of layers averaged, centred on each layer."""

        @model_validator(mode="after")
        def _odd(self) -> MovingAverage.Params:
            if self.window % 2 == 0:
                raise ValueError(f"window must be odd (centred on the layer), got {self.window}")
            return self

    params: Params

    def __call__(self, profile: Sequence[float]) -> list[float]:
        half = self.params.window // 2
        return kernel_smooth(profile, [1.0] * (2 * half + 1))


class Gaussian(Smoother):
    """Gaussian kernel smoothing with standard deviation ``sigma`` layers (kernel cut at 4 sigma,
    truncated and renormalised at the ends)."""

    class Params(PluginParams):
        kind: Literal["gaussian"] = "gaussian"
        sigma: float = Field(1.0, gt=0.0, le=1000.0)
        """Standard deviation of the kernel, in layers."""

    params: Params

    def __call__(self, profile: Sequence[float]) -> list[float]:
        sigma = self.params.sigma
        half = max(1, math.ceil(4 * sigma))
        kernel = [math.exp(-0.5 * (offset / sigma) ** 2) for offset in range(-half, half + 1)]
        return kernel_smooth(profile, kernel)


class SavitzkyGolay(Smoother):
    """Savitzky-Golay: a least-squares polynomial of degree ``order`` over ``window`` layers.

    Edge layers take the polynomial fitted to the first (last) window. A profile shorter than the
    window uses the largest odd window that fits (and a degree below it). Polynomials can dip
    below zero next to a sharp drop; work is non-negative, so such values are clipped to zero.
    """

    class Params(PluginParams):
        kind: Literal["savgol"] = "savgol"
        window: int = Field(5, ge=1, le=1001)
        """Odd number of layers in each fit."""
        order: int = Field(2, ge=0, le=20)
        """Degree of the fitted polynomial; must be below window."""

        @model_validator(mode="after")
        def _shape(self) -> SavitzkyGolay.Params:
            if self.window % 2 == 0:
                raise ValueError(f"window must be odd (centred on the layer), got {self.window}")
            if self.order >= self.window:
                raise ValueError(
                    f"order {self.order} must be smaller than window {self.window}; "
                    f"use order <= {self.window - 1} or a larger window"
                )
            return self

    params: Params

    def __call__(self, profile: Sequence[float]) -> list[float]:
        from scipy.signal import savgol_filter

        n = len(profile)
        window = min(self.params.window, n if n % 2 else n - 1)
        order = min(self.params.order, window - 1)
        if window <= 1:
            return [float(v) for v in profile]
        smoothed = savgol_filter([float(v) for v in profile], window, order, mode="interp")
        return [max(float(v), 0.0) for v in smoothed]


class Isotonic(Smoother):
    """The best non-increasing fit in least squares (pool-adjacent-violators).

    Encodes the finding that normalised work is front-loaded while keeping the measured levels.
    """

    class Params(PluginParams):
        kind: Literal["isotonic"] = "isotonic"

    def __call__(self, profile: Sequence[float]) -> list[float]:
        return non_increasing_fit(profile)


def kernel_smooth(profile: Sequence[float], kernel: Sequence[float]) -> list[float]:
    """Weighted average of each layer's neighbourhood with a centred, odd-length ``kernel``.

    Weights that fall beyond the first or last layer are dropped and the rest renormalised.
    """
    n = len(profile)
    half = len(kernel) // 2
    out = []
    for i in range(n):
        first, last = max(0, i - half), min(n - 1, i + half)
        weights = [kernel[j - i + half] for j in range(first, last + 1)]
        values = profile[first : last + 1]
        out.append(sum(w * float(v) for w, v in zip(weights, values, strict=True)) / sum(weights))
    return out


def non_increasing_fit(profile: Sequence[float]) -> list[float]:
    """Least-squares non-increasing fit by pooling adjacent violators into blocks of their mean."""
    blocks: list[tuple[float, int]] = []  # (mean, size), non-increasing from left to right
    for value in profile:
        mean, size = float(value), 1
        while blocks and blocks[-1][0] < mean:
            previous, count = blocks.pop()
            mean, size = (previous * count + mean * size) / (count + size), count + size
        blocks.append((mean, size))
    return [mean for mean, size in blocks for _ in range(size)]


@hookimpl
def geospec_register_smoothers(register: Register) -> None:
    register(NoSmoothing)
    register(MovingAverage)
    register(Gaussian)
    register(SavitzkyGolay)
    register(Isotonic)
