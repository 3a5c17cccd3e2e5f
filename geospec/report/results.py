"""The results of a run, collected from its training directories' own records.

Everything is rebuilt from the run directory's artifacts, so ``geospec report RUN_DIR`` works on
any finished (or partly finished) run.

results.json::

    {"name": ..., "baseline": "uniform", "confidence": 0.95,
     "arms": {"<arm>": {"schedule": {...}, "widths": [...], "bounds": [lo, hi] | null,
                        "params": N, "ffn_params": N,
                        "val_loss": {"seeds": {"<seed>": loss}, "mean": m, "sd": s},
                        "vs_uniform": {"mean": d, "ci95": [lo, hi],
                                       "bootstrap_ci95": [lo, hi] | null,
                                       "improved": k, "n": n,
                                       "p_exact": p, "p_holm": p, "p_min": p} | null,
                        "vs_source": {"arm": "<source>", ...as vs_uniform} | null}},
     "comparisons": [{"arm": "<arm>", "against": "<arm>",
                      "difference": {...as vs_uniform} | null}],   (report.compare)
     "equal_params": bool,
     "checks": {"same_data_and_validation": bool | null, "same_training": ...,
                "same_shape_apart_from_widths": ..., "seeds_paired": ...},
     "profiles": {"topology/hyperbolic": [...], ...},
     "notes": ["..."],
     "reliability": {"threshold": 0.8,          (only when profiles have replicates)
                     "profiles": {"<profile>": {"replicates": R, "se": [...],
                                                "split_half": rho, "below_threshold": bool}}}}

``vs_uniform`` compares with the spec's baseline arm (``report.baseline``, "uniform" by default),
paired by seed; ``ci95`` holds the interval at ``confidence`` (0.95 unless the spec says otherwise).
``p_exact`` is the exact sign-flip p-value, ``p_holm`` the same Holm-adjusted across the arms,
``p_min`` the smallest p-value the number of seeds allows. ``vs_source`` compares an arm derived
from another (``fitted``, ``sorted``) with that arm (Holm across those comparisons).
``comparisons`` holds the spec's own pairs (``report.compare``), Holm-adjusted across them;
``difference`` is null while the two arms share no finished seed. ``bounds`` are the smallest and
largest width the arm's schedule allowed (from widths.json: a solver's ``min_ratio`` and
``max_ratio``), null where it set none or the models were not trained with the plan's widths.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from geospec.engine.run_files import CONFIG_FILE, METRICS_FILE, RESULT_FILE
from geospec.errors import GeospecError, UsageError
from geospec.report.evaluation import eval_results
from geospec.rundir.artifacts import json_problem, read_json, read_json_or_none
from geospec.rundir.layout import PROFILES_FILE, RUN_FILE, WIDTHS_FILE, arm_seed_dir
from geospec.rundir.records import trains_nothing
from geospec.shapes.model_size import Shape, count_params, total_ffn_params
from geospec.solve.widths import bounds_problems
from geospec.stats import (
    MIN_INTERVAL_SEEDS,
    MIN_RELIABILITY,
    comparison,
    finite,
    holm,
    seeds_to_reach,
    shown_against,
    shows_interval,
    smallest_sign_flip_p,
    split_half_reliability,
    standard_errors,
    summarize,
)

#: What run.json must hold for the report to be built from it.
RUN_KEYS = {"name", "baseline", "confidence", "bootstrap", "arms", "seeds"}


@dataclass(frozen=True)
class SeedRun:
    seed: int
    directory: Path
    final_val_loss: float | None
    curve: list[tuple[int, float]]  # (step, validation loss)
    config: dict[str, Any] | None
    fingerprint: dict[str, Any] | None
    """What the run was trained on (:func:`geospec.engine.train.fingerprint`)."""
    execution: list[dict[str, Any]] | None = None
    """How it computed, one entry per setting it trained under
    (:func:`geospec.engine.train.execution`); None for runs that did not record it."""


def read_seed_run(directory: Path, seed: int) -> SeedRun:
    result = read_json(directory / RESULT_FILE)
    config = read_json(directory / CONFIG_FILE)
    curve: list[tuple[int, float]] = []
    metrics = directory / METRICS_FILE
    if metrics.exists():
        for line in metrics.read_text(errors="replace").splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut by a crash; the rest of the file is still good
            if isinstance(row, dict) and row.get("val_loss") is not None:
                curve.append((int(row["step"]), float(row["val_loss"])))
    loss = float(result["final_val_loss"]) if result else None
    fingerprint = result.get("fingerprint") if result else None
    execution = result.get("execution") if result else None
    return SeedRun(seed, directory, loss, curve, config, fingerprint, execution)


def _params(config: dict[str, Any]) -> tuple[int, int]:
    widths = config["ffn_widths"]
    ffn = total_ffn_params(config["d_model"], widths, config["activation"], config["bias"])
    return count_params(Shape.of(config), widths), ffn


def planned_widths(path: Path) -> dict[str, Any]:
    """The arms of the run's ``widths.json`` (the solve stage's plan), empty while the solve
    stage has not run; a damaged or edited one stops the report with one line naming it."""
    if not path.exists():
        return {}
    problem = json_problem(path, "arms")
    stored = read_json_or_none(path)
    if problem is None and not isinstance(stored["arms"], dict):
        problem = f"{path.name} does not hold what geospec wrote"
    if problem:
        raise UsageError(f"{path}: {problem}; run the spec again (its solve stage rewrites it)")
    return dict(stored["arms"])


def build_results(run_dir: Path) -> dict[str, Any]:
    """Collect every arm's widths, parameter count and per-seed losses; compare with baseline."""
    resolved = read_json(run_dir / RUN_FILE)
    if resolved is None:
        raise UsageError(
            f"{run_dir}: not a geospec run directory (no run.json); run the spec first"
        )
    if not isinstance(resolved, dict) or not set(resolved) >= RUN_KEYS:
        raise UsageError(
            f"{run_dir / RUN_FILE}: does not hold what geospec writes; run the spec again "
            "(geospec run rewrites it)"
        )
    probe_only = trains_nothing(run_dir, resolved)
    planned_arms = planned_widths(run_dir / WIDTHS_FILE)
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
        trained = [r.fingerprint["config"]["ffn_widths"] for r in seed_runs if r.fingerprint]
        planned = planned_arms.get(name) or {}
        # what the models were trained with, from their own records; the plan otherwise
        widths = trained[0] if trained else planned.get("widths")
        # the plan's bounds belong to its widths: none for widths trained under another plan
        bounds = planned.get("bounds") if widths and planned.get("widths") == widths else None
        problems = bounds_problems(widths or [], bounds)  # at most one
        if problems:
            raise UsageError(
                f"{run_dir / WIDTHS_FILE}: arm {name!r}: {problems[0]}; run the spec again (its "
                "solve stage rewrites it)"
            )
        arms[name] = {
            "schedule": arm["schedule"],
            "widths": widths,
            "bounds": bounds,
            "params": params,
            "ffn_params": ffn_params,
            "val_loss": {
                "seeds": {str(seed): loss for seed, loss in losses.items()},
                "mean": finite(summary.mean),
                "sd": finite(summary.sd),
            },
            "vs_uniform": None,
            "vs_source": None,
        }
    base_losses = {
        int(s): v for s, v in arms.get(baseline, {}).get("val_loss", {}).get("seeds", {}).items()
    }
    for name, entry in arms.items():
        if name == baseline or not base_losses:
            continue
        entry["vs_uniform"] = comparison(_losses(entry), base_losses, confidence, resolved)
    reads = {arm["name"]: schedule_reads(arm["schedule"]) for arm in resolved["arms"]}
    for name, entry in arms.items():
        source = next((arm for arm in reads[name][0] if arm in arms), None)
        entry["vs_source"] = None
        if source is not None:
            against = comparison(_losses(entry), _losses(arms[source]), confidence, resolved)
            entry["vs_source"] = {"arm": source, **against} if against else None
    comparisons = chosen_comparisons(arms, resolved.get("compare", []), confidence, resolved)
    families = comparison_families(arms, comparisons, baseline)
    for family in families.values():  # Holm across each family of comparisons
        tests = {str(i): vs["p_exact"] for i, (_, _, vs) in enumerate(family)}
        for i, adjusted in holm(tests).items():
            family[int(i)][2]["p_holm"] = adjusted
    counts = {a["params"] for a in arms.values() if a["params"] is not None}
    stored = read_json(run_dir / PROFILES_FILE)
    replicates = stored.get("replicates") if isinstance(stored, dict) else None
    threshold = resolved.get("min_reliability", MIN_RELIABILITY)
    reliability = profile_reliability(replicates or {}, threshold)
    results = {
        "name": resolved["name"],
        "baseline": baseline,
        "confidence": confidence,
        "equal_params": len(counts) <= 1,
        "checks": comparison_checks(runs),
        "arms": arms,
        "comparisons": comparisons,
        "profiles": profiles,
        # a spec that trains nothing has no runs to wait for
        "notes": ([] if probe_only else unfinished_notes(arms, resolved["seeds"]))
        + exact_test_notes(arms, 1 - confidence)
        + interval_notes(arms)
        + holm_floor_notes(families, 1 - confidence)
        + reliability_notes(reliability, {name: r[1] for name, r in reads.items()})
        + execution_notes(runs),
        "curves": {
            name: {str(r.seed): r.curve for r in seed_runs} for name, seed_runs in runs.items()
        },
    }
    if probe_only:  # the widths are the schedules' answer; no model was to be trained
        results["probe_only"] = True
    if reliability is not None:
        results["reliability"] = reliability
    if resolved.get("eval"):  # the spec evaluates the arms with lm-eval (the eval stage)
        scores, results["eval"] = eval_results(run_dir, resolved, confidence)
        for name, entry in scores.items():
            arms[name]["eval"] = entry
    return results


