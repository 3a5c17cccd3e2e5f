"""The per-layer power law fitted to measured demand: d(f) = lambda (f^(-a) - 1).

Measured demand (:mod:`geospec.measure.demand`) gives, for each layer l and keep fraction f (the
share of the layer's FFN neurons kept, f = w / W), the validation-loss increase d(f) when only
that layer is cut. The paper's surrogate assumes the layer's error falls as a power of its width,
err_l(w) = lambda_l (w / W)^(-a_l); the increase over the full width is then
d(f) = lambda_l (f^(-a_l) - 1), zero at f = 1. :func:`fit_demand` finds lambda_l and a_l, and
:attr:`DemandFit.power_law` says whether the curve describes the layer at all (the ``calibrated``
schedule allocates widths from lambda and a; a layer the law does not describe is named, since
its exponent is then an artefact of the fit rather than a measurement).

numpy and scipy only (no torch): the fit runs on a handful of numbers per layer, and the report
and tests use it without a model.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from scipy.optimize import minimize_scalar

#: The smallest R^2 at which the fitted power law is taken to describe a layer's demand. 0.9:
#: the curve explains nine tenths of the variance of the measured increases; below it the
#: exponent is an artefact of forcing a power law on another shape (a step, a plateau, noise).
POWER_LAW_R2 = 0.9

#: Points of the log-spaced exponent grid that brackets the global minimum before refinement.
#: The SSE in a may have several local minima (noisy or non-power-law data); a bounded scalar
#: search started on the whole range could settle in any of them.
GRID = 256

#: The exponents :func:`fit_demand` searches by default: a_l = 0.01 is a layer whose loss barely
#: rises until it is cut to nothing, 10 one whose loss rises only at the smallest fraction.
EXPONENT_RANGE = (0.01, 10.0)

Array = npt.NDArray[np.float64]


@dataclass(frozen=True)
class DemandFit:
    """One layer's fitted power law d(f) = sensitivity * (f^(-exponent) - 1)."""

    sensitivity: float
    """lambda_l, the loss scale of the layer's demand (>= 0: the fit constrains it)."""
    exponent: float
    """a_l, how fast the loss rises as the layer is cut. Meaningless when ``sensitivity`` is 0
    (the curve is flat whatever a is); :func:`fit_demand` then records the geometric mid of the
    exponent range."""
    r2: float | None
    """1 - SSE/SST of the fitted curve on the measured points; None when the increases are all
    equal (SST = 0: there is no variance to explain)."""

    def predict(self, keep: Sequence[float]) -> list[float]:
        """The fitted loss increase at each keep fraction (0 at f = 1; f > 1 extrapolates)."""
        f = np.asarray(keep, dtype=np.float64)
        if f.ndim != 1 or not np.all(np.isfinite(f)) or np.any(f <= 0):
            raise ValueError(f"keep fractions must be finite and positive, got {list(keep)}")
        if self.sensitivity == 0.0:  # flat: also where f^-a itself would overflow
            return [0.0] * len(f)
        return [float(v) for v in self.sensitivity * np.expm1(-self.exponent * np.log(f))]

    @property
    def power_law(self) -> bool:
        """Whether the power law describes the layer: ``r2`` is known and at least
        :data:`POWER_LAW_R2`."""
        return self.r2 is not None and self.r2 >= POWER_LAW_R2


