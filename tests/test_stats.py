"""Paired differences against scipy: the paired t-test's interval and scipy's own bootstrap."""

from __future__ import annotations

import inspect
import math
import warnings

import numpy as np
import pytest
from scipy import stats

from geospec.stats import (
    finite,
    holm,
    paired_difference,
    paired_t_power,
    seeds_needed,
    seeds_to_reach,
    sign_flip_p,
    smallest_sign_flip_p,
    split_half_reliability,
    standard_errors,
    summarize,
)


def test_t_interval_matches_scipy_ttest_rel() -> None:
    rng = np.random.default_rng(0)
    base = rng.normal(3.4, 0.02, 5)
    arm = base + rng.normal(-0.02, 0.01, 5)
    diff = paired_difference(dict(enumerate(arm)), dict(enumerate(base)), bootstrap=0)
    reference = stats.ttest_rel(arm, base).confidence_interval(0.95)
    assert diff.ci == pytest.approx((reference.low, reference.high), rel=1e-12)
    assert diff.mean == pytest.approx(float(np.mean(arm - base)))
    assert diff.improved == int(np.sum(arm < base))
    assert diff.n == 5


@pytest.mark.parametrize("confidence", [0.5, 0.8, 0.9, 0.99])
def test_t_interval_is_at_the_configured_confidence(confidence: float) -> None:
    rng = np.random.default_rng(3)
    base = rng.normal(3.4, 0.02, 4)
    arm = base + rng.normal(0.01, 0.02, 4)
    diff = paired_difference(
        dict(enumerate(arm)), dict(enumerate(base)), confidence=confidence, bootstrap=0
    )
    reference = stats.ttest_rel(arm, base).confidence_interval(confidence_level=confidence)
    assert diff.ci == pytest.approx((reference.low, reference.high), rel=1e-12)
    assert diff.sd == pytest.approx(float(np.std(arm - base, ddof=1)), rel=1e-12)
    assert diff.bootstrap_ci is None  # bootstrap=0 turns it off


def _scipy_bootstrap(diffs: np.ndarray, resamples: int, confidence: float, seed: int) -> tuple:
    """scipy's percentile bootstrap of the mean, drawing from the same generator."""
    generator = np.random.default_rng(seed)
    draw = "rng" if "rng" in inspect.signature(stats.bootstrap).parameters else "random_state"
    result = stats.bootstrap(
        (diffs,),
        np.mean,
        n_resamples=resamples,
        confidence_level=confidence,
        method="percentile",
        vectorized=True,
        **{draw: generator},
    )
    return result.confidence_interval.low, result.confidence_interval.high


@pytest.mark.parametrize(("confidence", "seed", "n"), [(0.95, 0, 5), (0.8, 7, 6), (0.99, 3, 9)])
def test_bootstrap_equals_scipys_percentile_bootstrap(confidence: float, seed: int, n: int) -> None:
    rng = np.random.default_rng(seed + 100)
    base = rng.normal(3.0, 0.1, n)
    arm = base - 0.03 + rng.normal(0, 0.02, n)
    diff = paired_difference(
        dict(enumerate(arm)), dict(enumerate(base)), confidence, bootstrap=3000, seed=seed
    )
    reference = _scipy_bootstrap(arm - base, 3000, confidence, seed)
    assert diff.bootstrap_ci == pytest.approx(reference, rel=1e-12)


def test_bootstrap_needs_the_configured_number_of_seeds() -> None:
    base = {k: 3.0 + 0.1 * k for k in range(3)}
    arm = {k: v - 0.01 * (k + 1) for k, v in base.items()}
    assert paired_difference(arm, base, bootstrap=100, bootstrap_min_seeds=3).bootstrap_ci
    assert paired_difference(arm, base, bootstrap=100, bootstrap_min_seeds=4).bootstrap_ci is None


def test_only_shared_seeds_are_paired() -> None:
    diff = paired_difference({0: 1.0, 1: 2.0, 7: 9.0}, {0: 1.5, 1: 2.0, 2: 0.0})
    assert diff.seeds == (0, 1) and diff.mean == pytest.approx(-0.25)