def chosen_comparisons(
    arms: dict[str, Any], pairs: list[list[str]], confidence: float, resolved: dict[str, Any]
) -> list[dict[str, Any]]:
    """The spec's own pairs (report.compare), ``arm - against`` paired by seed (``p_holm`` is
    filled in across the pairs by :func:`build_results`)."""
    return [
        {
            "arm": arm,
            "against": against,
            "difference": comparison(
                _losses(arms[arm]), _losses(arms[against]), confidence, resolved
            ),
        }
        for arm, against in pairs
        if arm in arms and against in arms  # validation guarantees it for a current spec
    ]


#: One paired comparison of a family: (arm, the arm it is compared with, its comparison entry).
Compared = tuple[str, str, dict[str, Any]]


def comparison_families(
    arms: dict[str, Any], chosen: list[dict[str, Any]], baseline: str
) -> dict[str, list[Compared]]:
    """The report's three families of paired comparisons, each Holm-adjusted on its own: every
    arm against the baseline, derived arms against their source, the spec's report.compare
    pairs (only comparisons that exist: two arms with a shared finished seed)."""
    return {
        "with the baseline": [
            (name, baseline, a["vs_uniform"]) for name, a in arms.items() if a.get("vs_uniform")
        ],
        "of derived arms with their source": [
            (name, a["vs_source"]["arm"], a["vs_source"])
            for name, a in arms.items()
            if a.get("vs_source")
        ],
        "of report.compare": [
            (c["arm"], c["against"], c["difference"]) for c in chosen if c["difference"]
        ],
    }


