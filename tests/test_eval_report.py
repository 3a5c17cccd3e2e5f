"""Downstream scores in the report without lm-eval: per-seed scores in the runs' eval.json files
become per-arm means and paired comparisons equal to scipy's; files that cannot be trusted are
left out; lm-eval's result shape is read into metrics; [eval] is checked when a spec is read."""

from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path
from typing import Any

import pytest
from scipy import stats

from geospec.errors import SpecError
from geospec.evaluate.harness import scores_of
from geospec.report.evaluation import eval_results
from geospec.report.markdown import eval_rows
from geospec.rundir.layout import EVAL_FILE, RUN_KEY_FILE, arm_seed_dir
from geospec.spec.loading import validate_spec
from geospec.storage.atomic import atomic_write_json
from geospec.storage.digests import sealed
from geospec.testing import minimal_spec

TASK = "lastword"
SEEDS = (0, 1, 2, 3, 4)
#: arm -> per-seed (accuracy, perplexity)
SCORES = {
    "uniform": [(0.30, 40.0), (0.25, 42.0), (0.35, 39.5), (0.30, 41.0), (0.20, 45.0)],
    "wide": [(0.35, 38.0), (0.25, 43.0), (0.40, 39.0), (0.25, 40.0), (0.30, 41.5)],
    "narrow": [(0.10, 60.0), (0.15, 55.0), (0.20, 52.0), (0.10, 58.0), (0.05, 66.0)],
}


def write_run(run_dir: Path) -> dict[str, Any]:
    """Training directories holding a run key and sealed scores; returns run.json's content."""
    for arm, per_seed in SCORES.items():
        for seed, (accuracy, perplexity) in zip(SEEDS, per_seed, strict=True):
            out = arm_seed_dir(run_dir, arm, seed)
            atomic_write_json(out / RUN_KEY_FILE, {"key": f"{arm}-{seed}", "widths": []})
            task = {
                "metrics": {"perplexity": perplexity, "acc": accuracy},
                "higher_is_better": {"perplexity": False, "acc": True},
                "samples": 50,
            }
            record = {"key": "k", "run_key": f"{arm}-{seed}", "lm_eval": "0.4.13"}
            atomic_write_json(out / EVAL_FILE, sealed(record | {"tasks": {TASK: task}}))
    return {
        "baseline": "uniform",
        "bootstrap": 1000,
        "arms": [{"name": arm} for arm in SCORES],
        "seeds": list(SEEDS),
        "eval": {"tasks": [TASK]},
    }


def sign_flip_p(differences: list[float]) -> float:
    sums = [
        abs(sum(s * d for s, d in zip(signs, differences, strict=True)))
        for signs in itertools.product((1, -1), repeat=len(differences))
    ]
    return sum(s >= abs(sum(differences)) - 1e-12 for s in sums) / len(sums)


