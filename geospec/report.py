"""The report: results.json (a stable shape), report.md, plots, and the terminal table.

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
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from geospec.atomic import atomic_write_json, atomic_write_text
from geospec.errors import UsageError
from geospec.model_size import Shape, count_params, total_ffn_params
from geospec.plotting import PlotDir
from geospec.stats import paired_difference, summarize

RESULT_FILE = "result.json"


@dataclass(frozen=True)
class SeedRun:
    seed: int
    directory: Path
    final_val_loss: float | None
    curve: list[tuple[int, float]]  # (step, validation loss)
    config: dict[str, Any] | None
    fingerprint: dict[str, Any] | None  # what the run was trained on (geospec.train.fingerprint)


def arm_seed_dir(run_dir: Path, arm: str, seed: int) -> Path:
    return run_dir / "arms" / arm / f"seed-{seed}"


def read_seed_run(directory: Path, seed: int) -> SeedRun:
    result = _read_json(directory / RESULT_FILE)
    config = _read_json(directory / "config.json")
    curve: list[tuple[int, float]] = []
    metrics = directory / "metrics.jsonl"
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


def _read_json(path: Path) -> Any:
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise UsageError(f"{path}: not valid JSON ({error}); delete it and rerun") from None


def _params(config: dict[str, Any]) -> tuple[int, int]:
    shape = Shape(
        n_layers=config["n_layers"],
        d_model=config["d_model"],
        n_heads=config["n_heads"],
        vocab_size=config["vocab_size"],
        seq_len=config["seq_len"],
        activation=config["activation"],
        norm=config["norm"],
        positions=config["positions"],
        bias=config["bias"],
        tie_embeddings=config["tie_embeddings"],
    )
    widths = config["ffn_widths"]
    ffn = total_ffn_params(config["d_model"], widths, config["activation"], config["bias"])
    return count_params(shape, widths), ffn


def build_results(run_dir: Path) -> dict[str, Any]:
    """Collect every arm's widths, parameter count and per-seed losses; compare with baseline."""
    resolved = _read_json(run_dir / "run.json")
    if resolved is None:
        raise UsageError(
            f"{run_dir}: not a geospec run directory (no run.json); run the spec first"
        )
    widths_file = _read_json(run_dir / "widths.json") or {"arms": {}}
    profiles = (_read_json(run_dir / "profiles.json") or {}).get("profiles", {})
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
                "mean": _finite(summary.mean),
                "sd": _finite(summary.sd),
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
            "sd": _finite(diff.sd),
            "ci95": [_finite(diff.ci[0]), _finite(diff.ci[1])],
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
        "same_data_and_validation": same(lambda fp: [fp["data"], fp["eval_tokens"]]),
        "same_training": same(lambda fp: [fp["steps"], fp["batch_size"], fp["optimizer"]]),
        "same_shape_apart_from_widths": same(
            lambda fp: {k: v for k, v in fp["config"].items() if k != "ffn_widths"}
        ),
        "seeds_paired": all(fp["seed"] == seed for seed, fp in records),
    }


def _finite(value: float) -> float | None:
    return None if value is None or math.isnan(value) else value


def write_report(run_dir: Path, plots: bool = True) -> dict[str, Any]:
    """Write results.json, report.md and plots/ from the run directory's artifacts."""
    results = build_results(run_dir)
    curves = results.pop("curves")
    atomic_write_json(run_dir / "results.json", results)
    images = write_plots(run_dir, results, curves) if plots else []
    text = markdown(results, images)
    from geospec.diagnostics import read_diagnostics

    diagnostics = read_diagnostics(run_dir)
    if diagnostics is not None:  # the diagnose stage ran: add its tables and plots
        from geospec.diagnostics_report import diagnostic_plots, diagnostics_markdown

        extra = diagnostic_plots(run_dir, diagnostics) if plots else []
        text += "\n" + diagnostics_markdown(diagnostics, extra)
    atomic_write_text(run_dir / "report.md", text)
    return results


def _fmt(value: float | None, digits: int = 4, signed: bool = False) -> str:
    if value is None:
        return "-"
    return f"{value:+.{digits}f}" if signed else f"{value:.{digits}f}"


