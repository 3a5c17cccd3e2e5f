"""The report rebuilt from a run directory's artifacts (written here by hand)."""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from scipy import stats

from geospec.cli import cli
from geospec.errors import UsageError
from geospec.report.results import (
    build_results,
    exact_test_notes,
    profile_reliability,
    reliability_notes,
)
from geospec.report.write import write_report
from geospec.shapes.model_size import Shape, count_params
from geospec.stats import MIN_RELIABILITY, comparison
from geospec.storage.digests import sealed

LOSSES = {
    "uniform": {0: 4.80, 1: 4.83, 2: 4.79},
    "taper": {0: 4.78, 1: 4.80, 2: 4.80},
}
WIDTHS = {"uniform": [64, 64, 64, 64], "taper": [96, 80, 48, 32]}
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


def make_run(run_dir: Path) -> None:
    run_dir.mkdir()
    (run_dir / "run.json").write_text(
        json.dumps(
            {
                "name": "synthetic",
                "baseline": "uniform",
                "confidence": 0.95,
                "bootstrap": 1000,
                "arms": [{"name": a, "schedule": {"kind": a}} for a in LOSSES],
                "seeds": [0, 1, 2],
            }
        )
    )
    (run_dir / "widths.json").write_text(
        json.dumps(
            {"arms": {a: {"widths": w, "ffn_params": 0} for a, w in WIDTHS.items()}, "pending": []}
        )
    )
    (run_dir / "profiles.json").write_text(
        json.dumps(
            {"profiles": {"topology/hyperbolic": [4.0, 3.0, 2.0, 1.0], "gw/raw": [1, 2, 3, 4]}}
        )
    )
    for arm, losses in LOSSES.items():
        for seed, loss in losses.items():
            out = run_dir / "arms" / arm / f"seed-{seed}"
            out.mkdir(parents=True)
            (out / "result.json").write_text(json.dumps({"final_val_loss": loss}))
            (out / "config.json").write_text(json.dumps({**CONFIG, "ffn_widths": WIDTHS[arm]}))
            rows = [{"step": s, "val_loss": loss + 1 / s} for s in (10, 20, 30)]
            # a line cut short by a crash must not break the report
            (out / "metrics.jsonl").write_text(
                "\n".join(json.dumps(r) for r in rows) + '\n{"step": 4'
            )


