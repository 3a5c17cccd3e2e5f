"""Pruning as table rows, from prune.json, and the report.md section: per budget, every arm's
widths, FFN parameters (equal within one multiple per layer: checked), perplexity on each eval
corpus, and its paired difference in loss from the baseline over the calibration seeds."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from geospec.report.diagnostics import number
from geospec.stats import holm


def budget_rows(
    prune: Mapping[str, Any],
    budget: Mapping[str, Any],
    pairs: Sequence[tuple[str, str]] | None = None,
) -> list[list[str]]:
    """One row per arm and corpus (and per corpus after healing, where the models were healed);
    every difference is from the baseline's loss measured the same way. ``pairs`` (``[arm,
    against]``): those comparisons instead, one row per pair and corpus. Where the units
    recorded each eval window's loss, the difference also gets a bootstrap over seeds and
    windows, its p Holm-adjusted across the table's rows."""
    from geospec.stats import summarize

    baseline = prune["baseline"]
    chosen = pairs if pairs is not None else [(name, baseline) for name in budget["arms"]]
    rows: list[list[str]] = []
    p_values: dict[str, float | None] = {}
    for name, against in chosen:
        arm = budget["arms"][name]
        widths = next(iter(arm["widths"].values()))
        varies = len({tuple(w) for w in arm["widths"].values()}) > 1
        shown = " ".join(str(w) for w in widths) + (" (seed 0; varies)" if varies else "")
        params = "/".join(f"{p:,}" for p in sorted(set(arm["ffn_params"].values())))
        if pairs is not None:
            shown, params = f"vs {against}", ""
        measured = [("loss", corpus) for corpus in arm["loss"]]
        measured += [("healed_loss", corpus) for corpus in arm.get("healed_loss", {})]
        for field, corpus in measured:
            values = [float(v) for v in arm[field][corpus].values()]
            label = corpus if field == "loss" else f"{corpus}, healed"
            row = [name, shown, params, label, number(math.exp(summarize(values).mean), 2)]
            shown, params = "", ""  # once per arm
            if name == against:
                rows.append([*row, "-", "-", "-", "-", "-", "-"])
                continue
            cells, p = _difference(arm, budget["arms"][against], field, corpus)
            p_values[str(len(rows))] = p
            rows.append([*row, *cells, "-"])
    for index, adjusted in holm(p_values).items():
        if adjusted is not None:
            rows[int(index)][-1] = f"{adjusted:.3g}"
    return rows


def _difference(
    arm: Mapping[str, Any], against: Mapping[str, Any], field: str, corpus: str
) -> tuple[list[str], float | None]:
    """The cells of one comparison (the mean paired difference, its t interval over seeds, the
    seeds it is better on, the sign-flip p, the interval over seeds and windows) and the
    bootstrap's p (None without window losses)."""
    from geospec.stats import crossed_bootstrap, paired_difference, sign_flip_p

    ours, theirs = values_by(arm[field][corpus]), values_by(against[field][corpus])
    diff = paired_difference(ours, theirs)
    flip = sign_flip_p([ours[s] - theirs[s] for s in diff.seeds])
    ci = "-" if math.isnan(diff.ci[0]) else f"[{diff.ci[0]:+.4f}, {diff.ci[1]:+.4f}]"
    crossed, p = "-", None
    windows = "window_loss" if field == "loss" else None
    if windows and windows in arm and windows in against and diff.seeds:
        table = [
            [a - b for a, b in zip(arm[windows][corpus][str(s)],
                                   against[windows][corpus][str(s)], strict=True)]
            for s in diff.seeds
        ]  # fmt: skip
        found = crossed_bootstrap(table)
        crossed, p = f"[{found.ci[0]:+.4f}, {found.ci[1]:+.4f}]", found.p
    cells = [
        f"{diff.mean:+.4f}", ci, f"{diff.improved}/{diff.n}",
        "-" if flip is None else f"{flip:.3g}", crossed,
    ]  # fmt: skip
    return cells, p


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
    "95% CI (seeds x windows)",
    "p (Holm)",
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


def prune_markdown(
    prune: Mapping[str, Any],
    images: Sequence[str] = (),
    compare: Sequence[tuple[str, str]] = (),
) -> str:
    """The report.md section for prune.json (tables, then the plots given); ``compare``: further
    ``[arm, against]`` pairs of its arms (report.compare), a table of their own per budget."""
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
        "calibration seeds (negative: better), with its t interval over the seeds; where each "
        "eval window's loss is recorded, also a bootstrap interval resampling seeds and eval "
        "windows (crossed: every seed is scored on the same windows), its p Holm-adjusted "
        "across the rows of the table.",
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
        for sweep, found in budget.get("sweeps", {}).items():
            loss = found["calibration_loss"][found["best"]]
            lines += [
                f"The best setting of the {sweep!r} grid by the mean loss on its calibration "
                f"windows (training text; the eval windows chose nothing): {found['best']!r} "
                f"({loss:.4f}).",
                "",
            ]
        pairs = [(a, b) for a, b in compare if a in budget["arms"] and b in budget["arms"]]
        if pairs:
            lines += [
                "Further comparisons (report.compare), Holm-adjusted across these rows:",
                "",
                *markdown_table(HEADERS, budget_rows(prune, budget, pairs)),
            ]
    for image in images:
        lines += [f"![{Path(image).stem}]({image})", ""]
    return "\n".join(lines)
