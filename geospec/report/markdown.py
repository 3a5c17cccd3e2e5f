"""report.md: the results table, the fairness checks, the widths and the figures."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from geospec.report.results import CHECKS
from geospec.solve.widths import bounds_note
from geospec.stats import shown_against


def markdown_table(headers: list[str], rows: list[list[str]]) -> list[str]:
    """A Markdown table's lines (and the blank line after it)."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return [*lines, ""]


def _fmt(value: float | None, digits: int = 4, signed: bool = False) -> str:
    if value is None:
        return "-"
    return f"{value:+.{digits}f}" if signed else f"{value:.{digits}f}"


def _p(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"


def comparison_cells(vs: dict[str, Any] | None, alpha: float = 0.05) -> list[str]:
    """Δ, CI (and bootstrap CI), wins, exact p and Holm-adjusted p of one paired comparison; the
    interval only from :data:`~geospec.stats.MIN_INTERVAL_SEEDS` seeds and the p-values only
    where the sign-flip test can reach ``alpha`` (the report's notes say why a cell is empty)."""
    from geospec.stats import shows_interval, shows_sign_flip

    if vs is None:
        return ["-"] * 5
    low, high = vs["ci95"]
    ci_text = f"[{_fmt(low, signed=True)}, {_fmt(high, signed=True)}]"
    if vs["bootstrap_ci95"]:
        b_low, b_high = vs["bootstrap_ci95"]
        ci_text += f" (bootstrap [{_fmt(b_low, signed=True)}, {_fmt(b_high, signed=True)}])"
    if not shows_interval(vs["n"]):
        ci_text = "-"
    wins = f"{vs['improved']}/{vs['n']}"
    testable = shows_sign_flip(vs["n"], alpha)
    # results.json written before the exact test existed has no p-values
    return [
        _fmt(vs["mean"], signed=True),
        ci_text,
        wins,
        _p(vs.get("p_exact")) if testable else "-",
        _p(vs.get("p_holm")) if testable else "-",
    ]


def table_rows(results: dict[str, Any]) -> list[list[str]]:
    """One row per arm: arm, params, val loss mean +/- sd, diff vs baseline with CI, wins, exact
    p-value and its Holm adjustment."""
    rows = []
    for name, arm in results["arms"].items():
        loss = arm["val_loss"]
        n_seeds = len(loss["seeds"])
        loss_text = f"{_fmt(loss['mean'])} ± {_fmt(loss['sd'])}" if n_seeds else "(not trained)"
        params = f"{arm['params']:,}" if arm["params"] is not None else "-"
        cells = comparison_cells(arm["vs_uniform"], 1 - results.get("confidence", 0.95))
        rows.append([name, params, loss_text, str(n_seeds), *cells])
    return rows


HEADERS = [
    "arm",
    "params",
    "val loss (mean ± sd)",
    "seeds",
    "Δ vs {baseline}",
    "{level}% CI",
    "improved",
    "p (sign-flip)",
    "p (Holm)",
]
SOURCE_HEADERS = [
    "arm",
    "source",
    "Δ vs source",
    "{level}% CI",
    "improved",
    "p (sign-flip)",
    "p (Holm)",
]
CHOSEN_HEADERS = [
    "arm",
    "against",
    "Δ vs against",
    "{level}% CI",
    "improved",
    "p (sign-flip)",
    "p (Holm)",
]
RELIABILITY_HEADERS = ["profile", "replicates", "split-half ρ", "largest SE / mean", "flag"]
EVAL_HEADERS = [
    "task / metric",
    "arm",
    "mean ± sd",
    "seeds",
    "Δ vs {baseline}",
    "{level}% CI",
    "better",
    "p (sign-flip)",
    "p (Holm)",
]


def _g(value: float | None, signed: bool = False) -> str:
    """Scores span accuracies and perplexities in the millions: 4 significant digits."""
    if value is None:
        return "-"
    return f"{value:+.4g}" if signed else f"{value:.4g}"


def eval_rows(results: dict[str, Any]) -> list[list[str]]:
    """One row per lm-eval metric and arm (the eval stage's scores): mean ± sd over the seeds
    and the paired comparison with the baseline; "better" counts the seeds on which the arm beat
    the baseline in the metric's direction (↑: higher is better, ↓: lower)."""
    evaluation = results.get("eval")
    if not evaluation:
        return []
    from geospec.stats import shows_interval, shows_sign_flip

    alpha = 1 - results.get("confidence", 0.95)
    rows = []
    for label in evaluation["metrics"]:
        for name, arm in results["arms"].items():
            entry = (arm.get("eval") or {}).get(label)
            if entry is None:
                continue
            arrow = {True: " ↑", False: " ↓"}.get(entry["higher_is_better"], "")
            n_seeds = len(entry["seeds"])
            score = f"{_g(entry['mean'])} ± {_g(entry['sd'])}" if n_seeds else "(not evaluated)"
            vs = entry["vs_uniform"]
            if vs is None:
                cells = ["-"] * 5
            else:
                ci = f"[{_g(vs['ci95'][0], True)}, {_g(vs['ci95'][1], True)}]"
                better = "-" if vs["improved"] is None else str(vs["improved"])
                testable = shows_sign_flip(vs["n"], alpha)
                cells = [_g(vs["mean"], True), ci if shows_interval(vs["n"]) else "-"]
                cells += [f"{better}/{vs['n']}"]
                cells += [_p(vs["p_exact"]) if testable else "-"]
                cells += [_p(vs["p_holm"]) if testable else "-"]
            rows.append([label + arrow, name, score, str(n_seeds), *cells])
    return rows


def source_rows(results: dict[str, Any]) -> list[list[str]]:
    """One row per arm derived from another (``fitted``, ``sorted``): the paired comparison
    ``arm - source``."""
    alpha = 1 - results.get("confidence", 0.95)
    return [
        [name, arm["vs_source"]["arm"], *comparison_cells(arm["vs_source"], alpha)]
        for name, arm in results["arms"].items()
        if arm.get("vs_source")
    ]


def chosen_rows(results: dict[str, Any]) -> list[list[str]]:
    """One row per pair of report.compare: the paired comparison ``arm - against``."""
    alpha = 1 - results.get("confidence", 0.95)
    return [
        [pair["arm"], pair["against"], *comparison_cells(pair["difference"], alpha)]
        for pair in results.get("comparisons", [])
    ]


def reliability_rows(results: dict[str, Any]) -> list[list[str]]:
    """One row per profile measured on several token samples."""
    reliability = results.get("reliability")
    if not reliability:
        return []
    rows = []
    for name, entry in reliability["profiles"].items():
        means = results["profiles"].get(name, [])
        relative = [se / m for se, m in zip(entry["se"], means, strict=False) if se and m]
        rho = entry["split_half"]
        rows.append(
            [
                name,
                str(entry["replicates"]),
                "-" if rho is None else shown_against(rho, reliability["threshold"], sign=True),
                f"{max(relative):.2f}" if relative else "-",
                f"**below {reliability['threshold']:g}**" if entry["below_threshold"] else "",
            ]
        )
    return rows


def headers(results: dict[str, Any], columns: list[str] = HEADERS) -> list[str]:
    level = round(results["confidence"] * 100)
    return [h.format(baseline=results["baseline"], level=level) for h in columns]


PLOT_TITLES = {
    "profiles": "Work profiles over depth",
    "widths": "Widths per layer",
    "val_loss": "Validation loss during training",
    "differences": "Paired differences from the baseline",
}


def markdown(results: dict[str, Any], images: list[str]) -> str:
    lines = [f"# geospec report: {results['name']}", ""]
    if results.get("probe_only"):  # nothing trained: no loss table of runs that never exist
        lines.append(
            "No arm is trained (a probe-only spec): the widths each schedule gives are below."
            if results["arms"]
            else "No arm is trained: the spec measures and prunes the reference (below)."
        )
        lines.append("")
    else:
        lines.append(
            "Final validation loss per arm. "
            f"Δ is the paired difference against `{results['baseline']}` (negative = better), "
            "averaged over seeds, with a t-interval (and a bootstrap interval with 5 or more "
            "seeds), the exact two-sided sign-flip p-value of the paired differences and that "
            "p-value Holm-adjusted across the arms."
        )
        lines.append("")
        lines += markdown_table(headers(results), table_rows(results))
    derived = source_rows(results)
    if derived:
        lines += [
            "Arms derived from another arm (`fitted`, `sorted`) against that arm, on the same "
            "seeds (negative = the derived arm is better; Holm across these comparisons):",
            "",
            *markdown_table(headers(results, SOURCE_HEADERS), derived),
        ]
    chosen = chosen_rows(results)
    if chosen:
        lines += [
            "The spec's own comparisons (`report.compare`), on the same seeds (negative = `arm` "
            "is better; Holm across these comparisons):",
            "",
            *markdown_table(headers(results, CHOSEN_HEADERS), chosen),
        ]
    lines += [f"- {note}" for note in results.get("notes", [])]
    if results.get("notes"):
        lines.append("")
    if not results["equal_params"]:
        lines.append("**Warning: the arms do not have equal parameter counts.**")
        lines.append("")
    checks = results.get("checks", {})
    if any(value is not None for value in checks.values()):
        marks = [f"{CHECKS[k]} {'✓' if v else '✗ (**not so**)'}" for k, v in checks.items()]
        lines += ["Checked on every run's record: " + "; ".join(marks) + ".", ""]
    if results["arms"]:
        lines.append("## FFN widths per arm")
        lines.append("")
    marked = False
    for name, arm in results["arms"].items():
        widths = arm["widths"]
        at_bounds = bounds_note(widths, arm.get("bounds")) if widths else None
        marked = marked or at_bounds is not None
        tail = f" ({at_bounds})" if at_bounds else ""
        lines.append(f"- `{name}`: {' '.join(map(str, widths)) if widths else '(pending)'}{tail}")
    if results["arms"]:
        lines.append("")
    if marked:
        lines += [
            "Layers are counted from 0. A layer at its schedule's bound (the solver's `min_ratio` "
            "or `max_ratio` of the uniform width) may have been set by the bound rather than by "
            "the profile; loosen the bounds to see the profile's own shape there.",
            "",
        ]
    reliability = reliability_rows(results)
    if reliability:
        lines += [
            "## Profile reliability",
            "",
            "Each profile was measured on several disjoint token samples (replicates); the "
            "solver used their mean. Split-half ρ is Spearman's correlation over layers between "
            "the means of the even- and the odd-numbered replicates (1: both halves rank the "
            "layers alike); the largest SE / mean is the widest per-layer error bar relative to "
            "the layer's value.",
            "",
            *markdown_table(RELIABILITY_HEADERS, reliability),
        ]
    scores = eval_rows(results)
    if scores:
        evaluation = results["eval"]
        examples = ", ".join(f"{task} {n}" for task, n in evaluation["samples"].items())
        lines += [
            "## Downstream evaluation",
            "",
            "Each arm x seed scored by lm-evaluation-harness "
            f"({', '.join(evaluation['lm_eval']) or '-'}) through its exported checkpoint "
            f"(examples per task: {examples}). Δ is the paired difference against "
            f"`{results['baseline']}` over the seeds, as for the loss.",
            "",
            *markdown_table(headers(results, EVAL_HEADERS), scores),
        ]
    for image in images:
        stem = Path(image).stem
        title = PLOT_TITLES.get(stem, stem.replace("_", " ").capitalize())
        lines += [f"## {title}", "", f"![{title}]({image})", ""]
    return "\n".join(lines)