def _losses(entry: dict[str, Any]) -> dict[int, float]:
    return {int(seed): loss for seed, loss in entry["val_loss"]["seeds"].items()}


def schedule_reads(table: dict[str, Any]) -> tuple[list[str], list[str]]:
    """The arms and profiles a schedule reads (its ``required_arms``, ``required_profiles``);
    nothing when its plugin is not installed here."""
    from geospec.registry.loading import get_registries

    try:
        schedule = get_registries().create("schedule", table)
    except (GeospecError, ValueError):
        return [], []
    return schedule.required_arms(), schedule.required_profiles()


def unfinished_notes(arms: dict[str, Any], seeds: list[int]) -> list[str]:
    """A report built before every planned run has finished says so, naming the runs it lacks
    (a study in progress, runs still queued on a cluster): its figures are not the study's."""
    missing = {
        name: [seed for seed in seeds if str(seed) not in entry["val_loss"]["seeds"]]
        for name, entry in arms.items()
    }
    missing = {name: lacking for name, lacking in missing.items() if lacking}
    if not missing:
        return []
    planned = len(arms) * len(seeds)
    finished = planned - sum(len(lacking) for lacking in missing.values())
    lacking = "; ".join(
        f"{name} seed{'s' if len(seeds_) > 1 else ''} {', '.join(map(str, seeds_))}"
        for name, seeds_ in missing.items()
    )
    return [
        f"Partial: {finished} of {planned} planned runs have finished; not in these figures: "
        f"{lacking}. Each comparison pairs only the seeds both arms have."
    ]


