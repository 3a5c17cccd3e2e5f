"""Measured demand as table rows, from demand.json, and the report.md section.

The rows are built once and rendered as Markdown here or as rich tables (``geospec demand``), so
the report and the terminal show the same numbers.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from geospec.report.diagnostics import number, split_name


def layer_headers(demand: Mapping[str, Any]) -> list[str]:
    fractions = [f"Δloss at {f:g}" for f in demand["keep"]]
    return ["layer", "width", *fractions, "λ", "a", "fit R²", "power law"]


def layer_rows(demand: Mapping[str, Any]) -> list[list[str]]:
    return [
        [
            str(row["layer"]),
            str(row["width"]),
            *(number(v) for v in row["increase"]),
            number(row["fit"]["lambda"]),
            number(row["fit"]["exponent"], 3),
            number(row["fit"]["r2"], 3),
            "yes" if row["fit"]["power_law"] else "**no**",
        ]
        for row in demand["layers"]
    ]


def correlation_headers(demand: Mapping[str, Any]) -> list[str]:
    keep = demand["additivity"]["keep"]
    return [
        "profile",
        f"ρ vs Δloss at {keep:g}",
        "95% interval",
        "ρ vs λ·a",
        "95% interval",
        "ρ vs λ",
        "95% interval",
    ]


def _rho(entry: Mapping[str, Any] | None) -> list[str]:
    if entry is None or entry.get("rho") is None:
        return ["-", "-"]
    p = entry.get("p")
    shown = f"{entry['rho']:+.2f}" + (f" (p {p:.2g})" if p is not None else "")
    return [shown, f"[{entry['low']:+.2f}, {entry['high']:+.2f}]"]


def correlation_rows(demand: Mapping[str, Any]) -> list[list[str]]:
    """One row per other profile, strongest correlation with the measured increase first."""

    def strength(item: tuple[str, Mapping[str, Any]]) -> float:
        entry = item[1].get("increase")
        return -abs(entry["rho"]) if entry and entry.get("rho") is not None else 0.0

    return [
        [name, *_rho(entry.get("increase")), *_rho(entry.get("slope")), *_rho(entry.get("lambda"))]
        for name, entry in sorted(demand.get("correlations", {}).items(), key=strength)
    ]


def summary_lines(demand: Mapping[str, Any]) -> list[str]:
    loss = demand["loss"]
    additivity = demand["additivity"]
    importance = demand["importance"]["kind"]
    lines = [
        f"Each layer's FFN alone keeps a fraction of its neurons (the {importance} ordering's "
        f"best, in multiples of {demand['multiple']}); Δloss is the increase of the loss on "
        f"{loss['windows']} {split_name(loss)} windows ({loss['tokens']:,} tokens) over the uncut "
        f"{loss['base']:.4f}. Fit: Δloss = λ ((w/W)^-a - 1).",
    ]
    missing = [row["layer"] for row in demand["layers"] if not row["fit"]["power_law"]]
    if missing:
        lines.append(f"A power law does not describe layers {missing} (fit R² below 0.9).")
    else:
        lines.append("A power law describes every layer (fit R² at least 0.9).")
    bound = [row["layer"] for row in demand["layers"] if row["fit"].get("exponent_at_bound")]
    if bound:
        lines.append(
            f"The fitted exponent of layers {bound} sits at an end of the searched range "
            "(0.01 or 10), so their curves do not pin a_l: near a = 0.01 the law is "
            "λ a ln(1/f), which fixes only the product λ·a (λ alone is then not comparable "
            "with other layers'; the calibrated schedule's marginal gains depend on λ·a and are "
            "unaffected); at 10 the loss rises only at the smallest fraction."
        )
    if additivity["pairs"]:
        lines.append(
            f"Additivity over {len(additivity['pairs'])} layer pairs, each layer keeping "
            f"{additivity['keep']:g}: joint Δloss against the sum of the singles has slope "
            f"{number(additivity['slope'], 3)} (1: additive) and R² {number(additivity['r2'], 3)}."
        )
    if demand.get("fallback"):
        lines.append(f"Measured with full forward passes: {demand['fallback']}.")
    return lines


def demand_markdown(demand: Mapping[str, Any], images: list[str]) -> str:
    """The report.md section for demand.json (tables, then the plots given)."""
    from geospec.report.markdown import markdown_table

    lines = ["## Measured demand of the reference model", ""]
    for line in summary_lines(demand):
        lines += [line, ""]
    lines += markdown_table(layer_headers(demand), layer_rows(demand))
    rows = correlation_rows(demand)
    if rows:
        lines += [
            "Which profile tracks the measured demand: Spearman rank correlation of each profile "
            "with the measured loss increase, with the fitted λ·a (the slope in ln(1/f) at full "
            "width, pinned even where λ and a alone are not) and with λ; 95% percentile "
            "bootstrap intervals over layers.",
            "",
        ]
        lines += markdown_table(correlation_headers(demand), rows)
    for image in images:
        lines += [f"![{Path(image).stem}]({image})", ""]
    return "\n".join(lines)