def test_results_match_per_seed_metrics(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    make_run(run_dir)
    results = write_report(run_dir)
    on_disk = json.loads((run_dir / "results.json").read_text())
    assert on_disk == json.loads(json.dumps(results))
    taper = results["arms"]["taper"]
    values = list(LOSSES["taper"].values())
    assert taper["val_loss"]["mean"] == pytest.approx(np.mean(values))
    assert taper["val_loss"]["sd"] == pytest.approx(np.std(values, ddof=1))
    diffs = [LOSSES["taper"][s] - LOSSES["uniform"][s] for s in range(3)]
    assert taper["vs_uniform"]["mean"] == pytest.approx(np.mean(diffs))
    low, high = taper["vs_uniform"]["ci95"]
    assert low < np.mean(diffs) < high
    assert taper["vs_uniform"]["improved"] == 2 and taper["vs_uniform"]["n"] == 3
    assert results["arms"]["uniform"]["vs_uniform"] is None
    shape = Shape(4, 32, 4, 300, 16)
    assert taper["params"] == count_params(shape, WIDTHS["taper"])
    # gelu FFN with biases, per layer: up d x w + w, down w x d + d
    assert taper["ffn_params"] == sum(2 * 32 * w + w + 32 for w in WIDTHS["taper"])
    assert results["equal_params"] is True
    assert not any(note.startswith("Partial") for note in results["notes"])  # every run finished
    for name in ("profiles.png", "widths.png", "val_loss.png", "differences.png"):
        assert (run_dir / "plots" / name).stat().st_size > 1000
    report = (run_dir / "report.md").read_text()
    assert "| taper |" in report and "plots/val_loss.png" in report


def _fingerprint(arm: str, seed: int) -> dict[str, object]:
    """What geospec.engine.train.fingerprint records for one run of a fair study."""
    return {
        "config": {**CONFIG, "ffn_widths": WIDTHS[arm]},
        "data": "abc",
        "seed": seed,
        "steps": 100,
        "batch_size": 8,
        "optimizer": [3e-3, 0.1, 5, 0.1, [0.9, 0.95], 1e-8, 1.0],
        "eval_tokens": None,
    }


def _stamp(run_dir: Path, arm: str, seed: int, fingerprint: dict[str, object]) -> None:
    path = run_dir / "arms" / arm / f"seed-{seed}" / "result.json"
    loss = LOSSES[arm][seed]
    path.write_text(json.dumps({"final_val_loss": loss, "fingerprint": fingerprint}))


def test_checks_read_every_runs_fingerprint(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    make_run(run_dir)
    assert set(write_report(run_dir, plots=False)["checks"].values()) == {
        None
    }  # no run recorded one

    def record(arm: str, directory_seed: int, **changes: object) -> None:
        _stamp(run_dir, arm, directory_seed, {**_fingerprint(arm, directory_seed), **changes})

    for arm in LOSSES:
        for seed in range(3):
            record(arm, seed)
    checks = write_report(run_dir, plots=False)["checks"]
    assert checks == dict.fromkeys(checks, True)  # widths may differ: they are the experiment
    assert "✗" not in (run_dir / "report.md").read_text()

    record("taper", 1, eval_tokens=4096)  # validated on other tokens
    record("taper", 2, seed=0)  # seed-2 directory trained with seed 0: not paired
    record("uniform", 0, steps=99)
    checks = write_report(run_dir, plots=False)["checks"]
    assert checks == {
        "seeds_share_widths": True,
        "same_data_and_validation": False,
        "same_training": False,
        "same_shape_apart_from_widths": True,
        "seeds_paired": False,
    }
    assert (run_dir / "report.md").read_text().count("not so") == 3


TAPER = {**CONFIG, "ffn_widths": WIDTHS["taper"]}
UNFAIR: dict[str, tuple[dict[str, object], str | None]] = {
    # one run recorded differently -> the one check that must fail (None: none may)
    "data": ({"data": "other"}, "same_data_and_validation"),
    "eval_tokens": ({"eval_tokens": 4096}, "same_data_and_validation"),
    "steps": ({"steps": 99}, "same_training"),
    "batch_size": ({"batch_size": 16}, "same_training"),
    "optimizer": ({"optimizer": [1e-3, 0.1, 5, 0.1, [0.9, 0.95], 1e-8, 1.0]}, "same_training"),
    "d_model": ({"config": {**TAPER, "d_model": 64}}, "same_shape_apart_from_widths"),
    "activation": ({"config": {**TAPER, "activation": "swiglu"}}, "same_shape_apart_from_widths"),
    # one seed of an arm trained with other widths than its other seeds
    "widths": ({"config": {**TAPER, "ffn_widths": [80, 80, 64, 32]}}, "seeds_share_widths"),
    "seed": ({"seed": 2}, "seeds_paired"),
    "tokens": ({"tokens": 123_456}, "same_data_and_validation"),  # another training budget
}


@pytest.mark.parametrize("change", list(UNFAIR))
def test_each_fairness_check_fails_alone(tmp_path: Path, change: str) -> None:
    run_dir = tmp_path / "run"
    make_run(run_dir)
    for arm in LOSSES:
        for seed in range(3):
            _stamp(run_dir, arm, seed, _fingerprint(arm, seed))
    changes, failing = UNFAIR[change]
    _stamp(run_dir, "taper", 1, {**_fingerprint("taper", 1), **changes})
    checks = write_report(run_dir, plots=False)["checks"]
    assert checks == {name: name != failing for name in checks}
    assert (run_dir / "report.md").read_text().count("not so") == (failing is not None)


def test_unequal_parameter_counts_are_reported(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    make_run(run_dir)
    config = run_dir / "arms" / "taper" / "seed-0" / "config.json"
    config.write_text(json.dumps({**CONFIG, "ffn_widths": [96, 80, 48, 48]}))  # 16 too many
    results = write_report(run_dir, plots=False)
    shape = Shape(4, 32, 4, 300, 16)
    assert results["arms"]["taper"]["params"] == count_params(shape, [96, 80, 48, 48])
    assert results["equal_params"] is False
    assert "do not have equal parameter counts" in (run_dir / "report.md").read_text()


def _draw_argument() -> str:
    """scipy.stats.bootstrap's generator: ``rng`` from scipy 1.15 on, ``random_state`` before."""
    return "rng" if "rng" in inspect.signature(stats.bootstrap).parameters else "random_state"


@pytest.mark.parametrize("confidence", [0.8, 0.99])
def test_intervals_are_at_the_run_confidence(tmp_path: Path, confidence: float) -> None:
    """report.confidence reaches the t-interval and the bootstrap, checked against scipy."""
    run_dir = tmp_path / "run"
    make_run(run_dir)
    seeds = range(6)  # enough seeds for the bootstrap
    rng = np.random.default_rng(5)
    base = {s: 4.8 + 0.02 * rng.standard_normal() for s in seeds}
    taper = {s: base[s] - 0.01 + 0.01 * rng.standard_normal() for s in seeds}
    run = json.loads((run_dir / "run.json").read_text())
    run.update(confidence=confidence, seeds=list(seeds), bootstrap=4000)
    (run_dir / "run.json").write_text(json.dumps(run))
    for name, losses in (("uniform", base), ("taper", taper)):
        for seed, loss in losses.items():
            out = run_dir / "arms" / name / f"seed-{seed}"
            out.mkdir(parents=True, exist_ok=True)
            (out / "result.json").write_text(json.dumps({"final_val_loss": loss}))
            (out / "config.json").write_text(json.dumps({**CONFIG, "ffn_widths": WIDTHS[name]}))
    results = write_report(run_dir, plots=False)
    vs = results["arms"]["taper"]["vs_uniform"]
    arm, baseline = np.array(list(taper.values())), np.array(list(base.values()))
    t = stats.ttest_rel(arm, baseline).confidence_interval(confidence_level=confidence)
    assert results["confidence"] == confidence
    assert vs["ci95"] == pytest.approx([t.low, t.high], rel=1e-12)
    assert vs["sd"] == pytest.approx(float(np.std(arm - baseline, ddof=1)), rel=1e-12)
    assert vs["n"] == 6 and vs["improved"] == int(np.sum(arm < baseline))
    # scipy's percentile bootstrap on the generator the report seeds with 0
    boot = stats.bootstrap(
        (arm - baseline,),
        np.mean,
        n_resamples=4000,
        confidence_level=confidence,
        method="percentile",
        vectorized=True,
        **{_draw_argument(): np.random.default_rng(0)},
    ).confidence_interval
    assert vs["bootstrap_ci95"] == pytest.approx([boot.low, boot.high], rel=1e-12)
    assert f"{round(confidence * 100)}% CI" in (run_dir / "report.md").read_text()


def test_damaged_metrics_lines_and_unfinished_runs_are_left_out(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    make_run(run_dir)
    out = run_dir / "arms" / "taper" / "seed-0"
    lines = [
        b'{"step": 10, "val_loss": 5.0}',
        b'{"step": 1',  # cut by a crash
        b"\xff\xfe not text",  # not UTF-8
        b"[1, 2]",  # JSON, but not a row
        b'{"step": 15, "loss": 4.9}',  # a training row: no validation loss
        b'{"step": 20, "val_loss": 4.9}',
    ]
    (out / "metrics.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    (run_dir / "arms" / "taper" / "seed-2" / "result.json").unlink()  # not finished yet
    results = build_results(run_dir)
    assert results["curves"]["taper"]["0"] == [(10, 5.0), (20, 4.9)]
    taper = results["arms"]["taper"]
    assert taper["val_loss"]["seeds"] == {"0": LOSSES["taper"][0], "1": LOSSES["taper"][1]}
    assert taper["vs_uniform"]["n"] == 2
    planned = len(LOSSES) * 3
    assert results["notes"][0] == (
        f"Partial: {planned - 1} of {planned} planned runs have finished; not in these figures: "
        "taper seed 2. Each comparison pairs only the seeds both arms have."
    )
    for seed in (0, 1):
        (run_dir / "arms" / "uniform" / f"seed-{seed}" / "result.json").unlink()
    assert build_results(run_dir)["notes"][0].startswith(
        f"Partial: {planned - 3} of {planned} planned runs have finished; not in these figures: "
        "uniform seeds 0, 1; taper seed 2."
    )


def test_report_command(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    make_run(run_dir)
    result = CliRunner().invoke(cli, ["report", str(run_dir), "--no-plots"])
    assert result.exit_code == 0, result.output
    assert "taper" in result.output


def test_report_on_a_directory_that_is_not_a_run(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["report", str(tmp_path)])
    assert result.exit_code == 2
    assert "not a geospec run directory" in result.output


# -- notes: seeds too few for the exact test, profiles too noisy ------------------------------


def test_exact_test_notes_name_every_number_of_seeds_that_cannot_reach_the_level() -> None:
    """2 / 2^n is the smallest sign-flip p-value of n seeds: 1 for 1 seed, 0.25 for 3, 0.0625 for
    5; reaching 0.05 takes 6 seeds (2/64 <= 0.05 < 2/32)."""
    arms = {
        "one": {"vs_uniform": {"n": 1, "p_min": 1.0}, "vs_source": None},
        "three": {"vs_uniform": {"n": 3, "p_min": 0.25}, "vs_source": {"n": 5, "p_min": 0.0625}},
        "two": {"vs_uniform": {"n": 2, "p_min": 0.5}, "vs_source": None},
        "uniform": {"vs_uniform": None, "vs_source": None},
    }
    tail = (
        "can reach p ≤ 0.05; that takes at least 6 paired seeds; the tables leave its p cells "
        "empty."
    )
    assert exact_test_notes(arms, 0.05) == [
        f"With 1 paired seed the exact sign-flip test cannot give a p-value below 1 (2/2^1), so "
        f"no comparison on 1 seed {tail}",
        f"With 2 paired seeds the exact sign-flip test cannot give a p-value below 0.5 (2/2^2), "
        f"so no comparison on 2 seeds {tail}",
        f"With 3 paired seeds the exact sign-flip test cannot give a p-value below 0.25 (2/2^3), "
        f"so no comparison on 3 seeds {tail}",
        f"With 5 paired seeds the exact sign-flip test cannot give a p-value below 0.0625 "
        f"(2/2^5), so no comparison on 5 seeds {tail}",
    ]
    # at level 0.0625 five seeds are enough: p = 0.0625 reaches it
    assert [note.split(" paired")[0] for note in exact_test_notes(arms, 0.0625)] == [
        "With 1",
        "With 2",
        "With 3",
    ]


def test_a_comparison_needs_one_shared_seed_and_has_the_documented_keys() -> None:
    assert comparison({0: 1.0}, {1: 2.0}, 0.95, {"bootstrap": 0}) is None
    one = comparison({0: 1.0}, {0: 2.0}, 0.95, {"bootstrap": 0})
    assert one is not None and one["n"] == 1 and one["mean"] == -1.0
    assert set(one) == {
        "mean", "sd", "ci95", "bootstrap_ci95", "improved", "n", "p_exact", "p_holm", "p_min"
    }  # fmt: skip


def test_profile_reliability_and_the_notes_on_noisy_profiles() -> None:
    rng = np.random.default_rng(8)
    stable = (np.linspace(3.0, 1.0, 6) + rng.normal(0, 1e-3, size=(4, 6))).tolist()
    noisy = rng.normal(size=(4, 6)).tolist()
    at_threshold = [[0.0, 1.0, 2.0], [0.0, 1.0, 0.5]]  # Spearman of the halves: exactly 0.5
    flat = [[1.0, 1.0, 1.0], [2.0, 2.0, 2.0]]  # constant halves: no rank correlation
    replicates = {"a/b": stable, "c/d": noisy, "e/f": at_threshold, "g/h": flat}
    reliability = profile_reliability(replicates, 0.5)
    assert reliability is not None and reliability["threshold"] == 0.5
    profiles = reliability["profiles"]
    for name, values in replicates.items():
        array = np.asarray(values)
        halves = array[0::2].mean(axis=0), array[1::2].mean(axis=0)
        rho = None if name == "g/h" else float(stats.spearmanr(*halves).statistic)
        assert profiles[name]["replicates"] == len(values)
        expected_se = array.std(axis=0, ddof=1) / np.sqrt(len(values))
        assert profiles[name]["se"] == pytest.approx(list(expected_se), rel=1e-12)
        assert profiles[name]["split_half"] == (None if rho is None else pytest.approx(rho))
    below = {name: entry["below_threshold"] for name, entry in profiles.items()}
    noisy_rho = profiles["c/d"]["split_half"]
    assert below == {"a/b": False, "c/d": noisy_rho < 0.5, "e/f": False, "g/h": True}
    assert noisy_rho < 0.5  # this draw is noise
    notes = reliability_notes(reliability, {"geo": ["c/d"], "uniform": [], "both": ["c/d", "g/h"]})
    noise = "is below 0.5: its shape over the layers is largely sampling noise"
    assert notes == [
        f"Profile c/d: split-half reliability {noisy_rho:.2f} over 4 replicates {noise}; "
        "arms reading it: geo, both.",
        f"Profile g/h: split-half reliability undefined over 2 replicates {noise}; arms reading "
        "it: both.",
    ]
    assert reliability_notes(reliability, {})[1].endswith(f"{noise}.")  # no arm reads it
    assert profile_reliability({}, 0.5) is None and reliability_notes(None, {}) == []


# -- results.json from unusual run directories -------------------------------------------------


def _rewrite(path: Path, **changes: object) -> None:
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


def test_results_json_has_the_documented_keys(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    make_run(run_dir)
    results = build_results(run_dir)
    assert set(results) == {
        "name", "baseline", "confidence", "equal_params", "checks", "arms", "comparisons",
        "profiles", "notes", "curves",
    }  # fmt: skip
    assert results["comparisons"] == []  # run.json names no pairs (report.compare)
    for name, arm in results["arms"].items():
        assert set(arm) == {
            "schedule", "widths", "bounds", "params", "ffn_params", "val_loss", "vs_uniform",
            "vs_source",
        }  # fmt: skip
        assert arm["schedule"] == {"kind": name} and arm["vs_source"] is None
    assert results["profiles"] == {
        "topology/hyperbolic": [4.0, 3.0, 2.0, 1.0],
        "gw/raw": [1, 2, 3, 4],
    }


@pytest.mark.parametrize("run_json", [[1, 2], {"name": "x", "arms": []}])
def test_a_run_json_geospec_did_not_write_is_refused(tmp_path: Path, run_json: object) -> None:
    run_dir = tmp_path / "run"
    make_run(run_dir)
    (run_dir / "run.json").write_text(json.dumps(run_json))
    with pytest.raises(UsageError) as raised:
        build_results(run_dir)
    assert str(raised.value) == (
        f"{run_dir / 'run.json'}: does not hold what geospec writes; run the spec again "
        "(geospec run rewrites it)"
    )


def test_widths_come_from_what_the_models_were_trained_with(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    make_run(run_dir)
    for seed, widths in enumerate(([80, 80, 64, 32], [96, 80, 48, 32], [96, 80, 48, 32])):
        _stamp(
            run_dir,
            "taper",
            seed,
            {**_fingerprint("taper", seed), "config": {**TAPER, "ffn_widths": widths}},
        )
    (run_dir / "widths.json").unlink()  # the plan is gone; the records remain
    (run_dir / "profiles.json").unlink()
    results = build_results(run_dir)
    assert results["arms"]["taper"]["widths"] == [80, 80, 64, 32]  # the first seed's record
    assert results["arms"]["uniform"]["widths"] is None  # no record, no plan
    assert results["profiles"] == {}


def _plan(
    run_dir: Path, bounds: dict[str, list[int] | None], widths: dict[str, list[int]] = WIDTHS
) -> None:
    """widths.json as the solve stage writes it: each arm's widths and bounds, sealed."""
    arms = {a: {"widths": w, "ffn_params": 0, "bounds": bounds[a]} for a, w in widths.items()}
    (run_dir / "widths.json").write_text(json.dumps(sealed({"arms": arms, "pending": []})))


def test_layers_at_their_schedules_bounds_are_marked_in_the_report(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    make_run(run_dir)  # taper: 96 80 48 32
    _plan(run_dir, {"uniform": None, "taper": [32, 96]})
    results = write_report(run_dir)
    assert results["arms"]["taper"]["bounds"] == [32, 96]
    assert results["arms"]["uniform"]["bounds"] is None
    report = (run_dir / "report.md").read_text()
    marked = "- `taper`: 96 80 48 32 (layer 0 at the upper bound 96; layer 3 at the lower bound 32)"
    assert marked in report
    assert "- `uniform`: 64 64 64 64\n" in report
    assert "may have been set by the bound rather than by the profile" in report

    _plan(run_dir, {"uniform": None, "taper": [16, 128]})  # no layer at a bound: no marks
    write_report(run_dir)
    report = (run_dir / "report.md").read_text()
    assert "- `taper`: 96 80 48 32\n" in report and "set by the bound" not in report


def test_bounds_of_a_plan_the_models_were_not_trained_with_are_left_out(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    make_run(run_dir)
    for arm in LOSSES:
        for seed in range(3):
            _stamp(run_dir, arm, seed, _fingerprint(arm, seed))  # records of what was trained
    plan = {"uniform": [64, 64, 64, 64], "taper": [80, 80, 64, 32]}  # not what taper trained with
    _plan(run_dir, {"uniform": [32, 80], "taper": [32, 80]}, plan)
    results = build_results(run_dir)
    assert results["arms"]["taper"]["widths"] == WIDTHS["taper"]
    assert results["arms"]["taper"]["bounds"] is None
    assert results["arms"]["uniform"]["bounds"] == [32, 80]


@pytest.mark.parametrize(
    ("damage", "said"),
    [
        ("edited", "widths.json was changed after geospec wrote it"),
        ("cut", "widths.json is unreadable"),
        ("a list", "widths.json does not hold what geospec wrote"),
        ("no arms", "widths.json does not hold what geospec wrote"),
        ("arms a list", "widths.json does not hold what geospec wrote"),
        ("bounds without the widths", "arm 'taper': widths outside its own bounds [48, 96]"),
    ],
)
def test_a_damaged_plan_stops_the_report_with_one_line_naming_it(
    tmp_path: Path, damage: str, said: str
) -> None:
    """The report marks layers against widths.json's bounds: it never marks them against a plan
    that was edited, cut or is inconsistent with itself."""
    run_dir = tmp_path / "run"
    make_run(run_dir)
    path = run_dir / "widths.json"
    if damage == "bounds without the widths":  # sealed, but the bounds do not hold the widths
        _plan(run_dir, {"uniform": None, "taper": [48, 96]})
    else:
        _plan(run_dir, {"uniform": None, "taper": [32, 96]})
        data = json.loads(path.read_text())
        if damage == "edited":
            data["arms"]["taper"]["bounds"] = [48, 80]
            path.write_text(json.dumps(data))
        elif damage == "cut":
            path.write_text(path.read_text()[:40])
        elif damage == "no arms":  # unsealed, as one written before seals
            path.write_text(json.dumps({"pending": []}))
        elif damage == "arms a list":
            path.write_text(json.dumps({"arms": [WIDTHS["taper"]], "pending": []}))
        else:
            path.write_text("[]")
    with pytest.raises(UsageError) as raised:
        build_results(run_dir)
    assert str(raised.value).startswith(f"{path}: ") and said in str(raised.value)
    assert str(raised.value).endswith("run the spec again (its solve stage rewrites it)")
    result = CliRunner().invoke(cli, ["report", str(run_dir)])
    assert result.exit_code == 2 and said in result.output and "Traceback" not in result.output


def test_an_arm_without_configs_has_no_parameter_count(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    make_run(run_dir)
    for seed in range(3):
        (run_dir / "arms" / "taper" / f"seed-{seed}" / "config.json").unlink()
    taper = build_results(run_dir)["arms"]["taper"]
    assert taper["params"] is None and taper["ffn_params"] is None


def test_swiglu_ffn_parameters(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    make_run(run_dir)
    for arm in LOSSES:
        for seed in range(3):
            config = {**CONFIG, "activation": "swiglu", "ffn_widths": WIDTHS[arm]}
            (run_dir / "arms" / arm / f"seed-{seed}" / "config.json").write_text(json.dumps(config))
    # swiglu with biases, per layer: gate and up 2 x (d x w + w), down w x d + d
    taper = build_results(run_dir)["arms"]["taper"]
    assert taper["ffn_params"] == sum(3 * 32 * w + 2 * w + 32 for w in WIDTHS["taper"])


def test_a_baseline_that_is_no_arm_compares_nothing(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    make_run(run_dir)
    _rewrite(run_dir / "run.json", baseline="nope")
    results = build_results(run_dir)
    assert all(arm["vs_uniform"] is None for arm in results["arms"].values())


def test_a_derived_arm_without_seeds_in_common_with_its_source(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    make_run(run_dir)
    run = json.loads((run_dir / "run.json").read_text())
    run["arms"].append({"name": "sorted", "schedule": {"kind": "sorted", "of": "taper"}})
    (run_dir / "run.json").write_text(json.dumps(run))
    for seed in range(3):  # the taper's runs are not finished; the sorted arm's seed 0 is
        (run_dir / "arms" / "taper" / f"seed-{seed}" / "result.json").unlink()
    out = run_dir / "arms" / "sorted" / "seed-0"
    out.mkdir(parents=True)
    (out / "result.json").write_text(json.dumps({"final_val_loss": 4.7}))
    results = build_results(run_dir)
    assert results["arms"]["sorted"]["vs_source"] is None
    assert results["arms"]["sorted"]["vs_uniform"]["n"] == 1


@pytest.mark.parametrize("threshold", [None, 0.95])
def test_replicated_profiles_get_a_reliability_section(
    tmp_path: Path, threshold: float | None
) -> None:
    run_dir = tmp_path / "run"
    make_run(run_dir)
    noisy = np.random.default_rng(8).normal(size=(4, 4)).tolist()
    stable = (np.linspace(4.0, 1.0, 4) + np.linspace(0, 1e-3, 4)[:, None]).tolist()
    _rewrite(run_dir / "profiles.json", replicates={"gw/raw": noisy, "topology/hyperbolic": stable})
    if threshold is not None:
        _rewrite(run_dir / "run.json", min_reliability=threshold)
    run = json.loads((run_dir / "run.json").read_text())
    run["arms"][1]["schedule"] = {"kind": "geometric", "profile": "gw/raw"}
    (run_dir / "run.json").write_text(json.dumps(run))
    results = build_results(run_dir)
    expected = profile_reliability(
        {"gw/raw": noisy, "topology/hyperbolic": stable}, threshold or MIN_RELIABILITY
    )
    assert results["reliability"] == expected
    assert expected is not None and expected["threshold"] == (threshold or 0.8)
    notes = [n for n in results["notes"] if n.startswith("Profile")]
    assert notes == reliability_notes(expected, {"uniform": [], "taper": ["gw/raw"]})
    assert notes and notes[0].endswith("arms reading it: taper.")
    _rewrite(run_dir / "profiles.json", replicates={})
    assert "reliability" not in build_results(run_dir)


def _with_execution(run_dir: Path, arm: str, seed: int, threads: list[int]) -> None:
    path = run_dir / "arms" / arm / f"seed-{seed}" / "result.json"
    result = json.loads(path.read_text())
    result["execution"] = [
        {"device": "cpu", "threads": t, "processes": 1, "precision": "fp32", "compiled": False,
         "torch": "2.13.0+cpu"}
        for t in threads
    ]  # fmt: skip
    path.write_text(json.dumps(result))


def test_runs_computed_under_different_settings_get_a_note_naming_them(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    make_run(run_dir)
    for arm, losses in LOSSES.items():
        for seed in losses:
            _with_execution(run_dir, arm, seed, [1])
    same = write_report(run_dir, plots=False)
    assert not [n for n in same["notes"] if "settings" in n]  # one setting: nothing to say

    _with_execution(run_dir, "uniform", 0, [2])  # the reference, trained on 2 threads
    _with_execution(run_dir, "taper", 2, [1, 2])  # resumed on 2 threads
    notes = [n for n in write_report(run_dir, plots=False)["notes"] if "settings" in n]
    assert len(notes) == 1
    note = notes[0]
    assert "under 3 settings" in note
    assert "cpu, 1 thread, fp32, torch 2.13.0+cpu: 4 runs" in note  # the most common first
    assert "cpu, 2 threads, fp32, torch 2.13.0+cpu: 1 run (uniform seed 0)" in note
    assert "1 thread, fp32, torch 2.13.0+cpu then cpu, 2 threads" in note
    assert "(taper seed 2)" in note
    assert note in (run_dir / "report.md").read_text()
    # runs written before geospec recorded a setting say nothing about it
    (run_dir / "arms" / "uniform" / "seed-0" / "result.json").write_text(
        json.dumps({"final_val_loss": LOSSES["uniform"][0]})
    )
    notes = [n for n in write_report(run_dir, plots=False)["notes"] if "settings" in n]
    assert len(notes) == 1 and "under 2 settings" in notes[0] and "uniform seed 0" not in notes[0]


@pytest.mark.parametrize("n", [1, 2, 3, 5, 6])
def test_a_comparison_row_prints_only_what_its_seeds_can_back(n: int) -> None:
    """Two seeds whose differences nearly agree give a t interval on 1 degree of freedom that
    reads as precise, and no sign-flip p below 0.5: neither is printed; the interval comes
    from 3 seeds, the p-values from 6 (2/2^6 <= 0.05)."""
    from geospec.report.markdown import comparison_cells
    from geospec.report.results import interval_notes

    arm = {s: 4.0 - 0.15 - 0.001 * s for s in range(n)}
    baseline = dict.fromkeys(range(n), 4.0)
    vs = comparison(arm, baseline, 0.95, {"bootstrap": 0})
    assert vs is not None
    vs["p_holm"] = vs["p_exact"]
    mean, ci, wins, p, holm_p = comparison_cells(vs, 0.05)
    assert wins == f"{n}/{n}" and float(mean) < 0
    assert (ci == "-") == (n < 3)
    assert (p == "-") == (holm_p == "-") == (n < 6)
    if n == 6:
        assert float(p) == pytest.approx(2 / 2**6, rel=0.01)  # printed to 3 digits
    notes = interval_notes({"a": {"vs_uniform": vs, "vs_source": None}})
    assert len(notes) == (1 if n < 3 else 0)
