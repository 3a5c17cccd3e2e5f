"""report.md: the results table, the fairness checks, the widths and the figures."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from geospec.report.results import CHECKS


def markdown_table(headers: list[str], rows: list[list[str]]) -> list[str]:
    """A Markdown table's lines (and the blank line after it)."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return [*lines, ""]


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
    lines += markdown_table(headers(results), table_rows(results))
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
