"""The exact sign-flip test (against enumeration of every sign pattern and scipy's permutation
test), Holm's adjustment (against the step-down procedure it summarises), the seeds a comparison
needs (checked by simulation) and the split-half reliability of a profile."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner
from scipy import stats

from geospec.cli import cli
from geospec.report.results import comparison_families, holm_floor_notes
from geospec.report.write import write_report
from geospec.stats import (
    EXACT_UP_TO,
    holm,
    paired_t_power,
    seeds_needed,
    seeds_to_reach,
    shown_against,
    sign_flip_p,
    smallest_sign_flip_p,
    split_half_reliability,
    standard_errors,
)


def enumerated_p(d: list[float]) -> float:
    """P(|sum of s_i d_i| >= |sum d_i|) over all 2^n sign patterns, one by one."""
    observed = abs(sum(d))
    patterns = list(itertools.product((1, -1), repeat=len(d)))
    extreme = sum(
        abs(sum(s * x for s, x in zip(signs, d, strict=True))) >= observed - 1e-12
        for signs in patterns
    )
    return extreme / len(patterns)


@pytest.mark.parametrize("n", range(1, 11))
def test_sign_flip_p_is_the_enumeration_of_every_sign_pattern(n: int) -> None:
    rng = np.random.default_rng(n)
    for shift in (0.0, -0.01, 0.03):
        d = list(rng.normal(shift, 0.02, n))
        assert sign_flip_p(d) == pytest.approx(enumerated_p(d), abs=1e-15)


def test_sign_flip_p_with_ties_and_zeros() -> None:
    for d in ([0.01, -0.01, 0.01, 0.01], [0.0, -0.02, -0.02, 0.0, -0.01], [0.0, 0.0, 0.0]):
        assert sign_flip_p(d) == pytest.approx(enumerated_p(d), abs=1e-15)


@pytest.mark.parametrize("n", [3, 6, 8])
def test_sign_flip_p_is_scipys_permutation_test(n: int) -> None:
    d = np.random.default_rng(10 + n).normal(-0.01, 0.02, n)
    reference = stats.permutation_test(
        (d,), np.mean, permutation_type="samples", n_resamples=np.inf, vectorized=True
    )
    assert sign_flip_p(list(d)) == pytest.approx(reference.pvalue, rel=1e-12)


@pytest.mark.parametrize("n", [1, 5, 6, 8])
def test_one_sided_data_give_the_smallest_p(n: int) -> None:
    d = [-0.01 * (k + 1) for k in range(n)]  # every arm seed better than the baseline
    assert sign_flip_p(d) == smallest_sign_flip_p(n) == 2 / 2**n
    assert smallest_sign_flip_p(5) == 0.0625  # 5 seeds can never give p < 0.05


def test_seeds_to_reach_a_level() -> None:
    assert seeds_to_reach(0.05) == 6 and seeds_to_reach(0.0625) == 5 and seeds_to_reach(0.01) == 8
    for alpha in (0.2, 0.1, 0.05, 0.01, 0.001):
        n = seeds_to_reach(alpha)
        assert smallest_sign_flip_p(n) <= alpha < smallest_sign_flip_p(n - 1)


def test_many_seeds_estimate_the_exact_p_by_monte_carlo() -> None:
    n = EXACT_UP_TO + 1
    d = np.random.default_rng(3).normal(0.004, 0.02, n)
    sums = np.zeros(1)
    for value in d:  # the exact distribution of the signed sum, 2^21 values
        sums = np.concatenate([sums + value, sums - value])
    exact = float(np.mean(np.abs(sums) >= abs(d.sum()) - 1e-12))
    estimate = sign_flip_p(list(d))
    assert estimate is not None and abs(estimate - exact) < 4 * math.sqrt(exact / 100_000) + 1e-5
    assert sign_flip_p([]) is None


def holm_rejects(p: dict[str, float], alpha: float) -> set[str]:
    """Holm's step-down procedure at level alpha: reject the smallest p while p_(i) <= alpha /
    (m - i + 1)."""
    ordered = sorted(p, key=p.__getitem__)
    rejected: set[str] = set()
    for i, name in enumerate(ordered):
        if p[name] > alpha / (len(p) - i):
            break
        rejected.add(name)
    return rejected


def test_holm_adjusted_p_is_the_smallest_level_at_which_holm_rejects() -> None:
    rng = np.random.default_rng(5)
    for _ in range(30):
        m = int(rng.integers(1, 7))
        p = {f"arm{k}": float(x) for k, x in enumerate(rng.uniform(0, 0.2, m))}
        adjusted = holm(p)
        for name, value in adjusted.items():
            assert value is not None
            assert name in holm_rejects(p, value * (1 + 1e-12))
            assert value >= 1.0 or name not in holm_rejects(p, value * (1 - 1e-9))


def test_holm_leaves_missing_p_values_out() -> None:
    adjusted = holm({"a": 0.01, "b": None, "c": 0.04})
    assert adjusted == {"a": 0.02, "b": None, "c": 0.04}


def simulated_power(n: int, sd: float, effect: float, alpha: float, trials: int) -> float:
    rng = np.random.default_rng(n)
    d = rng.normal(effect, sd, size=(trials, n))
    return float(np.mean(stats.ttest_1samp(d, 0.0, axis=1).pvalue < alpha))


@pytest.mark.parametrize(("sd", "effect", "alpha"), [(0.02, 0.015, 0.05), (0.01, 0.01, 0.01)])
def test_seeds_needed_give_80_percent_power_by_simulation(
    sd: float, effect: float, alpha: float
) -> None:
    trials = 40_000
    n = seeds_needed(sd, effect, alpha)
    assert n is not None and n > 2
    margin = 4 * math.sqrt(0.8 * 0.2 / trials)
    assert simulated_power(n, sd, effect, alpha, trials) >= 0.8 - margin
    assert simulated_power(n - 1, sd, effect, alpha, trials) < 0.8 + margin
    for k in (n - 1, n):  # the formula itself, against the simulation
        simulated = simulated_power(k, sd, effect, alpha, trials)
        assert paired_t_power(k, sd, effect, alpha) == pytest.approx(simulated, abs=margin)
    assert paired_t_power(n - 1, sd, effect, alpha) < 0.8 <= paired_t_power(n, sd, effect, alpha)


def test_seeds_needed_edge_cases() -> None:
    assert seeds_needed(0.0, 0.01, 0.05) == 2
    assert seeds_needed(math.nan, 0.01, 0.05) is None
    assert seeds_needed(1.0, 1e-6, 0.05) is None  # beyond a million seeds
    assert seeds_needed(0.02, -0.01, 0.05) == seeds_needed(0.02, 0.01, 0.05)


def spearman_closed_form(a: np.ndarray, b: np.ndarray) -> float:
    """1 - 6 sum d^2 / (n (n^2 - 1)), d the rank differences (no ties)."""
    ranks_a, ranks_b = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    n = len(a)
    return float(1 - 6 * np.sum((ranks_a - ranks_b) ** 2) / (n * (n**2 - 1)))


def test_split_half_reliability_is_spearman_between_the_halves() -> None:
    rng = np.random.default_rng(2)
    for replicates in (2, 3, 4, 7):
        values = rng.gamma(2.0, size=(replicates, 12))
        expected = spearman_closed_form(values[0::2].mean(axis=0), values[1::2].mean(axis=0))
        assert split_half_reliability(values.tolist()) == pytest.approx(expected, abs=1e-12)


def test_split_half_reliability_of_a_stable_and_of_a_noisy_profile() -> None:
    rng = np.random.default_rng(4)
    shape = np.linspace(3.0, 1.0, 10)
    stable = shape + rng.normal(0, 1e-3, size=(4, 10))
    assert split_half_reliability(stable.tolist()) == pytest.approx(1.0)
    noise = [split_half_reliability(rng.normal(size=(4, 10)).tolist()) for _ in range(200)]
    assert abs(float(np.mean([r for r in noise if r is not None]))) < 0.1
    assert split_half_reliability([[1.0, 2.0, 3.0]]) is None  # one replicate: no halves
    assert split_half_reliability([[1.0, 1.0], [2.0, 3.0]]) is None  # a constant half


@pytest.mark.parametrize(
    ("value", "threshold", "sign", "shown"),
    [
        (0.797, 0.8, False, "0.797"),  # "0.80" would read as not below 0.8
        (0.7999999, 0.8, False, "0.7999999"),
        (0.8, 0.8, False, "0.80"),
        (0.8004, 0.8, False, "0.80"),
        (0.8111, 0.8, False, "0.81"),
        (0.33, 0.8, False, "0.33"),
        (0.95, 0.8, True, "+0.95"),
        (-0.305, 0.8, True, "-0.30"),  # binary -0.30499...: rounds toward zero
        (0.897, 0.9, True, "+0.897"),
        (None, 0.8, False, "undefined"),
    ],
)
def test_a_reliability_is_shown_on_its_own_side_of_the_threshold(
    value: float | None, threshold: float, sign: bool, shown: str
) -> None:
    assert shown_against(value, threshold, sign) == shown


def test_a_shown_reliability_never_crosses_the_threshold() -> None:
    """The property the notes rely on, over values crowding the threshold from both sides."""
    rng = np.random.default_rng(11)
    for threshold in (0.8, 0.85, 0.9, 0.5):
        for value in threshold + rng.normal(0, 1e-3, size=500) * rng.choice([1, 1e-4], 500):
            text = shown_against(float(value), threshold)
            assert (float(text) < threshold) == (value < threshold), (value, threshold, text)
            assert len(text.split(".")[1]) >= 2


def test_standard_errors_per_layer() -> None:
    values = np.random.default_rng(6).normal(size=(5, 3))
    expected = values.std(axis=0, ddof=1) / math.sqrt(5)
    assert standard_errors(values.tolist()) == pytest.approx(list(expected), rel=1e-12)
    assert standard_errors([[1.0, 2.0]]) == [None, None]


# ---------------------------------------------------------------------------------------------
# in the report: results.json and report.md of a run written by hand

CONFIG = {
    "vocab_size": 300,
    "n_layers": 4,
    "d_model": 32,
    "n_heads": 4,
    "seq_len": 16,
    "activation": "gelu",
    "norm": "layernorm",
    "positions": "learned",
    "rope_theta": 1e4,
    "bias": True,
    "tie_embeddings": True,
    "dropout": 0.0,
}
SCHEDULES = {
    "uniform": {"kind": "uniform"},
    "gw": {"kind": "geometric", "profile": "gw/spherical"},
    "fitted-gw": {"kind": "fitted", "of": "gw"},
    "sorted-gw": {"kind": "sorted", "of": "gw"},
    "shift": {"kind": "geometric", "profile": "shift/spherical"},
    "gw-elsewhere": {"kind": "geometric", "profile": "gw/spherical", "profiles": "other.json"},
}


def write_run(
    run_dir: Path, losses: dict[str, list[float | None]], compare: list[list[str]] | None = None
) -> None:
    """A run directory: run.json and the result.json and config.json of every arm's seed whose
    loss is not None (None: that seed has not finished)."""
    seeds = list(range(len(losses["uniform"])))
    run_dir.mkdir()
    run = {
        "name": "synthetic",
        "baseline": "uniform",
        "confidence": 0.95,
        "bootstrap": 0,
        "arms": [{"name": arm, "schedule": SCHEDULES[arm]} for arm in losses],
        "seeds": seeds,
        **({"compare": compare} if compare is not None else {}),
    }
    (run_dir / "run.json").write_text(json.dumps(run))
    for arm, values in losses.items():
        for seed, loss in zip(seeds, values, strict=True):
            if loss is None:
                continue
            out = run_dir / "arms" / arm / f"seed-{seed}"
            out.mkdir(parents=True)
            (out / "result.json").write_text(json.dumps({"final_val_loss": loss}))
            (out / "config.json").write_text(json.dumps({**CONFIG, "ffn_widths": [64] * 4}))


def test_report_gives_exact_and_holm_p_values_and_compares_derived_arms(
    tmp_path: Path, geospec_registries: object
) -> None:
    rng = np.random.default_rng(8)
    base = rng.normal(4.5, 0.02, 5)
    losses = {
        "uniform": list(base),
        "gw": list(base - 0.05 + rng.normal(0, 0.01, 5)),
        "fitted-gw": list(base - 0.03 + rng.normal(0, 0.02, 5)),
        "sorted-gw": list(base + rng.normal(0, 0.02, 5)),
    }
    write_run(tmp_path / "run", losses)
    results = write_report(tmp_path / "run", plots=False)
    arms = results["arms"]
    p = {}
    for arm in ("gw", "fitted-gw", "sorted-gw"):
        d = [a - b for a, b in zip(losses[arm], losses["uniform"], strict=True)]
        vs = arms[arm]["vs_uniform"]
        assert vs["p_exact"] == pytest.approx(enumerated_p(d), abs=1e-15)
        assert vs["p_min"] == 0.0625
        p[arm] = vs["p_exact"]
    for arm in p:  # each Holm-adjusted p is where Holm's procedure starts to reject the arm
        adjusted = arms[arm]["vs_uniform"]["p_holm"]
        assert arm in holm_rejects(p, adjusted * (1 + 1e-12))
        assert adjusted >= 1.0 or arm not in holm_rejects(p, adjusted * (1 - 1e-9))
    assert arms["uniform"]["vs_uniform"] is None and arms["gw"]["vs_source"] is None
    for arm in ("fitted-gw", "sorted-gw"):
        d = [a - b for a, b in zip(losses[arm], losses["gw"], strict=True)]
        vs = arms[arm]["vs_source"]
        assert vs["arm"] == "gw" and vs["mean"] == pytest.approx(float(np.mean(d)))
        assert vs["p_exact"] == pytest.approx(enumerated_p(d), abs=1e-15)
    [note] = results["notes"]
    assert "5 paired seeds" in note and "below 0.0625" in note and "at least 6" in note
    report = (tmp_path / "run" / "report.md").read_text()
    assert "p (sign-flip)" in report and "p (Holm)" in report
    assert "| fitted-gw | gw |" in report and "| sorted-gw | gw |" in report
    assert f"- {note}" in report

    six = {arm: [*values, values[0] - 0.01] for arm, values in losses.items()}
    write_run(tmp_path / "six", six)
    # each comparison alone can reach 0.05 on 6 seeds (2/64), but Holm across the 3 arms, or the
    # 2 derived ones, cannot (3 x 2/64, 2 x 2/64 > 0.05): said, with the seeds that would do
    assert write_report(tmp_path / "six", plots=False)["notes"] == [
        "Holm's adjustment across the 3 comparisons with the baseline cannot give any of them a "
        "p-value below 0.09375 (3 x 0.03125), so none can pass it at 0.05; that takes at least 7 "
        "paired seeds.",
        "Holm's adjustment across the 2 comparisons of derived arms with their source cannot give "
        "any of them a p-value below 0.0625 (2 x 0.03125), so none can pass it at 0.05; that "
        "takes at least 7 paired seeds.",
    ]
    seven = {arm: [*values, values[1] - 0.01] for arm, values in six.items()}
    write_run(tmp_path / "seven", seven)
    assert write_report(tmp_path / "seven", plots=False)["notes"] == []


def test_report_compares_the_pairs_the_spec_names(
    tmp_path: Path, geospec_registries: object
) -> None:
    rng = np.random.default_rng(11)
    base = rng.normal(4.5, 0.02, 6)
    losses: dict[str, list[float | None]] = {
        "uniform": list(base),
        "gw": list(base - 0.04 + rng.normal(0, 0.01, 6)),
        "gw-elsewhere": list(base - 0.02 + rng.normal(0, 0.01, 6)),
        "shift": list(base - 0.01 + rng.normal(0, 0.02, 6)),
    }
    losses["shift"][4] = losses["shift"][5] = None  # two seeds of shift have not finished
    pairs = [["gw-elsewhere", "gw"], ["shift", "gw"], ["shift", "gw-elsewhere"]]
    # a pair naming an arm run.json lacks (an edited run.json; validation refuses it in a spec)
    write_run(tmp_path / "run", losses, compare=[*pairs, ["shift", "gone"]])
    results = write_report(tmp_path / "run", plots=False)
    chosen = results["comparisons"]
    assert [[c["arm"], c["against"]] for c in chosen] == pairs
    p = {}
    for c in chosen:
        shared = [
            (a, b)
            for a, b in zip(losses[c["arm"]], losses[c["against"]], strict=True)
            if a is not None and b is not None
        ]
        d = [a - b for a, b in shared]
        vs = c["difference"]
        assert vs["n"] == len(d) and vs["mean"] == pytest.approx(float(np.mean(d)))
        assert vs["improved"] == sum(x < 0 for x in d)
        assert vs["p_exact"] == pytest.approx(enumerated_p(d), abs=1e-15)
        low, high = stats.ttest_rel(*zip(*shared, strict=True)).confidence_interval(0.95)
        assert vs["ci95"] == pytest.approx([low, high])
        p[f"{c['arm']}-{c['against']}"] = vs["p_exact"]
    assert chosen[1]["difference"]["n"] == 4
    for c in chosen:  # Holm across the spec's pairs only, not the arms' comparisons
        key, adjusted = f"{c['arm']}-{c['against']}", c["difference"]["p_holm"]
        assert key in holm_rejects(p, adjusted * (1 + 1e-12))
        assert adjusted >= 1.0 or key not in holm_rejects(p, adjusted * (1 - 1e-9))
    report = (tmp_path / "run" / "report.md").read_text()
    assert "report.compare" in report
    for arm, against in pairs:
        assert f"| {arm} | {against} |" in report

    planned = CliRunner().invoke(
        cli, ["plan", str(tmp_path / "run"), "--effect", "0.01", "--json", "--holm"]
    )
    rows = {(r["arm"], r["against"]): r for r in json.loads(planned.output)["comparisons"]}
    for arm, against in pairs:  # three pairs: Holm's strictest step is alpha / 3
        assert rows[(arm, against)]["alpha"] == pytest.approx(0.05 / 3)

    del losses["gw-elsewhere"]  # a pair whose arms share no finished seed has no difference
    losses["shift"] = [None] * 6
    write_run(tmp_path / "pending", losses, compare=[["shift", "gw"]])
    [pending] = write_report(tmp_path / "pending", plots=False)["comparisons"]
    assert pending == {"arm": "shift", "against": "gw", "difference": None}
    assert "| shift | gw | - |" in (tmp_path / "pending" / "report.md").read_text()


def _family_at_best(
    family: str, best: dict[str, float]
) -> tuple[dict[str, Any], list[dict[str, Any]], str]:
    """arms, report.compare entries and the family's label in the notes for one family of
    comparisons whose p-values are ``best``, the other two families empty."""
    vs = {name: {"arm": "source", "n": 0, "p_min": p} for name, p in best.items()}
    if family == "baseline":
        return {n: {"vs_uniform": v, "vs_source": None} for n, v in vs.items()}, [], "with the"
    if family == "derived":
        return {n: {"vs_uniform": None, "vs_source": v} for n, v in vs.items()}, [], "of derived"
    chosen = [{"arm": name, "against": "source", "difference": v} for name, v in vs.items()]
    return {}, chosen, "of report.compare"


@pytest.mark.parametrize("family", ["baseline", "derived", "compare"])
@pytest.mark.parametrize("m", range(1, 11))
def test_a_holm_floor_note_exactly_when_holm_cannot_reject_what_one_test_could(
    m: int, family: str
) -> None:
    """Against Holm's procedure run on the best case: every p-value at the smallest one n seeds
    allow; in each family of comparisons, the other two empty."""
    # 0.0625 and 0.03125 are smallest p-values themselves (2/2^5, 2/2^6): the levels where a
    # comparison alone, or Holm's m x p, lands exactly on the level and still passes
    for alpha, n in itertools.product((0.05, 0.01, 0.0625, 0.03125), range(1, 13)):
        best = {str(i): smallest_sign_flip_p(n) for i in range(m)}
        arms, chosen, label = _family_at_best(family, best)
        notes = holm_floor_notes(comparison_families(arms, chosen, "uniform"), alpha)
        alone, together = best["0"] <= alpha, bool(holm_rejects(best, alpha))
        assert bool(notes) == (alone and not together), (m, n, alpha, notes)
        if notes:
            [note] = notes
            assert note.startswith(f"Holm's adjustment across the {m} comparisons {label}")
            # Holm's smallest adjusted p-value is m x the smallest p-value
            assert f"a p-value below {m * best['0']:.4g} ({m} x {best['0']:.4g})" in note
            enough = next(k for k in range(n, 40) if holm_rejects(
                {str(i): smallest_sign_flip_p(k) for i in range(m)}, alpha
            ))  # fmt: skip
            assert note.endswith(f"at least {enough} paired seeds."), (m, n, alpha)


def test_plan_gives_the_seeds_each_comparison_needs(
    tmp_path: Path, geospec_registries: object
) -> None:
    rng = np.random.default_rng(9)
    base = rng.normal(4.5, 0.02, 5)
    losses = {
        "uniform": list(base),
        "gw": list(base - 0.04 + rng.normal(0, 0.01, 5)),
        "fitted-gw": list(base - 0.03 + rng.normal(0, 0.02, 5)),
    }
    write_run(tmp_path / "run", losses)
    runner = CliRunner()
    for holm_flag, level in (([], 0.05), (["--holm"], 0.05 / 2)):
        result = runner.invoke(
            cli, ["plan", str(tmp_path / "run"), "--effect", "0.01", "--json", *holm_flag]
        )
        assert result.exit_code == 0, result.output
        planned = json.loads(result.output)
        assert planned["exact_minimum"] == seeds_to_reach(planned["exact_level"])
        rows = {(r["arm"], r["against"]): r for r in planned["comparisons"]}
        assert set(rows) == {("gw", "uniform"), ("fitted-gw", "uniform"), ("fitted-gw", "gw")}
        for (arm, against), row in rows.items():
            d = np.subtract(losses[arm], losses[against])
            sd = float(np.std(d, ddof=1))
            family_level = level if against == "uniform" else 0.05  # one derived arm: no split
            assert row["sd"] == pytest.approx(sd) and row["pilot_seeds"] == 5
            assert row["alpha"] == pytest.approx(family_level)
            assert row["seeds"] == seeds_needed(sd, 0.01, family_level)
            assert paired_t_power(row["seeds"], sd, 0.01, family_level) >= 0.8
    table = runner.invoke(cli, ["plan", str(tmp_path / "run"), "--effect", "0.01"])
    assert table.exit_code == 0 and "seeds needed" in table.output
    assert "at least 6 paired seeds" in table.output
    for bad in (["--effect", "0"], ["--effect", "-0.01"]):
        refused = runner.invoke(cli, ["plan", str(tmp_path / "run"), *bad])
        assert refused.exit_code == 2 and "--effect" in refused.output
    missing = runner.invoke(cli, ["plan", str(tmp_path / "nothing"), "--effect", "0.01"])
    assert missing.exit_code == 2 and "no such run directory" in missing.output