def test_every_metric_is_compared_with_the_baseline_as_scipy_does(tmp_path: Path) -> None:
    resolved = write_run(tmp_path)
    per_arm, evaluated = eval_results(tmp_path, resolved, 0.95)
    assert evaluated == {
        "tasks": [TASK],
        "metrics": [f"{TASK}/acc", f"{TASK}/perplexity"],
        "lm_eval": ["0.4.13"],
        "samples": {TASK: 50},
    }
    p_values = {}
    for index, metric in enumerate(("acc", "perplexity")):
        label = f"{TASK}/{metric}"
        base = [scores[index] for scores in SCORES["uniform"]]
        for arm in ("wide", "narrow"):
            values = [scores[index] for scores in SCORES[arm]]
            differences = [a - b for a, b in zip(values, base, strict=True)]
            entry = per_arm[arm][label]
            assert entry["mean"] == pytest.approx(stats.tmean(values))
            assert entry["sd"] == pytest.approx(stats.tstd(values))
            assert entry["higher_is_better"] is (metric == "acc")
            vs = entry["vs_uniform"]
            mean, sem = stats.tmean(differences), stats.sem(differences)
            assert vs["mean"] == pytest.approx(mean)
            assert vs["ci95"] == pytest.approx(list(stats.t.interval(0.95, 4, mean, sem)))
            assert vs["p_exact"] == pytest.approx(sign_flip_p(differences))
            better = [d > 0 if metric == "acc" else d < 0 for d in differences]
            assert vs["improved"] == sum(better)
            p_values[arm] = vs["p_exact"]
        smaller, larger = sorted(p_values.values())  # Holm across the two arms, per metric
        holm = sorted(per_arm[arm][label]["vs_uniform"]["p_holm"] for arm in ("wide", "narrow"))
        assert holm == pytest.approx([min(1, 2 * smaller), max(min(1, 2 * smaller), larger)])
        assert per_arm["uniform"][label]["vs_uniform"] is None
    rows = eval_rows({"arms": {a: {"eval": e} for a, e in per_arm.items()}, "eval": evaluated})
    assert [row[:2] for row in rows[:3]] == [
        [f"{TASK}/acc ↑", "uniform"],
        [f"{TASK}/acc ↑", "wide"],
        [f"{TASK}/acc ↑", "narrow"],
    ]
    # seeds better than the baseline: lower perplexity on 4 of 5 (wide), on none (narrow)
    assert [rows[4][6], rows[5][6]] == ["4/5", "0/5"]


def test_scores_that_cannot_be_trusted_are_left_out(tmp_path: Path) -> None:
    resolved = write_run(tmp_path)
    edited = arm_seed_dir(tmp_path, "wide", 0) / EVAL_FILE
    record = json.loads(edited.read_text())
    record["tasks"][TASK]["metrics"]["acc"] = 0.99  # behind geospec's back: the seal breaks
    edited.write_text(json.dumps(record))
    retrained = arm_seed_dir(tmp_path, "wide", 1)  # trained again since it was scored
    atomic_write_json(retrained / RUN_KEY_FILE, {"key": "new", "widths": []})
    (arm_seed_dir(tmp_path, "wide", 2) / EVAL_FILE).write_text("{")
    per_arm, _ = eval_results(tmp_path, resolved, 0.95)
    entry = per_arm["wide"][f"{TASK}/acc"]
    assert entry["seeds"] == {"3": 0.25, "4": 0.30}
    assert entry["vs_uniform"]["n"] == 2


def test_lm_evals_result_shape_is_read_into_metrics() -> None:
    output = {
        "results": {
            "arc_easy": {
                "alias": "arc_easy",
                "acc,none": 0.5,
                "acc_stderr,none": "N/A",
                "acc_norm,none": float("nan"),
                "sample_len": 10,
            },
            "gsm8k": {"exact_match,strict-match": 0.25, "exact_match_stderr,strict-match": 0.1},
        },
        "higher_is_better": {"arc_easy": {"acc": True, "acc_norm": True}, "gsm8k": {}},
        "n-samples": {"arc_easy": {"original": 2376, "effective": 10}},
    }
    assert scores_of(output) == {
        "arc_easy": {
            "metrics": {"acc": 0.5, "acc_norm": None},
            "higher_is_better": {"acc": True, "acc_norm": True},
            "samples": 10,
        },
        "gsm8k": {
            "metrics": {"exact_match,strict-match": 0.25},
            "higher_is_better": {"exact_match,strict-match": None},
            "samples": None,
        },
    }


@pytest.mark.parametrize(
    "change, message",
    [
        ({"eval": {"tasks": []}}, "eval.tasks: List should have at least 1 item"),
        ({"eval": {"tasks": ["a"], "limit": 1.5}}, "a fraction must be below 1"),
        ({"eval": {"tasks": ["a", "a"]}}, "tasks must be unique"),
        ({"eval": {"tasks": ["a"]}, "probe_only": True}, "a probe_only spec trains no arm"),
        ({"eval": {"tasks": ["a"]}, "model": {"norm": "rmsnorm"}}, "cannot be exported"),
    ],
)
def test_eval_sections_that_cannot_work_are_refused(change: dict[str, Any], message: str) -> None:
    spec = minimal_spec()
    for key, value in change.items():
        spec[key] = spec[key] | value if isinstance(value, dict) and key in spec else value
    with pytest.raises(SpecError, match=message):
        validate_spec(spec)