def exact_test_notes(arms: dict[str, Any], alpha: float) -> list[str]:
    """A plain note for every number of seeds too small for the sign-flip test to reach the
    level at all."""
    too_few = sorted(
        {
            entry[key]["n"]
            for entry in arms.values()
            for key in ("vs_uniform", "vs_source")
            if entry.get(key) and entry[key]["p_min"] > alpha
        }
    )
    return [
        f"With {n} paired seed{'s' if n > 1 else ''} the exact sign-flip test cannot give a "
        f"p-value below {smallest_sign_flip_p(n):.4g} (2/2^{n}), so no comparison on {n} "
        f"seed{'s' if n > 1 else ''} can reach p ≤ {alpha:.3g}; that takes at least "
        f"{seeds_to_reach(alpha)} paired seeds; the tables leave its p cells empty."
        for n in too_few
    ]


def interval_notes(arms: dict[str, Any]) -> list[str]:
    """A plain note for every number of paired seeds too small for a t interval to be shown
    (:data:`~geospec.stats.MIN_INTERVAL_SEEDS`)."""
    too_few = sorted(
        {
            entry[key]["n"]
            for entry in arms.values()
            for key in ("vs_uniform", "vs_source")
            if entry.get(key) and not shows_interval(entry[key]["n"])
        }
    )
    return [
        f"With {n} paired seed{'s' if n > 1 else ''} the tables show no interval: "
        + ("one seed has no spread to build one from" if n == 1 else
           "a t interval on one degree of freedom is set by the normality assumption more than "
           "by the data (two near-equal differences give a hair-thin interval)")
        + f"; results.json holds each seed's loss, and {MIN_INTERVAL_SEEDS} seeds give an "
        "interval."
        for n in too_few
    ]  # fmt: skip


def holm_floor_notes(families: dict[str, list[Compared]], alpha: float) -> list[str]:
    """A plain note for every family of comparisons (:func:`comparison_families`) whose Holm
    adjustment cannot reach the level at all, though each comparison alone could: Holm multiplies
    the smallest p-value by the number m of comparisons, so no adjusted p-value goes below m
    times the smallest p_min."""
    notes = []
    for label, family in families.items():
        if not family:
            continue
        m = len(family)
        smallest = min(vs["p_min"] for _, _, vs in family)
        if smallest <= alpha < m * smallest:  # never for m = 1: Holm leaves one p-value as it is
            notes.append(
                f"Holm's adjustment across the {m} comparisons {label} cannot give any of them "
                f"a p-value below {m * smallest:.4g} ({m} x {smallest:.4g}), so none can pass it "
                f"at {alpha:.3g}; that takes at least {seeds_to_reach(alpha / m)} paired seeds."
            )
    return notes


