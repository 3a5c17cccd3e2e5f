"""Paired differences against scipy's paired t-test and a resampling property."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from geospec.report.stats import paired_difference, summarize


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


def test_only_shared_seeds_are_paired() -> None:
    diff = paired_difference({0: 1.0, 1: 2.0, 7: 9.0}, {0: 1.5, 1: 2.0, 2: 0.0})
    assert diff.seeds == (0, 1) and diff.mean == pytest.approx(-0.25)


def test_single_seed_has_no_interval() -> None:
    diff = paired_difference({0: 1.0}, {0: 2.0})
    assert diff.mean == -1.0 and math.isnan(diff.ci[0]) and diff.improved == 1


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
    assert summary.mean == 2.0 and summary.sd == pytest.approx(1.0)
