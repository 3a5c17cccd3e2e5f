"""Paired comparisons of arms across seeds: mean difference, t-interval, bootstrap, wins, the
exact sign-flip test with Holm's adjustment, the seeds a comparison needs (power), and the
split-half reliability of a profile measured on several token samples.

numpy and scipy are imported by the functions that compute (the pipeline's stages import
:func:`finite` from here, and ``geospec --help`` loads them without numpy).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


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


@dataclass(frozen=True)
class CrossedBootstrap:
    """The mean of a seeds x windows table of paired differences, its percentile interval and
    two-sided p-value under resampling of both (:func:`crossed_bootstrap`)."""

    mean: float
    ci: tuple[float, float]
    p: float
    seeds: int
    windows: int


def crossed_bootstrap(
    differences: Sequence[Sequence[float]],
    confidence: float = 0.95,
    resamples: int = 10000,
    seed: int = 0,
) -> CrossedBootstrap:
    """The paired difference of two arms over calibration seeds and eval windows: row k of
    ``differences`` is seed k's per-window differences, every seed scored on the same windows
    (so windows and seeds are crossed, not nested). Each resample draws seeds and windows with
    replacement, independently, and takes the mean of the table they select: the interval then
    holds both the seeds' spread (the allocation and calibration sample moving) and the text's
    (a few windows of one corpus). p is twice the share of resampled means on the far side of
    0 from the estimate (at least 1 / (resamples + 1) per side), at most 1."""
    import numpy as np

    table = np.asarray(differences, dtype=np.float64)
    if table.ndim != 2 or table.size == 0:
        raise ValueError(f"a seeds x windows table is needed, got shape {table.shape}")
    n, w = table.shape
    rng = np.random.default_rng(seed)
    rows = rng.integers(0, n, size=(resamples, n))
    columns = rng.integers(0, w, size=(resamples, w))
    # per resample: the mean over the chosen rows of each row's mean over the chosen columns
    picked = np.take_along_axis(table[rows], columns[:, None, :], axis=2)
    means = picked.mean(axis=(1, 2))
    alpha = (1 - confidence) / 2
    low, high = np.quantile(means, [alpha, 1 - alpha])
    below = (int((means <= 0).sum()) + 1) / (resamples + 1)
    above = (int((means >= 0).sum()) + 1) / (resamples + 1)
    return CrossedBootstrap(
        float(table.mean()), (float(low), float(high)), min(1.0, 2 * min(below, above)), n, w
    )


def finite(value: float | None) -> float | None:
    """JSON has no NaN or infinity: undefined numbers are stored as null."""
    return None if value is None or not math.isfinite(value) else float(value)


# ---------------------------------------------------------------------------------------------
# exact paired tests, power, and the reliability of a profile


#: A profile whose split-half reliability is below this is flagged (``report.min_reliability``).
MIN_RELIABILITY = 0.8
#: Up to this many paired seeds the sign-flip test enumerates every sign pattern (2^20, 8 MB);
#: beyond it the p-value is a Monte Carlo estimate from ``SIGN_FLIP_RESAMPLES`` random patterns.
EXACT_UP_TO = 20
SIGN_FLIP_RESAMPLES = 100_000


def spearman_interval(
    a: Sequence[float],
    b: Sequence[float],
    resamples: int = 2000,
    seed: int = 0,
    level: float = 0.95,
) -> dict[str, float | None] | None:
    """Spearman's rank correlation of ``a`` and ``b`` (paired, one value per layer) with its
    p-value and a percentile bootstrap interval at ``level``: layers are resampled with
    replacement, pairs kept together, ``resamples`` times (resamples in which either side is
    constant have no correlation and are left out). None when there are fewer than 3 layers or
    either side is constant. With few layers the interval is wide: that is the point of it."""
    if len(a) != len(b) or len(a) < 3 or len(set(a)) < 2 or len(set(b)) < 2:
        return None
    import numpy as np
    from scipy import stats

    rho, p = stats.spearmanr(a, b)
    x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    index = np.random.default_rng(seed).integers(0, len(x), size=(resamples, len(x)))
    rx = stats.rankdata(x[index], axis=1)
    ry = stats.rankdata(y[index], axis=1)
    rx -= rx.mean(axis=1, keepdims=True)
    ry -= ry.mean(axis=1, keepdims=True)
    scale = np.sqrt((rx * rx).sum(axis=1) * (ry * ry).sum(axis=1))
    valid = scale > 0
    rhos = (rx * ry).sum(axis=1)[valid] / scale[valid]
    tail = 100 * (1 - level) / 2
    low, high = (float(v) for v in np.percentile(rhos, [tail, 100 - tail]))
    return {
        "rho": finite(float(rho)),
        "p": finite(float(p)),
        "low": finite(low),
        "high": finite(high),
        "layers": len(x),
    }


def sign_flip_p(differences: Sequence[float], seed: int = 0) -> float | None:
    """Two-sided p-value of paired differences under the sign-flip (permutation) null.

    Under the null the arms are exchangeable within each seed, so each difference is as likely
    with either sign; p is the fraction of the 2^n sign patterns whose |sum| is at least the
    observed |sum| (the observed pattern counts). Exact for up to :data:`EXACT_UP_TO`
    differences; beyond, a seeded Monte Carlo estimate ``(k + 1) / (B + 1)``. None without data.
    """
    import numpy as np

    d = np.asarray(differences, dtype=np.float64)
    if len(d) == 0:
        return None
    observed = abs(float(d.sum()))
    tolerance = 1e-9 * float(np.abs(d).sum())  # sums equal up to rounding count as equal
    if len(d) <= EXACT_UP_TO:
        sums = np.zeros(1)
        for value in d:
            sums = np.concatenate([sums + value, sums - value])
        return float(np.count_nonzero(np.abs(sums) >= observed - tolerance)) / len(sums)
    rng = np.random.default_rng(seed)
    signs = rng.choice(np.array([-1.0, 1.0]), size=(SIGN_FLIP_RESAMPLES, len(d)))
    extreme = np.count_nonzero(np.abs(signs @ d) >= observed - tolerance)
    return float(extreme + 1) / (SIGN_FLIP_RESAMPLES + 1)


def smallest_sign_flip_p(n: int) -> float:
    """The smallest two-sided p-value the sign-flip test can give with ``n`` paired seeds,
    2 / 2^n (every difference of one sign): 5 seeds can never give less than 0.0625."""
    return 2.0 / 2.0**n if n > 0 else 1.0


#: The fewest paired seeds a report shows a t interval for: on one degree of freedom (2 seeds) the
#: interval is set by the normality assumption more than by the data (two near-equal differences
#: give a hair-thin interval that no test on 2 seeds could back).
MIN_INTERVAL_SEEDS = 3


def shows_interval(n: int) -> bool:
    """Whether a report prints the t interval of ``n`` paired seeds (:data:`MIN_INTERVAL_SEEDS`)."""
    return n >= MIN_INTERVAL_SEEDS


def shows_sign_flip(n: int, alpha: float) -> bool:
    """Whether a report prints the sign-flip p of ``n`` paired seeds: only where the test can reach
    ``alpha`` at all (a p of 1 from one seed reads as evidence of no difference, which one seed
    cannot give either)."""
    return smallest_sign_flip_p(n) <= alpha + 1e-12


def seeds_to_reach(alpha: float) -> int:
    """The fewest paired seeds with which the sign-flip test can reach p <= ``alpha`` at all."""
    return max(1, math.ceil(math.log2(2.0 / alpha) - 1e-12))


def holm(p_values: Mapping[str, float | None]) -> dict[str, float | None]:
    """Holm's step-down adjustment across the comparisons that have a p-value (None stays None):
    the i-th smallest of m becomes max over j <= i of min(1, (m - j + 1) p_(j))."""
    named = sorted(((p, name) for name, p in p_values.items() if p is not None))
    m = len(named)
    adjusted: dict[str, float | None] = dict.fromkeys(p_values)
    running = 0.0
    for rank, (p, name) in enumerate(named):
        running = max(running, min(1.0, (m - rank) * p))
        adjusted[name] = running
    return adjusted


def paired_t_power(n: int, sd: float, effect: float, alpha: float) -> float:
    """Power of the two-sided paired t-test at level ``alpha`` with ``n`` seeds to detect a mean
    difference ``effect`` when the paired differences have standard deviation ``sd``: the
    probability that |T| exceeds the critical value, T noncentral t with n - 1 degrees of freedom
    and noncentrality effect * sqrt(n) / sd."""
    from scipy import stats

    critical = float(stats.t.ppf(1 - alpha / 2, df=n - 1))
    shift = abs(effect) * math.sqrt(n) / sd
    return float(stats.nct.sf(critical, n - 1, shift) + stats.nct.cdf(-critical, n - 1, shift))


def seeds_needed(
    sd: float, effect: float, alpha: float, power: float = 0.8, most: int = 1_000_000
) -> int | None:
    """The fewest paired seeds (at least 2) with which the paired t-test detects ``effect`` with
    at least ``power`` (:func:`paired_t_power`), or None when the spread is unknown or more than
    ``most`` seeds would be needed. A spread of 0 needs 2 seeds."""
    if not math.isfinite(sd) or effect == 0:
        return None
    if sd == 0:
        return 2

    def enough(n: int) -> bool:
        return paired_t_power(n, sd, effect, alpha) >= power

    low, high = 1, 2  # power grows with n: double until enough, then bisect (low: not enough)
    while not enough(high):
        if high >= most:
            return None
        low, high = high, min(2 * high, most)
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (low, middle) if enough(middle) else (middle, high)
    return high


def split_half_reliability(replicates: Sequence[Sequence[float]]) -> float | None:
    """How reproducible a profile's shape is: Spearman's rank correlation, over layers, between
    the mean of the even-numbered replicates and the mean of the odd-numbered ones (1: both
    halves rank the layers alike). None with fewer than two replicates or two layers, or when a
    half is constant."""
    import numpy as np
    from scipy import stats

    values = np.asarray(replicates, dtype=np.float64)
    if values.ndim != 2 or values.shape[0] < 2 or values.shape[1] < 2:
        return None
    first, second = values[0::2].mean(axis=0), values[1::2].mean(axis=0)
    if np.ptp(first) == 0 or np.ptp(second) == 0:
        return None
    return float(stats.spearmanr(first, second).statistic)


def shown_against(value: float | None, threshold: float, sign: bool = False) -> str:
    """``value`` (a reliability) with two decimals, or more where two would put it on the other
    side of ``threshold`` than it is: 0.797 against 0.8 is "0.797", never "0.80 is below 0.8".
    "undefined" for None; ``sign`` writes a leading "+" on non-negative values."""
    if value is None:
        return "undefined"
    plus = "+" if sign else ""
    for digits in range(2, 17):
        text = f"{value:{plus}.{digits}f}"
        if (float(text) < threshold) == (value < threshold):
            return text
    return f"{value:{plus}}"


def standard_errors(replicates: Sequence[Sequence[float]]) -> list[float | None]:
    """Per layer, the standard error of the mean over replicates (sample sd / sqrt(R)); None
    per layer with a single replicate."""
    import numpy as np

    values = np.asarray(replicates, dtype=np.float64)
    if values.shape[0] < 2:
        return [None] * values.shape[1]
    return [float(v) for v in values.std(axis=0, ddof=1) / math.sqrt(values.shape[0])]


def comparison(
    losses: dict[int, float],
    other: dict[int, float],
    confidence: float,
    resolved: dict[str, Any],
) -> dict[str, Any] | None:
    """The paired comparison stored in results.json: ``losses - other`` over their shared
    seeds: mean, intervals, wins, and the exact sign-flip p-value with the smallest one this many
    seeds can give (``p_holm`` is filled in across the
    arms); None when no seed is shared."""
    diff = paired_difference(losses, other, confidence=confidence, bootstrap=resolved["bootstrap"])
    if diff.n == 0:
        return None
    return {
        "mean": diff.mean,
        "sd": finite(diff.sd),
        "ci95": [finite(diff.ci[0]), finite(diff.ci[1])],
        "bootstrap_ci95": list(diff.bootstrap_ci) if diff.bootstrap_ci else None,
        "improved": diff.improved,
        "n": diff.n,
        "p_exact": sign_flip_p([losses[s] - other[s] for s in diff.seeds]),
        "p_holm": None,
        "p_min": smallest_sign_flip_p(diff.n),
    }