def fit_demand(
    keep: Sequence[float],
    increase: Sequence[float],
    exponent_range: tuple[float, float] = EXPONENT_RANGE,
) -> DemandFit:
    """Least-squares fit of d(f) = lambda (f^(-a) - 1) to measured increases, lambda >= 0 and a
    within ``exponent_range``.

    The model is linear in lambda, so the fit is a one-dimensional search: for a fixed exponent
    the best lambda has the closed form lambda(a) = sum g_i d_i / sum g_i^2 with
    g_i = f_i^(-a) - 1 (clipped at 0: a quadratic in lambda minimised on lambda >= 0), and the
    residual sum of squares SSE(a) of that lambda is minimised over a alone. A generic two-
    parameter solver (curve_fit) needs a starting point and can stop in a local minimum or step
    outside the constraints; the profile over a cannot. The SSE may have several local minima, so
    a coarse log-spaced grid of :data:`GRID` exponents brackets the global one first, and
    ``scipy.optimize.minimize_scalar`` (bounded Brent) refines it on log a between the grid
    neighbours (log a: the exponent's scale is relative, 0.05 and 0.1 differ as much as 5 and 10).

    When no exponent in the range makes lambda positive (every cut lowered or kept the loss),
    lambda is 0, the curve is flat and a is not identified: the exponent is recorded as the
    geometric mid of the range, sqrt(lo * hi) (the centre of the range on the log scale the
    search uses), so it is positive and neither bound.

    Raises ValueError when the inputs are not one finite increase per distinct fraction strictly
    inside (0, 1), fewer than 2 points, or the range is not 0 < lo < hi (finite).
    """
    f, d = _checked(keep, increase)
    lo, hi = _checked_range(exponent_range)
    log_f = np.log(f)

    def fitted(log_a: float) -> tuple[float, float, float]:
        """(lambda in units of the basis scale, the scale, SSE) at exponent exp(log_a)."""
        g, scale = _scaled_basis(log_f, math.exp(log_a))
        slope = max(float(g @ d) / float(g @ g), 0.0)
        residual = d - slope * g
        return slope, scale, float(residual @ residual)

    def sse(log_a: float) -> float:
        return fitted(log_a)[2]

    grid = np.linspace(math.log(lo), math.log(hi), GRID)
    values = [sse(float(t)) for t in grid]
    best = int(np.argmin(values))
    left, right = float(grid[max(best - 1, 0)]), float(grid[min(best + 1, GRID - 1)])
    refined = minimize_scalar(
        sse, bounds=(left, right), method="bounded", options={"xatol": 1e-12, "maxiter": 500}
    )
    log_a = min([float(grid[best]), float(refined.x)], key=sse)  # Brent never tries the ends
    slope, scale, residual = fitted(log_a)
    if slope == 0.0:
        log_a = (math.log(lo) + math.log(hi)) / 2
    sensitivity = slope / scale
    centred = d - d.mean()
    total = float(centred @ centred)
    r2 = None if total == 0.0 else 1.0 - residual / total
    exponent = min(max(math.exp(log_a), lo), hi)  # exp(log(hi)) may round above hi
    return DemandFit(sensitivity=sensitivity, exponent=exponent, r2=r2)


def _scaled_basis(log_f: Array, exponent: float) -> tuple[Array, float]:
    """g_i = f_i^(-a) - 1 divided by its largest value, and that value.

    Computed in logs: f^(-a) overflows for small f and large a (1e-80^-10), and near a = 0 the
    subtraction cancels (expm1 keeps it exact). The ratio is what the least squares need; lambda
    is divided by the scale afterwards.
    """
    x = -exponent * log_f  # > 0: f < 1 and a > 0
    large = x > 1.0
    log_g = np.empty_like(x)
    log_g[large] = x[large] + np.log1p(-np.exp(-x[large]))  # log(e^x - 1) without overflow
    log_g[~large] = np.log(np.expm1(x[~large]))
    top = float(log_g.max())
    # Beyond the largest double (f^-a above 1.8e308) the scale is inf and lambda = slope / scale
    # is 0: such a curve is far outside any measured demand, and numpy's overflow is expected.
    with np.errstate(over="ignore"):
        scale = float(np.exp(top))
    return np.exp(log_g - top), scale


def _checked(keep: Sequence[float], increase: Sequence[float]) -> tuple[Array, Array]:
    f = np.asarray(keep, dtype=np.float64)
    d = np.asarray(increase, dtype=np.float64)
    if f.ndim != 1 or d.ndim != 1:
        raise ValueError("keep and increase must be flat sequences of numbers")
    if len(f) != len(d):
        raise ValueError(f"{len(f)} keep fractions but {len(d)} loss increases; give one each")
    if len(f) < 2:
        raise ValueError(f"{len(f)} point(s): fitting lambda and a needs at least 2")
    if not np.all(np.isfinite(f)) or not np.all((f > 0) & (f < 1)):
        raise ValueError(
            f"keep fractions must lie strictly between 0 and 1 (a cut layer), got {list(keep)}"
        )
    if len(np.unique(f)) != len(f):
        raise ValueError(f"keep fractions must be distinct, got {list(keep)}")
    if not np.all(np.isfinite(d)):
        raise ValueError(f"loss increases must be finite, got {list(increase)}")
    return f, d


def _checked_range(exponent_range: tuple[float, float]) -> tuple[float, float]:
    lo, hi = (float(v) for v in exponent_range)
    if not (math.isfinite(lo) and math.isfinite(hi) and 0 < lo < hi):
        raise ValueError(f"exponent_range must be finite with 0 < lo < hi, got {exponent_range}")
    return lo, hi


__all__ = ["GRID", "POWER_LAW_R2", "DemandFit", "fit_demand"]