def table_rows(results: dict[str, Any]) -> list[list[str]]:
    """One row per arm: arm, params, val loss mean +/- sd, diff vs baseline with CI, wins."""
    rows = []
    for name, arm in results["arms"].items():
        loss = arm["val_loss"]
        n_seeds = len(loss["seeds"])
        loss_text = f"{_fmt(loss['mean'])} ± {_fmt(loss['sd'])}" if n_seeds else "(not trained)"
        vs = arm["vs_uniform"]
        if vs is None:
            diff_text, ci_text, wins = "-", "-", "-"
        else:
            diff_text = _fmt(vs["mean"], signed=True)
            low, high = vs["ci95"]
            ci_text = f"[{_fmt(low, signed=True)}, {_fmt(high, signed=True)}]"
            if vs["bootstrap_ci95"]:
                b_low, b_high = vs["bootstrap_ci95"]
                ci_text += f" (bootstrap [{_fmt(b_low, signed=True)}, {_fmt(b_high, signed=True)}])"
            wins = f"{vs['improved']}/{vs['n']}"
        params = f"{arm['params']:,}" if arm["params"] is not None else "-"
        rows.append([name, params, loss_text, str(n_seeds), diff_text, ci_text, wins])
    return rows


HEADERS = [
    "arm",
    "params",
    "val loss (mean ± sd)",
    "seeds",
    "Δ vs {baseline}",
    "{level}% CI",
    "improved",
]


def headers(results: dict[str, Any]) -> list[str]:
    level = round(results["confidence"] * 100)
    return [h.format(baseline=results["baseline"], level=level) for h in HEADERS]


PLOT_TITLES = {
    "profiles": "Work profiles over depth",
    "widths": "Widths per layer",
    "val_loss": "Validation loss during training",
    "differences": "Paired differences from the baseline",
}


def markdown(results: dict[str, Any], images: list[str]) -> str:
    lines = [f"# geospec report: {results['name']}", ""]
    lines.append(
        "Final validation loss per arm. "
        f"Δ is the paired difference against `{results['baseline']}` (negative = better), "
        "averaged over seeds, with a t-interval (and a bootstrap interval with 5 or more seeds)."
    )
    lines.append("")
    head = headers(results)
    lines.append("| " + " | ".join(head) + " |")
    lines.append("|" + "---|" * len(head))
    for row in table_rows(results):
        lines.append("| " + " | ".join(row) + " |")
    lines.append("")
    if not results["equal_params"]:
        lines.append("**Warning: the arms do not have equal parameter counts.**")
        lines.append("")
    checks = results.get("checks", {})
    if any(value is not None for value in checks.values()):
        marks = [f"{CHECKS[k]} {'✓' if v else '✗ (**not so**)'}" for k, v in checks.items()]
        lines += ["Checked on every run's record: " + "; ".join(marks) + ".", ""]
    lines.append("## FFN widths per arm")
    lines.append("")
    for name, arm in results["arms"].items():
        widths = arm["widths"]
        lines.append(f"- `{name}`: {' '.join(map(str, widths)) if widths else '(pending)'}")
    lines.append("")
    for image in images:
        stem = Path(image).stem
        title = PLOT_TITLES.get(stem, stem.replace("_", " ").capitalize())
        lines += [f"## {title}", "", f"![{title}]({image})", ""]
    return "\n".join(lines)


