"""Diagnostics as tables (report.md and the terminal) and plots, from diagnostics.json.

The rows are built once (:func:`layer_rows`, :func:`profile_rows`, :func:`pair_rows`) and rendered
as Markdown or rich tables, so the report and ``geospec diagnose`` always show the same numbers.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from geospec.plotting import PlotDir

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


def _num(value: float | None, digits: int = 4) -> str:
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
            _num(row["residual_norm"], 2),
            _num(row["residual_norm_out"], 2),
            _num(row["twonn"]["dimension"], 2),
            _num(row["twonn"]["r2"], 3),
            _num(row["loss_scale"]),
            _num(row["loss_remove"]),
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
            _num(p["joint"]),
            _num(p["sum_of_singles"]),
            _num(p["interaction"]),
        ]
        for p in diagnostics["additivity"]["worst"]
    ]


def _summary_lines(diagnostics: Mapping[str, Any]) -> list[str]:
    loss = diagnostics["loss"]
    additivity = diagnostics["additivity"]
    r2 = additivity["r2"]
    lines = [
        f"Loss on {loss['windows']} validation windows ({loss['tokens']:,} tokens): "
        f"{loss['base']:.4f}. Δloss scaled: the loss increase when the layer's FFN sub-layer "
        f"output is multiplied by 1 - eps = {1 - loss['eps']:g}; removed: multiplied by 0.",
        f"Local additivity over {len(additivity['pairs'])} layer pairs "
        f"({additivity['perturbation']}): R² of the joint change against the sum of the "
        f"singles = {_num(r2, 4)}.",
    ]
    return lines


def _markdown_table(headers: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return [*lines, ""]


def diagnostics_markdown(diagnostics: Mapping[str, Any], images: list[str]) -> str:
    """The report.md section for diagnostics.json (tables, then the plots given)."""
    lines = ["## Diagnostics of the reference model", ""]
    for line in _summary_lines(diagnostics):
        lines += [line, ""]
    lines += _markdown_table(LAYER_HEADERS, layer_rows(diagnostics))
    rows = profile_rows(diagnostics)
    if rows:
        lines += [
            "Spearman rank correlation of each work profile with the residual-stream norm (scale "
            "sensitivity; * marks scale-sensitive geometries) and with layer sensitivity.",
            "",
        ]
        lines += _markdown_table(PROFILE_HEADERS, rows)
    pairs = pair_rows(diagnostics)
    if pairs:
        lines += ["Layer pairs furthest from additive:", ""]
        lines += _markdown_table(PAIR_HEADERS, pairs)
    for image in images:
        lines += [f"![{Path(image).stem}]({image})", ""]
    return "\n".join(lines)


def print_diagnostics(diagnostics: Mapping[str, Any], console: Any = None) -> None:
    """The same tables on the terminal (``geospec diagnose``)."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    for headers, rows, title in (
        (LAYER_HEADERS, layer_rows(diagnostics), "per layer"),
        (PROFILE_HEADERS, profile_rows(diagnostics), "work profiles (* scale-sensitive)"),
        (PAIR_HEADERS, pair_rows(diagnostics), "least additive layer pairs"),
    ):
        if not rows:
            continue
        table = Table(title=f"diagnostics: {title}", title_justify="left")
        for header in headers:
            table.add_column(header, justify="left" if header in ("profile", "layers") else "right")
        for row in rows:
            table.add_row(*row)
        console.print(table)
    for line in _summary_lines(diagnostics):
        console.print(line, highlight=False)


def diagnostic_plots(run_dir: Path, diagnostics: Mapping[str, Any]) -> list[str]:
    """``plots/diagnostics.png`` (per-layer panels) and ``plots/additivity.png`` (with pairs)."""
    plots = PlotDir(run_dir)
    plt, save = plots.plt, plots.save
    from matplotlib.ticker import MaxNLocator

    layers = diagnostics["layers"]
    index = [row["layer"] for row in layers]
    fig, axes = plt.subplots(2, 2, figsize=(8.4, 5.6))
    norms = [("‖x‖", "residual_norm"), ("‖y‖", "residual_norm_out")]
    panels = [
        (axes[0][0], "residual-stream norm", norms),
        (axes[1][0], "Δloss, FFN scaled by 1 - eps", [("scaled", "loss_scale")]),
        (axes[1][1], "Δloss, FFN removed", [("removed", "loss_remove")]),
    ]
    for ax, title, series in panels:
        for label, key in series:
            ax.plot(index, [row[key] for row in layers], marker="o", ms=3, label=label)
        ax.set_title(title, fontsize=9)
        if len(series) > 1:
            ax.legend(fontsize=7)
    ax = axes[0][1]
    ax.plot(index, [row["twonn"]["dimension"] for row in layers], marker="o", ms=3)
    ax.set_title("intrinsic dimension (TwoNN)", fontsize=9)
    for ax in axes.flat:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("layer", fontsize=8)
        ax.tick_params(labelsize=7)
    fig.suptitle("Diagnostics of the reference model")
    fig.tight_layout()
    save(fig, "diagnostics.png")

    pairs = diagnostics["additivity"]["pairs"]
    if pairs:
        fig, ax = plt.subplots(figsize=(4.4, 4.0))
        singles = [p["sum_of_singles"] for p in pairs]
        joint = [p["joint"] for p in pairs]
        ax.scatter(singles, joint, s=12)
        low, high = min(singles + joint), max(singles + joint)
        ax.plot([low, high], [low, high], color="grey", lw=1, ls="--")
        ax.set_xlabel("sum of single-layer Δloss")
        ax.set_ylabel("joint Δloss")
        r2 = diagnostics["additivity"]["r2"]
        ax.set_title(f"Local additivity (R² = {_num(r2, 3)})", fontsize=9)
        save(fig, "additivity.png")
    return plots.written
