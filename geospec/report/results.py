"""The results of a run, collected from its training directories' own records.

Everything is rebuilt from the run directory's artifacts, so ``geospec report RUN_DIR`` works on
any finished (or partly finished) run.

results.json::

    {"name": ..., "baseline": "uniform", "confidence": 0.95,
     "arms": {"<arm>": {"schedule": {...}, "widths": [...], "params": N, "ffn_params": N,
                        "val_loss": {"seeds": {"<seed>": loss}, "mean": m, "sd": s},
                        "vs_uniform": {"mean": d, "ci95": [lo, hi],
                                       "bootstrap_ci95": [lo, hi] | null,
                                       "improved": k, "n": n} | null}},
     "equal_params": bool,
     "checks": {"same_data_and_validation": bool | null, "same_training": ...,
                "same_shape_apart_from_widths": ..., "seeds_paired": ...},
     "profiles": {"topology/hyperbolic": [...], ...}}

``vs_uniform`` compares with the spec's baseline arm (``report.baseline``, "uniform" by default),
paired by seed; ``ci95`` holds the interval at ``confidence`` (0.95 unless the spec says otherwise).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from geospec.engine.model_size import Shape, count_params, total_ffn_params
from geospec.engine.run_files import CONFIG_FILE, METRICS_FILE, RESULT_FILE
from geospec.errors import UsageError
from geospec.pipeline.run_dir import (
    PROFILES_FILE,
    RUN_FILE,
    WIDTHS_FILE,
    arm_seed_dir,
    read_json,
)
from geospec.report.stats import finite, paired_difference, summarize


@dataclass(frozen=True)
class SeedRun:
    seed: int
    directory: Path
    final_val_loss: float | None
    curve: list[tuple[int, float]]  # (step, validation loss)
    config: dict[str, Any] | None
    fingerprint: (
        dict[str, Any] | None
    )  # what the run was trained on (geospec.engine.train.fingerprint)


def read_seed_run(directory: Path, seed: int) -> SeedRun:
    result = read_json(directory / RESULT_FILE)
    config = read_json(directory / CONFIG_FILE)
    curve: list[tuple[int, float]] = []
    metrics = directory / METRICS_FILE
    if metrics.exists():
        for line in metrics.read_text().splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut by a crash; the rest of the file is still good
            if isinstance(row, dict) and row.get("val_loss") is not None:
                curve.append((int(row["step"]), float(row["val_loss"])))
    loss = float(result["final_val_loss"]) if result else None
    fingerprint = result.get("fingerprint") if result else None
    return SeedRun(seed, directory, loss, curve, config, fingerprint)


def _params(config: dict[str, Any]) -> tuple[int, int]:
    widths = config["ffn_widths"]
    ffn = total_ffn_params(config["d_model"], widths, config["activation"], config["bias"])
    return count_params(Shape.of(config), widths), ffn


def build_results(run_dir: Path) -> dict[str, Any]:
    """Collect every arm's widths, parameter count and per-seed losses; compare with baseline."""
    resolved = read_json(run_dir / RUN_FILE)
    if resolved is None:
        raise UsageError(
            f"{run_dir}: not a geospec run directory (no run.json); run the spec first"
        )
    widths_file = read_json(run_dir / WIDTHS_FILE) or {"arms": {}}
    profiles = (read_json(run_dir / PROFILES_FILE) or {}).get("profiles", {})
    baseline = resolved["baseline"]
    confidence = resolved["confidence"]
    arms: dict[str, Any] = {}
    runs: dict[str, list[SeedRun]] = {}
    for arm in resolved["arms"]:
        name = arm["name"]
        seed_runs = [
            read_seed_run(arm_seed_dir(run_dir, name, seed), seed) for seed in resolved["seeds"]
        ]
        runs[name] = seed_runs
        losses = {r.seed: r.final_val_loss for r in seed_runs if r.final_val_loss is not None}
        summary = summarize(list(losses.values()))
        config = next((r.config for r in seed_runs if r.config), None)
        params, ffn_params = _params(config) if config else (None, None)
        arms[name] = {
            "schedule": arm["schedule"],
            "widths": widths_file["arms"].get(name, {}).get("widths"),
            "params": params,
            "ffn_params": ffn_params,
            "val_loss": {
                "seeds": {str(seed): loss for seed, loss in losses.items()},
                "mean": finite(summary.mean),
                "sd": finite(summary.sd),
            },
            "vs_uniform": None,
        }
    base_losses = {
        int(s): v for s, v in arms.get(baseline, {}).get("val_loss", {}).get("seeds", {}).items()
    }
    for name, entry in arms.items():
        if name == baseline or not base_losses:
            continue
        losses = {int(s): v for s, v in entry["val_loss"]["seeds"].items()}
        diff = paired_difference(
            losses, base_losses, confidence=confidence, bootstrap=resolved["bootstrap"]
        )
        if diff.n == 0:
            continue
        entry["vs_uniform"] = {
            "mean": diff.mean,
            "sd": finite(diff.sd),
            "ci95": [finite(diff.ci[0]), finite(diff.ci[1])],
            "bootstrap_ci95": list(diff.bootstrap_ci) if diff.bootstrap_ci else None,
            "improved": diff.improved,
            "n": diff.n,
        }
    counts = {a["params"] for a in arms.values() if a["params"] is not None}
    return {
        "name": resolved["name"],
        "baseline": baseline,
        "confidence": confidence,
        "equal_params": len(counts) <= 1,
        "checks": comparison_checks(runs),
        "arms": arms,
        "profiles": profiles,
        "curves": {
            name: {str(r.seed): r.curve for r in seed_runs} for name, seed_runs in runs.items()
        },
    }


#: What makes the comparison fair, each checked on the finished runs' own records (None when
#: no run recorded a fingerprint). The labels are what report.md prints.
CHECKS = {
    "same_data_and_validation": "same training data and validation tokens",
    "same_training": "same steps, batch and optimizer",
    "same_shape_apart_from_widths": "same model apart from FFN widths",
    "seeds_paired": "seed k of every arm trained with seed k (same data order)",
}


def comparison_checks(runs: dict[str, list[SeedRun]]) -> dict[str, bool | None]:
    records = [(r.seed, r.fingerprint) for rs in runs.values() for r in rs if r.fingerprint]
    if not records:
        return dict.fromkeys(CHECKS)

    def same(part: Any) -> bool:
        return len({json.dumps(part(fp), sort_keys=True) for _, fp in records}) == 1

    return {
        "same_data_and_validation": same(
            lambda fp: [fp["data"], fp.get("tokens"), fp["eval_tokens"]]
        ),
        "same_training": same(lambda fp: [fp["steps"], fp["batch_size"], fp["optimizer"]]),
        "same_shape_apart_from_widths": same(
            lambda fp: {k: v for k, v in fp["config"].items() if k != "ffn_widths"}
        ),
        "seeds_paired": all(fp["seed"] == seed for seed, fp in records),
    }
