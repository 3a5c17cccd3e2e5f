"""Downstream scores in the report: every arm's lm-eval metrics over its seeds, compared with
the baseline arm exactly as the validation loss is (paired by seed: mean difference, t-interval,
bootstrap, exact sign-flip p-value, Holm across the arms for each metric).

Scores are read from each training directory's ``eval.json`` (written by the eval stage) when it
is intact and belongs to the run that is there now (its ``run_key`` is the directory's).

results.json, when the spec has ``[eval]``::

    "eval": {"tasks": [...], "metrics": ["<task>/<metric>", ...], "lm_eval": ["0.4.13"],
             "samples": {"<task>": n}},
    "arms": {"<arm>": {..., "eval": {"<task>/<metric>": {
        "seeds": {"<seed>": value}, "mean": m, "sd": s, "higher_is_better": bool | null,
        "vs_uniform": {...as for the loss; "improved" counts the seeds on which the arm is better
                       in the metric's direction (null when lm-eval does not say)} | null}}}}
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from geospec.rundir.artifacts import json_problem
from geospec.rundir.layout import EVAL_FILE, arm_seed_dir
from geospec.rundir.records import stored_run_key
from geospec.stats import comparison, finite, holm, summarize


def read_scores(out: Path) -> dict[str, Any] | None:
    """The scores in ``out/eval.json``: None when there are none, the file is damaged or edited,
    or they belong to a run other than the one trained there now."""
    if json_problem(out / EVAL_FILE, "key", "run_key", "tasks") is not None:
        return None
    record = json.loads((out / EVAL_FILE).read_text())
    if record["run_key"] != stored_run_key(out) or not isinstance(record["tasks"], dict):
        return None
    return record


def eval_results(
    run_dir: Path, resolved: dict[str, Any], confidence: float
) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """Per arm, its metrics over the seeds with the paired comparison against the baseline; and
    what was evaluated (the tasks, every metric, lm-eval versions, examples per task)."""
    values: dict[str, dict[str, dict[int, float]]] = {}  # arm -> metric -> seed -> value
    higher: dict[str, bool | None] = {}
    versions: set[str] = set()
    samples: dict[str, Any] = {}
    for arm in resolved["arms"]:
        name = arm["name"]
        values[name] = {}
        for seed in resolved["seeds"]:
            record = read_scores(arm_seed_dir(run_dir, name, seed))
            if record is not None:
                add_scores(record, int(seed), values[name], higher, versions, samples)
    metrics = sorted(higher)
    baseline = values.get(resolved["baseline"], {})
    per_arm: dict[str, dict[str, Any]] = {}
    for name, by_metric in values.items():
        per_arm[name] = {}
        for label in metrics:
            seeds = by_metric.get(label, {})
            spread = summarize(list(seeds.values()))
            against = None
            if name != resolved["baseline"] and baseline.get(label):
                against = comparison(seeds, baseline[label], confidence, resolved)
            if against is not None:
                against["improved"] = improved_seeds(seeds, baseline[label], higher[label])
            per_arm[name][label] = {
                "seeds": {str(seed): value for seed, value in seeds.items()},
                "mean": finite(spread.mean),
                "sd": finite(spread.sd),
                "higher_is_better": higher[label],
                "vs_uniform": against,
            }
    for label in metrics:  # Holm across the arms compared with the baseline, per metric
        tests = {
            name: entry[label]["vs_uniform"]["p_exact"]
            for name, entry in per_arm.items()
            if entry[label]["vs_uniform"]
        }
        for name, adjusted in holm(tests).items():
            per_arm[name][label]["vs_uniform"]["p_holm"] = adjusted
    evaluated = {
        "tasks": list(resolved["eval"]["tasks"]),
        "metrics": metrics,
        "lm_eval": sorted(versions),
        "samples": samples,
    }
    return per_arm, evaluated


def improved_seeds(
    arm: dict[int, float], baseline: dict[int, float], higher_is_better: bool | None
) -> int | None:
    """Seeds on which the arm is better than the baseline in the metric's direction."""
    if higher_is_better is None:
        return None
    shared = set(arm) & set(baseline)
    if higher_is_better:
        return sum(arm[s] > baseline[s] for s in shared)
    return sum(arm[s] < baseline[s] for s in shared)


def add_scores(
    record: Mapping[str, Any],
    key: Any,
    into: dict[str, dict[Any, float]],
    higher: dict[str, bool | None],
    versions: set[str],
    samples: dict[str, Any],
) -> None:
    """One eval.json's scores into ``into`` (``task/metric`` -> ``key`` -> value), noting each
    metric's direction in ``higher``, lm-eval's version and the examples per task (a trained
    arm's seed and a pruned unit's are read the same way)."""
    versions.add(str(record.get("lm_eval")))
    for task, entry in record["tasks"].items():
        samples[task] = entry.get("samples")
        for metric, value in entry["metrics"].items():
            label = f"{task}/{metric}"
            higher.setdefault(label, entry["higher_is_better"].get(metric))
            if value is not None:
                into.setdefault(label, {})[key] = float(value)
