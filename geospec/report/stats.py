"""Paired comparisons of arms across seeds: mean difference, t-interval, bootstrap, wins.

numpy and scipy are imported by the functions that compute (the pipeline's stages import
:func:`finite` from here, and ``geospec --help`` loads them without numpy).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Summary:
    mean: float
    sd: float  # sample standard deviation (n - 1); nan for a single value
    n: int


@dataclass(frozen=True)
class PairedDifference:
    """``arm - baseline`` over the seeds both have (negative: the arm has lower loss)."""

    mean: float
    sd: float
    ci: tuple[float, float]  # t-interval; (nan, nan) with fewer than 2 seeds
    bootstrap_ci: tuple[float, float] | None  # percentile bootstrap, with 5 or more seeds
    improved: int  # seeds on which the arm's loss is lower than the baseline's
    n: int
    seeds: tuple[int, ...]


def summarize(values: list[float]) -> Summary:
    import numpy as np

    array = np.asarray(values, dtype=np.float64)
    sd = float(array.std(ddof=1)) if len(array) > 1 else math.nan
    return Summary(float(array.mean()) if len(array) else math.nan, sd, len(array))


def paired_difference(
    arm: Mapping[int, float],
    baseline: Mapping[int, float],
    confidence: float = 0.95,
    bootstrap: int = 10000,
    bootstrap_min_seeds: int = 5,
    seed: int = 0,
) -> PairedDifference:
    """Differences per seed (paired: seed k of both arms saw the same data order)."""
    import numpy as np
    from scipy import stats

    seeds = tuple(sorted(set(arm) & set(baseline)))
    diffs = np.asarray([arm[s] - baseline[s] for s in seeds], dtype=np.float64)
    n = len(diffs)
    if n == 0:
        return PairedDifference(math.nan, math.nan, (math.nan, math.nan), None, 0, 0, seeds)
    mean = float(diffs.mean())
    improved = int((diffs < 0).sum())
    if n < 2:
        return PairedDifference(mean, math.nan, (math.nan, math.nan), None, improved, n, seeds)
    sd = float(diffs.std(ddof=1))
    half = float(stats.t.ppf(0.5 + confidence / 2, df=n - 1)) * sd / math.sqrt(n)
    boot: tuple[float, float] | None = None
    if bootstrap > 0 and n >= bootstrap_min_seeds:
        rng = np.random.default_rng(seed)
        means = diffs[rng.integers(0, n, size=(bootstrap, n))].mean(axis=1)
        alpha = (1 - confidence) / 2
        low, high = np.quantile(means, [alpha, 1 - alpha])
        boot = (float(low), float(high))
    return PairedDifference(mean, sd, (mean - half, mean + half), boot, improved, n, seeds)


def finite(value: float | None) -> float | None:
    """JSON has no NaN or infinity: undefined numbers are stored as null."""
    return None if value is None or not math.isfinite(value) else float(value)