def test_single_seed_has_no_interval() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "degrees of freedom <= 0" noise in the report
        diff = paired_difference({0: 1.0}, {0: 2.0})
    assert diff.mean == -1.0 and diff.improved == 1 and diff.n == 1 and diff.seeds == (0,)
    assert math.isnan(diff.sd) and all(math.isnan(end) for end in diff.ci)
    assert diff.bootstrap_ci is None


def test_two_seeds_have_a_t_interval() -> None:
    arm, base = np.array([3.40, 3.47]), np.array([3.45, 3.48])
    diff = paired_difference(dict(enumerate(arm)), dict(enumerate(base)), bootstrap=0)
    reference = stats.ttest_rel(arm, base).confidence_interval(confidence_level=0.95)
    assert diff.ci == pytest.approx((reference.low, reference.high), rel=1e-12)
    assert diff.sd == pytest.approx(float(np.std(arm - base, ddof=1)), rel=1e-12)


def test_the_default_bootstrap_draws_10000_resamples() -> None:
    rng = np.random.default_rng(11)  # 12 seeds: resampled means are nearly continuous
    base = rng.normal(3.0, 0.1, 12)
    arm = base - 0.02 + rng.normal(0, 0.02, 12)
    diff = paired_difference(dict(enumerate(arm)), dict(enumerate(base)))
    reference = _scipy_bootstrap(arm - base, 10000, 0.95, 0)
    assert diff.bootstrap_ci == pytest.approx(reference, rel=1e-12)
    assert diff.bootstrap_ci != pytest.approx(_scipy_bootstrap(arm - base, 10001, 0.95, 0))


def test_a_single_resample_is_its_own_interval() -> None:
    """bootstrap=1: the interval collapses onto the mean of the one resample, drawn by hand."""
    diffs = np.array([-0.03, 0.01, -0.02, -0.05, 0.0])
    base = {k: 3.0 for k in range(5)}
    arm = {k: 3.0 + d for k, d in enumerate(diffs)}
    diff = paired_difference(arm, base, bootstrap=1, seed=4)
    picks = np.random.default_rng(4).integers(0, 5, size=5)
    expected = float(np.mean([arm[int(i)] - base[int(i)] for i in picks]))
    assert diff.bootstrap_ci == pytest.approx((expected, expected), abs=1e-15)


def test_bootstrap_only_with_five_seeds_and_brackets_the_mean() -> None:
    rng = np.random.default_rng(1)
    base = dict(enumerate(rng.normal(3, 0.1, 6)))
    arm = {k: v - 0.05 + rng.normal(0, 0.01) for k, v in base.items()}
    diff = paired_difference(arm, base, bootstrap=2000)
    assert diff.bootstrap_ci is not None
    low, high = diff.bootstrap_ci
    assert low < diff.mean < high
    four = paired_difference({k: arm[k] for k in range(4)}, base, bootstrap=2000)
    assert four.bootstrap_ci is None


def test_summarize_uses_sample_sd() -> None:
    summary = summarize([1.0, 2.0, 3.0])
    assert summary.mean == 2.0 and summary.sd == pytest.approx(1.0) and summary.n == 3
    two = summarize([3.0, 4.0])
    assert two.sd == pytest.approx(float(np.std([3.0, 4.0], ddof=1))) and two.n == 2
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "mean of empty slice" noise in the report
        one, none = summarize([4.0]), summarize([])
    assert one.mean == 4.0 and math.isnan(one.sd) and one.n == 1
    assert math.isnan(none.mean) and math.isnan(none.sd) and none.n == 0


def test_no_shared_seed_gives_no_difference() -> None:
    diff = paired_difference({0: 1.0}, {1: 2.0})
    assert diff.n == 0 and diff.seeds == () and math.isnan(diff.mean) and diff.improved == 0
    assert math.isnan(diff.sd) and all(math.isnan(end) for end in diff.ci)
    assert diff.bootstrap_ci is None