def test_the_exportable_models_are_exactly_those_export_can_write() -> None:
    """validate's check agrees with geospec.engine.export.family on every architecture."""
    from geospec.engine.export import family
    from geospec.engine.model import GPTConfig
    from geospec.errors import UsageError

    choices = itertools.product(("learned", "rope"), ("layernorm", "rmsnorm"), ("gelu", "swiglu"))
    for (positions, norm, activation), kv in itertools.product(choices, (None, 2, 4)):
        model = {"positions": positions, "norm": norm, "activation": activation}
        spec = minimal_spec(eval={"tasks": ["a"]})
        spec["model"] |= model | {"n_heads": 4} | ({"n_kv_heads": kv} if kv else {})
        try:
            validate_spec(spec)
            refused = False
        except SpecError as error:
            assert "cannot be exported" in str(error)
            refused = True
        config = GPTConfig(**{**model, "n_layers": 2, "d_model": 32, "n_heads": 4,
                              "n_kv_heads": kv, "ffn_widths": [32, 32],
                              "vocab_size": 8, "seq_len": 8})  # fmt: skip
        try:
            family(config)
            exportable = True
        except UsageError:
            exportable = False
        assert refused is not exportable, (model, kv)


def test_without_lm_eval_the_eval_stage_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from geospec.errors import UsageError
    from geospec.evaluate.harness import Harness
    from geospec.spec.sections import EvalSpec

    monkeypatch.setitem(sys.modules, "lm_eval", None)  # as if it were not installed
    with pytest.raises(UsageError, match=r"lm_eval is missing\); pip install \"geospec\[eval\]\""):
        Harness.load(EvalSpec(tasks=["geospec_austen_lastword"]), tmp_path)


def test_the_report_carries_the_scores_only_for_a_spec_that_evaluates(tmp_path: Path) -> None:
    """Through build_results (report.md, results.json), not eval_results alone."""
    from geospec.report.write import write_report

    evaluates = write_run(tmp_path)
    config = {
        "vocab_size": 97, "n_layers": 2, "d_model": 16, "n_heads": 2, "seq_len": 8,
        "activation": "gelu", "norm": "layernorm", "positions": "learned", "rope_theta": 1e4,
        "bias": True, "tie_embeddings": True, "dropout": 0.0, "ffn_widths": [32, 32],
    }  # fmt: skip
    for index, arm in enumerate(SCORES):
        for seed in SEEDS:
            out = arm_seed_dir(tmp_path, arm, seed)
            atomic_write_json(out / "result.json", {"final_val_loss": 4.0 + index / 100 + seed})
            atomic_write_json(out / "config.json", config)
    run = evaluates | {
        "name": "evaluated",
        "confidence": 0.95,
        "arms": [{"name": arm, "schedule": {"kind": "uniform"}} for arm in SCORES],
    }
    atomic_write_json(tmp_path / "run.json", run)
    per_arm, evaluated = eval_results(tmp_path, run, 0.95)
    results = write_report(tmp_path, plots=False)
    assert results["eval"] == evaluated
    for arm in SCORES:
        assert results["arms"][arm]["eval"] == per_arm[arm]
    assert "## Downstream evaluation" in (tmp_path / "report.md").read_text()

    atomic_write_json(tmp_path / "run.json", {k: v for k, v in run.items() if k != "eval"})
    results = write_report(tmp_path, plots=False)  # scores on disk, but the spec has no [eval]
    assert "eval" not in results and not any("eval" in arm for arm in results["arms"].values())
    assert "Downstream evaluation" not in (tmp_path / "report.md").read_text()