def write_plots(
    run_dir: Path, results: dict[str, Any], curves: dict[str, dict[str, list[Any]]]
) -> list[str]:
    plots = PlotDir(run_dir)
    plt, save = plots.plt, plots.save

    profiles = results["profiles"]
    if profiles:
        statistics = _ordered({p.split("/")[0] for p in profiles}, ("shift", "gw", "topology"))
        geometries = _ordered(
            {p.split("/")[-1] for p in profiles}, ("raw", "spherical", "hyperbolic")
        )
        fig, axes = plt.subplots(
            len(statistics),
            len(geometries),
            squeeze=False,
            figsize=(3.2 * len(geometries), 2.4 * len(statistics)),
        )
        for i, statistic in enumerate(statistics):
            for j, geometry in enumerate(geometries):
                ax = axes[i][j]
                values = profiles.get(f"{statistic}/{geometry}")
                if values is None:
                    ax.axis("off")
                    continue
                ax.plot(range(len(values)), values, marker="o", ms=3)
                ax.set_title(f"{statistic} / {geometry}", fontsize=9)
                ax.set_xlabel("layer", fontsize=8)
                ax.tick_params(labelsize=7)
        fig.suptitle("Geometric work per layer (reference model)")
        fig.tight_layout()
        save(fig, "profiles.png")

    widths = {n: a["widths"] for n, a in results["arms"].items() if a["widths"]}
    if widths:
        fig, ax = plt.subplots(figsize=(6.4, 3.6))
        for name, values in widths.items():
            ax.plot(range(len(values)), values, marker="o", ms=3, label=name)
        ax.set_xlabel("layer")
        ax.set_ylabel("FFN width")
        ax.set_title("FFN width per layer (equal total per arm)")
        ax.legend(fontsize=7)
        save(fig, "widths.png")

    if any(any(seed_curve for seed_curve in arm.values()) for arm in curves.values()):
        fig, ax = plt.subplots(figsize=(6.4, 3.6))
        for index, (name, arm_curves) in enumerate(curves.items()):
            color = f"C{index % 10}"
            for seed, points in arm_curves.items():
                if points:
                    steps, losses = zip(*points, strict=True)
                    label = name if seed == next(iter(arm_curves)) else None
                    ax.plot(steps, losses, color=color, alpha=0.8, lw=1, label=label)
        ax.set_xlabel("step")
        ax.set_ylabel("validation loss")
        ax.set_title("Validation loss per arm (one line per seed)")
        ax.legend(fontsize=7)
        save(fig, "val_loss.png")

    compared = {name: arm for name, arm in results["arms"].items() if arm["vs_uniform"]}
    if compared:
        save(_differences_figure(plt, results, compared), "differences.png")
    return plots.written


def _differences_figure(plt: Any, results: dict[str, Any], compared: dict[str, Any]) -> Any:
    """Each arm's paired differences from the baseline: one dot per seed, the mean and its CI.
    Seed-to-seed spread hides effects of this size in the loss curves; pairing shows them."""
    base = results["arms"][results["baseline"]]["val_loss"]["seeds"]
    fig, ax = plt.subplots(figsize=(6.4, 0.5 * len(compared) + 1.2))
    for row, arm in enumerate(reversed(compared.values())):
        seeds = arm["val_loss"]["seeds"]
        diffs = [seeds[s] - base[s] for s in seeds if s in base]
        ax.scatter(diffs, [row] * len(diffs), s=14, color="0.55", zorder=2)
        vs = arm["vs_uniform"]
        low, high = vs["ci95"]
        if low is not None and high is not None:
            ax.plot([low, high], [row, row], color="C0", lw=2, zorder=1)
        ax.plot([vs["mean"]], [row], marker="D", color="C0", ms=6, zorder=3)
    ax.axvline(0.0, color="black", lw=0.8)
    ax.locator_params(axis="x", nbins=6)
    ax.tick_params(axis="x", labelsize=8)
    ax.set_yticks(range(len(compared)), list(reversed(compared)), fontsize=8)
    level = round(results["confidence"] * 100)
    ax.set_xlabel(f"validation loss - {results['baseline']} (same seed); < 0 is better")
    ax.set_title(f"Paired differences: seeds (dots), mean and {level}% CI")
    return fig


def _ordered(names: set[str], known: tuple[str, ...]) -> list[str]:
    """The paper's order for the builtin names, then any others alphabetically."""
    return [n for n in known if n in names] + sorted(names - set(known))


def print_table(results: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"geospec: {results['name']}")
    for header in headers(results):
        table.add_column(header, justify="left" if header == "arm" else "right")
    for row in table_rows(results):
        table.add_row(*row)
    console = Console()
    if not console.is_terminal:
        console = Console(width=140)  # logs and pipes: don't wrap the table at 80 columns
    console.print(table)
    if not results["equal_params"]:
        console.print("[bold red]warning:[/] arms do not have equal parameter counts")
    for key, value in results.get("checks", {}).items():
        if value is False:
            console.print(f"[bold red]warning:[/] not every run has the {CHECKS[key]}")