def execution_notes(runs: dict[str, list[SeedRun]]) -> list[str]:
    """A note when the finished runs computed under different settings (CPU threads, device,
    precision, torch): the comparisons stay fair (every run is the same experiment), but a run
    repeated under another setting sums in another order and ends a little elsewhere, so whoever
    reproduces a figure needs the setting each run had (its result.json's ``execution``)."""
    settings: dict[str, list[str]] = {}
    for name, seed_runs in runs.items():
        for run in seed_runs:
            recorded = run.execution
            if run.final_val_loss is None or not recorded or not isinstance(recorded, list):
                continue  # unfinished, or written before geospec recorded it
            if not all(isinstance(entry, dict) for entry in recorded):
                continue  # not what geospec writes: it says nothing about the setting
            shown = " then ".join(_setting(entry) for entry in recorded)
            settings.setdefault(shown, []).append(f"{name} seed {run.seed}")
    if len(settings) <= 1:
        return []
    listed = "; ".join(
        f"{shown}: {len(who)} run{'s' if len(who) > 1 else ''}"
        + (f" ({', '.join(who)})" if len(who) <= 3 else "")
        for shown, who in sorted(settings.items(), key=lambda item: -len(item[1]))
    )
    return [
        f"The runs computed under {len(settings)} settings ({listed}). Each is the same "
        "experiment, so the comparisons stand, but floating-point sums ran in different orders: "
        "a run repeated under another setting ends at a slightly different loss. To reproduce a "
        "figure exactly, use the run's own setting (execution in its result.json)."
    ]


def _setting(entry: dict[str, Any]) -> str:
    parts = [str(entry.get("device", "?"))]
    if entry.get("threads") is not None:
        parts.append(f"{entry['threads']} thread{'s' if entry['threads'] != 1 else ''}")
    if (entry.get("processes") or 1) > 1:
        parts.append(f"{entry['processes']} processes")
    parts += [str(entry.get("precision", "?")), f"torch {entry.get('torch', '?')}"]
    if entry.get("compiled"):
        parts.append("compiled")
    return ", ".join(parts)


def profile_reliability(
    replicates: dict[str, list[list[float]]], threshold: float
) -> dict[str, Any] | None:
    """Per profile measured on several token samples: the number of replicates, per-layer
    standard errors, the split-half reliability and whether it is below ``threshold``; None when
    no profile has replicates."""
    if not replicates:
        return None
    profiles = {}
    for name, values in replicates.items():
        rho = split_half_reliability(values)
        profiles[name] = {
            "replicates": len(values),
            "se": standard_errors(values),
            "split_half": rho,
            "below_threshold": rho is None or rho < threshold,
        }
    return {"threshold": threshold, "profiles": profiles}


def reliability_notes(reliability: dict[str, Any] | None, reads: dict[str, list[str]]) -> list[str]:
    """A note per profile whose split-half reliability is below the threshold, naming the arms
    that read it."""
    if reliability is None:
        return []
    notes = []
    for name, entry in reliability["profiles"].items():
        if not entry["below_threshold"]:
            continue
        value = shown_against(entry["split_half"], reliability["threshold"])
        users = [arm for arm, profiles in reads.items() if name in profiles]
        used = f"; arms reading it: {', '.join(users)}" if users else ""
        notes.append(
            f"Profile {name}: split-half reliability {value} over {entry['replicates']} "
            f"replicates is below {reliability['threshold']:g}: its shape over the layers is "
            f"largely sampling noise{used}."
        )
    return notes


#: What makes the comparison fair, each checked on the finished runs' own records (None when
#: no run recorded a fingerprint). The labels are what report.md prints.
CHECKS = {
    "seeds_share_widths": "every seed of an arm trained with the same widths",
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
        "seeds_share_widths": all(
            len({json.dumps(r.fingerprint["config"]["ffn_widths"]) for r in rs if r.fingerprint})
            <= 1
            for rs in runs.values()
        ),
        "same_data_and_validation": same(
            lambda fp: [fp["data"], fp.get("tokens"), fp["eval_tokens"]]
        ),
        "same_training": same(lambda fp: [fp["steps"], fp["batch_size"], fp["optimizer"]]),
        "same_shape_apart_from_widths": same(
            lambda fp: {k: v for k, v in fp["config"].items() if k != "ffn_widths"}
        ),
        "seeds_paired": all(fp["seed"] == seed for seed, fp in records),
    }
