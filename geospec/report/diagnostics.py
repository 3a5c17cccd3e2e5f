"""Diagnostics as table rows, from diagnostics.json, and the report.md section.

The rows are built once (:func:`layer_rows`, :func:`profile_rows`, :func:`pair_rows`) and rendered
as Markdown here or as rich tables (:mod:`geospec.report.terminal`), so the report and ``geospec
diagnose`` always show the same numbers.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

LAYER_HEADERS = [
    "layer",
    "mean ‖x‖",
    "mean ‖y‖",
    "d (TwoNN)",
    "TwoNN R²",
    "Δloss scaled",
    "Δloss removed",
]
PROFILE_HEADERS = ["profile", "ρ vs ‖x‖", "ρ vs Δloss scaled", "ρ vs Δloss removed"]
PAIR_HEADERS = ["layers", "joint Δloss", "sum of singles", "interaction"]


def number(value: float | None, digits: int = 4) -> str:
    if value is None:
        return "-"
    if abs(value) >= 1e4 or 0 < abs(value) < 1e-3:
        return f"{value:.{digits}g}"
    return f"{value:.{digits}f}"


def _rho(entry: Mapping[str, Any] | None) -> str:
    if entry is None or entry.get("rho") is None:
        return "-"
    p = entry.get("p")
    return f"{entry['rho']:+.2f}" + (f" (p {p:.2g})" if p is not None else "")


def layer_rows(diagnostics: Mapping[str, Any]) -> list[list[str]]:
    return [
        [
            str(row["layer"]),
            number(row["residual_norm"], 2),
            number(row["residual_norm_out"], 2),
            number(row["twonn"]["dimension"], 2),
            number(row["twonn"]["r2"], 3),
            number(row["loss_scale"]),
            number(row["loss_remove"]),
        ]
        for row in diagnostics["layers"]
    ]


def profile_rows(diagnostics: Mapping[str, Any]) -> list[list[str]]:
    """One row per measured work profile; scale-sensitive geometries (raw) are starred."""
    rows = []
    for name, entry in diagnostics.get("correlations", {}).items():
        label = f"{name} *" if entry["scale_sensitive"] else name
        rows.append(
            [
                label,
                _rho(entry["residual_norm"]),
                _rho(entry["sensitivity_scale"]),
                _rho(entry["sensitivity_remove"]),
            ]
        )
    return rows


def pair_rows(diagnostics: Mapping[str, Any]) -> list[list[str]]:
    return [
        [
            f"{p['layers'][0]}, {p['layers'][1]}",
            number(p["joint"]),
            number(p["sum_of_singles"]),
            number(p["interaction"]),
        ]
        for p in diagnostics["additivity"]["worst"]
    ]


def split_name(loss: Mapping[str, Any]) -> str:
    """Which split a recorded loss was measured on (records without ``split``: validation)."""
    return "training" if loss.get("split") == "train" else "validation"


def summary_lines(diagnostics: Mapping[str, Any]) -> list[str]:
    loss = diagnostics["loss"]
    additivity = diagnostics["additivity"]
    r2 = additivity["r2"]
    lines = [
        f"Loss on {loss['windows']} {split_name(loss)} windows ({loss['tokens']:,} tokens): "
        f"{loss['base']:.4f}. Δloss scaled: the loss increase when the layer's FFN sub-layer "
        f"output is multiplied by 1 - eps = {1 - loss['eps']:g}; removed: multiplied by 0.",
        f"Local additivity over {len(additivity['pairs'])} layer pairs "
        f"({additivity['perturbation']}): R² of the joint change against the sum of the "
        f"singles = {number(r2, 4)}.",
    ]
    return lines


def diagnostics_markdown(diagnostics: Mapping[str, Any], images: list[str]) -> str:
    """The report.md section for diagnostics.json (tables, then the plots given)."""
    from geospec.report.markdown import markdown_table

    lines = ["## Diagnostics of the reference model", ""]
    for line in summary_lines(diagnostics):
        lines += [line, ""]
    lines += markdown_table(LAYER_HEADERS, layer_rows(diagnostics))
    rows = profile_rows(diagnostics)
    if rows:
        lines += [
            "Spearman rank correlation of each work profile with the residual-stream norm (scale "
            "sensitivity; * marks scale-sensitive geometries) and with layer sensitivity.",
            "",
        ]
        lines += markdown_table(PROFILE_HEADERS, rows)
    pairs = pair_rows(diagnostics)
    if pairs:
        lines += ["Layer pairs furthest from additive:", ""]
        lines += markdown_table(PAIR_HEADERS, pairs)
    for image in images:
        lines += [f"![{Path(image).stem}]({image})", ""]
    return "\n".join(lines)