def test_improved_counts_strictly_lower_losses() -> None:
    diff = paired_difference({0: 1.0, 1: 2.0, 2: 2.9}, {0: 1.0, 1: 2.5, 2: 3.0})
    assert diff.improved == 2  # a tie is not an improvement


def test_finite_stores_undefined_numbers_as_null() -> None:
    assert finite(math.nan) is None and finite(math.inf) is None and finite(None) is None
    assert finite(-0.25) == -0.25


# -- power and replicated profiles: edges the tests in test_exact_tests.py leave open ---------


@pytest.mark.parametrize("n", [2, 3, 5, 12])
def test_power_with_no_effect_is_the_tests_level(n: int) -> None:
    """The size of a two-sided test: both tails of the central t, exactly alpha."""
    assert paired_t_power(n, 0.02, 0.0, 0.05) == pytest.approx(0.05, rel=1e-9)


@pytest.mark.parametrize(
    ("sd", "effect", "alpha", "power"),
    [
        (0.02, 0.015, 0.05, 0.8),
        (0.5, 1.0, 0.05, 0.8),
        (0.03, 0.01, 0.05, 0.9),
        (0.01, 0.004, 0.01, 0.8),
    ],
)
def test_seeds_needed_is_the_first_number_of_seeds_with_enough_power(
    sd: float, effect: float, alpha: float, power: float
) -> None:
    first = next(n for n in range(2, 10_000) if paired_t_power(n, sd, effect, alpha) >= power)
    assert seeds_needed(sd, effect, alpha, power) == first


def test_split_half_reliability_edges() -> None:
    assert split_half_reliability([[1.0, 2.0], [1.1, 2.2]]) == pytest.approx(1.0)  # two layers
    # halves [0, 1, 2] and [0, 1, 0.5]: ranks differ by 0, 1, 1; Spearman 1 - 6 * 2 / (3 * 8)
    assert split_half_reliability([[0.0, 1.0, 2.0], [0.0, 1.0, 0.5]]) == pytest.approx(0.5)


def test_standard_errors_of_two_replicates() -> None:
    # sample sds sqrt(2) and sqrt(4.5), over sqrt(2)
    assert standard_errors([[1.0, 2.0], [3.0, 5.0]]) == pytest.approx([1.0, 1.5], rel=1e-12)


# -- the sign-flip test: the boundary of enumeration and the Monte Carlo estimate -------------


def test_twenty_differences_are_still_enumerated() -> None:
    """All 20 of one sign: exactly 2 of the 2^20 sign patterns are as extreme."""
    assert sign_flip_p([0.01 * (k + 1) for k in range(20)]) == 2 / 2**20


def test_beyond_twenty_the_p_value_is_the_seeded_monte_carlo_estimate() -> None:
    """(k + 1) / (B + 1) over B = 100,000 sign patterns drawn by numpy's generator seeded with 0,
    counted here in integers: equal magnitudes make ties with the observed sum common."""
    steps = np.array([1, -1, 1, 1, -1, 1, 1, 1, -1, 1, 1, -1, 1, 1, 1, -1, 1, 1, -1, 1, 1])
    signs = np.random.default_rng(0).choice(np.array([-1.0, 1.0]), size=(100_000, len(steps)))
    sums = (signs @ steps).round().astype(int)
    extreme = int(np.count_nonzero(np.abs(sums) >= abs(int(steps.sum()))))
    assert sign_flip_p((0.01 * steps).tolist()) == pytest.approx((extreme + 1) / 100_001)


@pytest.mark.parametrize("n", [3, 21])
def test_differences_that_are_all_zero_give_p_1(n: int) -> None:
    """Every sign pattern is as extreme as the observed zero sum (enumerated or drawn)."""
    assert sign_flip_p([0.0] * n) == 1.0


def test_smallest_p_seeds_to_reach_and_holms_cap() -> None:
    assert smallest_sign_flip_p(0) == 1.0 and smallest_sign_flip_p(1) == 1.0
    assert smallest_sign_flip_p(4) == 2 / 16
    assert seeds_to_reach(1.0) == 1  # one seed gives p = 1
    assert seeds_to_reach(0.05) == 6  # 2/32 > 0.05 >= 2/64
    # 2 x 0.6 = 1.2 is capped at 1, and the larger p cannot fall below it
    assert holm({"a": 0.6, "b": 0.7, "c": None}) == {"a": 1.0, "b": 1.0, "c": None}


