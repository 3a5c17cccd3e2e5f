"""Pruning as table rows, from prune.json, and the report.md section: per budget, every arm's
widths, FFN parameters (equal within one multiple per layer: checked), perplexity on each eval
corpus, and its paired difference in loss from the baseline over the calibration seeds."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from geospec.report.diagnostics import number


def budget_rows(prune: Mapping[str, Any], budget: Mapping[str, Any]) -> list[list[str]]:
    """One row per arm and corpus (and per corpus after healing, where the models were healed);
    every difference is from the baseline's loss measured the same way."""
    from geospec.stats import paired_difference, sign_flip_p, summarize

    baseline = budget["arms"][prune["baseline"]]
    rows = []
    for name, arm in budget["arms"].items():
        widths = next(iter(arm["widths"].values()))
        varies = len({tuple(w) for w in arm["widths"].values()}) > 1
        shown = " ".join(str(w) for w in widths) + (" (seed 0; varies)" if varies else "")
        params = "/".join(f"{p:,}" for p in sorted(set(arm["ffn_params"].values())))
        measured = [("loss", corpus) for corpus in arm["loss"]]
        measured += [("healed_loss", corpus) for corpus in arm.get("healed_loss", {})]
        for field, corpus in measured:
            losses = arm[field][corpus]
            values = [float(v) for v in losses.values()]
            label = corpus if field == "loss" else f"{corpus}, healed"
            row = [name, shown, params, label, number(math.exp(summarize(values).mean), 2)]
            shown, params = "", ""  # once per arm
            if name == prune["baseline"]:
                rows.append([*row, "-", "-", "-", "-"])
                continue
            against = values_by(baseline[field][corpus])
            diff = paired_difference(values_by(losses), against)
            p = sign_flip_p([values_by(losses)[s] - against[s] for s in diff.seeds])
            ci = "-" if math.isnan(diff.ci[0]) else f"[{diff.ci[0]:+.4f}, {diff.ci[1]:+.4f}]"
            rows.append(
                [
                    *row,
                    f"{diff.mean:+.4f}",
                    ci,
                    f"{diff.improved}/{diff.n}",
                    "-" if p is None else f"{p:.3g}",
                ]
            )
    return rows


def values_by(losses: Mapping[str, float]) -> dict[int, float]:
    return {int(s): float(v) for s, v in losses.items()}


HEADERS = [
    "arm",
    "widths",
    "FFN params",
    "corpus",
    "perplexity",
    "Δ loss vs baseline",
    "95% CI",
    "better",
    "p (sign-flip)",
]


def params_problem(prune: Mapping[str, Any], budget: Mapping[str, Any]) -> str | None:
    """Arms whose FFN parameter counts differ by more than one multiple per layer."""
    counts = {
        name: value for name, arm in budget["arms"].items() for value in arm["ffn_params"].values()
    }
    spread = max(counts.values()) - min(counts.values())
    per_neuron = max(counts.values()) // max(1, budget["budget"])
    limit = prune["layers"] * budget["multiple"] * max(1, per_neuron)
    if spread > limit:
        return f"FFN parameters differ by {spread:,} (more than one multiple per layer)"
    return None


def prune_markdown(prune: Mapping[str, Any], images: Sequence[str] = ()) -> str:
    """The report.md section for prune.json (tables, then the plots given)."""
    from geospec.report.markdown import markdown_table

    importance = prune["importance"]["kind"]
    seeds = len(prune["seeds"])
    calibration = ", ".join(map(str, prune["seeds"]))
    lines = [
        "## Pruning the reference",
        "",
        f"The reference ({prune['layers']} layers of {prune['width']} FFN neurons) keeps a share "
        "of its FFN neurons, allocated over layers by each arm; every layer keeps its best "
        f"neurons by the {importance} score of calibration sample k (k = {calibration}; "
        f"arms are paired by it). Perplexity on the first {prune['windows']} validation windows "
        f"of each corpus; Δ loss is the paired difference from {prune['baseline']} over {seeds} "
        "calibration seeds (negative: better).",
        "",
        "Unpruned reference: "
        + ", ".join(f"{c} {math.exp(v):.2f}" for c, v in prune["reference"].items())
        + " (perplexity).",
        "",
    ]
    for budget in prune["budgets"]:
        lines += [
            f"### Keeping {budget['keep']:g} of the FFN neurons ({budget['budget']:,} of "
            f"{prune['layers'] * prune['width']:,}; uniform width {budget['uniform_width']})",
            "",
        ]
        problem = params_problem(prune, budget)
        lines += [
            f"**warning:** {problem}" if problem else "Every arm has the same FFN parameters.",
            "",
        ]
        lines += markdown_table(HEADERS, budget_rows(prune, budget))
    for image in images:
        lines += [f"![{Path(image).stem}]({image})", ""]
    return "\n".join(lines)