def test_spearman_interval_matches_scipy() -> None:
    """rho and p are scipy's spearmanr; the percentile bootstrap over layers agrees with
    scipy.stats.bootstrap (paired, percentile) to sampling error; constant sides give None."""
    import numpy as np
    from scipy import stats

    from geospec.stats import spearman_interval

    rng = np.random.default_rng(3)
    a = rng.normal(size=30)
    b = a + rng.normal(scale=1.0, size=30)
    got = spearman_interval(list(a), list(b), resamples=4000, seed=1)
    assert got is not None
    rho, p = stats.spearmanr(a, b)
    assert got["rho"] == pytest.approx(rho) and got["p"] == pytest.approx(p)
    reference = stats.bootstrap(
        (a, b),
        lambda x, y: stats.spearmanr(x, y)[0],
        paired=True,
        vectorized=False,
        n_resamples=4000,
        method="percentile",
        random_state=np.random.default_rng(2),
    ).confidence_interval
    assert got["low"] == pytest.approx(reference.low, abs=0.05)
    assert got["high"] == pytest.approx(reference.high, abs=0.05)
    assert got["low"] < rho < got["high"] and got["layers"] == 30
    assert spearman_interval([1.0, 1.0, 1.0], [1.0, 2.0, 3.0]) is None
    assert spearman_interval([1.0, 2.0], [1.0, 2.0]) is None


def test_crossed_bootstrap_of_a_constant_difference_is_that_difference() -> None:
    from geospec.stats import crossed_bootstrap

    found = crossed_bootstrap([[-0.25] * 6] * 5, resamples=999)
    assert found.mean == pytest.approx(-0.25)
    assert found.ci == pytest.approx((-0.25, -0.25))
    assert found.p == pytest.approx(2 / 1000)  # every resample on one side: the floor
    assert (found.seeds, found.windows) == (5, 6)


@pytest.mark.parametrize("shape", [(8, 1), (1, 8)])
def test_crossed_bootstrap_with_one_window_or_seed_is_scipys_percentile_bootstrap(
    shape: tuple[int, int],
) -> None:
    """With a single window (or seed) only the other factor is resampled: the interval is the
    ordinary percentile bootstrap of the mean, as scipy computes it (within resampling noise)."""
    from geospec.stats import crossed_bootstrap

    values = np.random.default_rng(3).normal(0.1, 1.0, 8)
    found = crossed_bootstrap(values.reshape(shape), resamples=40000)
    reference = stats.bootstrap(
        (values,), np.mean, n_resamples=40000, method="percentile", random_state=1
    ).confidence_interval
    assert found.ci == pytest.approx((reference.low, reference.high), abs=0.03)


def test_crossed_bootstrap_covers_the_true_mean_where_seeds_alone_do_not() -> None:
    """Seeds and windows each shift the difference (windows the same for every seed): the
    crossed interval covers the true mean 0 about as often as it says (percentile intervals
    of 5 seeds run a little short), a bootstrap over seeds alone, blind to the windows' share,
    far less often."""
    from geospec.stats import crossed_bootstrap

    rng = np.random.default_rng(1)
    crossed = seeds_only = 0
    trials = 200
    for trial in range(trials):
        table = rng.normal(0, 1, (5, 1)) + rng.normal(0, 1, (1, 6)) + rng.normal(0, 0.5, (5, 6))
        low, high = crossed_bootstrap(table, resamples=2000, seed=trial).ci
        crossed += low <= 0 <= high
        means = table.mean(axis=1)[rng.integers(0, 5, (2000, 5))].mean(axis=1)
        low, high = np.quantile(means, [0.025, 0.975])
        seeds_only += low <= 0 <= high
    assert crossed / trials >= 0.85
    assert seeds_only / trials < crossed / trials - 0.15
