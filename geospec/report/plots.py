"""Figures written into a run directory's ``plots/``: headless matplotlib, atomic PNG writes.

The report's figures (profiles, widths, validation curves, paired differences) and the diagnose
stage's (``diagnostics.png``, ``additivity.png``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from geospec.report.diagnostics import number
from geospec.storage.atomic import atomic_path


def pyplot() -> Any:
    """matplotlib.pyplot on the headless Agg backend (imported only when plotting)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


class PlotDir:
    """Saves figures as ``plots/<name>`` and remembers their paths relative to the run directory."""

    def __init__(self, run_dir: str | Path) -> None:
        self.path = Path(run_dir) / "plots"
        self.path.mkdir(parents=True, exist_ok=True)
        self.written: list[str] = []
        self.plt = pyplot()

    def save(self, fig: Any, name: str) -> None:
        with atomic_path(self.path / name) as tmp:
            fig.savefig(tmp, format="png", dpi=110, bbox_inches="tight")
        self.plt.close(fig)
        self.written.append(f"plots/{name}")


def write_plots(
    run_dir: Path, results: dict[str, Any], curves: dict[str, dict[str, list[Any]]]
) -> list[str]:
    plots = PlotDir(run_dir)
    plt, save = plots.plt, plots.save

    profiles = results["profiles"]
    reliability = (results.get("reliability") or {}).get("profiles", {})
    errors_of = {name: entry["se"] for name, entry in reliability.items()}
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
                errors = errors_of.get(f"{statistic}/{geometry}")
                if errors is not None:  # the mean of the replicates, +/- its standard error
                    bars = [e if e is not None else 0.0 for e in errors]
                    ax.errorbar(range(len(values)), values, yerr=bars, marker="o", ms=3, capsize=2)
                else:
                    ax.plot(range(len(values)), values, marker="o", ms=3)
                ax.set_title(f"{statistic} / {geometry}", fontsize=9)
                ax.set_xlabel("layer", fontsize=8)
                ax.tick_params(labelsize=7)
        note = " (mean ± SE over token samples)" if errors_of else ""
        fig.suptitle(f"Geometric work per layer (reference model){note}")
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
            label: str | None = name  # on the arm's first drawn seed (seed 0 may be untrained)
            for points in arm_curves.values():
                if points:
                    steps, losses = zip(*points, strict=True)
                    ax.plot(steps, losses, color=color, alpha=0.8, lw=1, label=label)
                    label = None
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
        ax.set_title(f"Local additivity (R² = {number(r2, 3)})", fontsize=9)
        save(fig, "additivity.png")
    return plots.written


def demand_plot(
    run_dir: Path, demand: Mapping[str, Any], others: Mapping[str, Sequence[float]]
) -> list[str]:
    """``plots/demand.png``: every layer's loss increase against the fraction kept (dots) with
    its fitted power law (line), and the measured increase at ``pair_keep`` and the fitted
    lambda_l beside the other profiles (each scaled to its own maximum, so shapes compare on one
    axis)."""
    plots = PlotDir(run_dir)
    plt, save = plots.plt, plots.save
    import numpy as np
    from matplotlib.ticker import MaxNLocator

    layers = demand["layers"]
    fig, (curves, beside) = plt.subplots(1, 2, figsize=(10.0, 4.2))
    colours = plt.get_cmap("viridis")(np.linspace(0, 1, max(len(layers), 2)))
    grid = np.linspace(min(demand["keep"]), 1.0, 60)
    for row, colour in zip(layers, colours, strict=False):
        curves.scatter(demand["keep"], row["increase"], s=10, color=colour)
        lam, a = row["fit"]["lambda"], row["fit"]["exponent"]
        curves.plot(grid, lam * (grid**-a - 1), color=colour, lw=0.9)
    curves.set_xlabel("fraction of the layer's neurons kept", fontsize=8)
    curves.set_ylabel("validation loss increase", fontsize=8)
    curves.set_yscale("symlog", linthresh=1e-3)
    curves.set_title("Demand: one curve per layer (dark: first)", fontsize=9)
    index = [row["layer"] for row in layers]

    def scaled(values: Sequence[float]) -> list[float]:
        top = max((abs(v) for v in values), default=0.0)
        return [v / top if top > 0 else 0.0 for v in values]

    keep = demand["additivity"]["keep"]
    measured = demand["profiles"][f"demand/f{keep:g}"]
    beside.plot(index, scaled(measured), color="black", lw=2, label=f"Δloss at {keep:g}")
    lam = demand["profiles"]["demand/lambda"]
    beside.plot(index, scaled(lam), color="black", lw=1, ls="--", label="λ (fitted)")
    for name in sorted(others):
        if len(others[name]) == len(index):
            beside.plot(index, scaled(others[name]), lw=0.8, alpha=0.7, label=name)
    beside.xaxis.set_major_locator(MaxNLocator(integer=True))
    beside.set_xlabel("layer", fontsize=8)
    beside.set_title("Demand beside the other profiles (each / its max)", fontsize=9)
    beside.legend(fontsize=6, ncol=2)
    for ax in (curves, beside):
        ax.tick_params(labelsize=7)
    fig.tight_layout()
    save(fig, "demand.png")
    return plots.written


def prune_plot(run_dir: Path, prune: Mapping[str, Any]) -> list[str]:
    """``plots/prune.png``: per keep fraction and eval corpus, every arm's perplexity on each
    calibration seed (dots) and their mean (bar), the unpruned reference as a dashed line."""
    import math

    plots = PlotDir(run_dir)
    plt, save = plots.plt, plots.save
    budgets, corpora = prune["budgets"], prune["corpora"]
    fig, axes = plt.subplots(
        len(budgets), len(corpora), figsize=(4.6 * len(corpora), 3.2 * len(budgets)), squeeze=False
    )
    for row, budget in enumerate(budgets):
        names = list(budget["arms"])
        for column, corpus in enumerate(corpora):
            ax = axes[row][column]
            for index, name in enumerate(names):
                seeds = [math.exp(v) for v in budget["arms"][name]["loss"][corpus].values()]
                ax.barh(index, sum(seeds) / len(seeds), color=f"C{index % 10}", alpha=0.5)
                ax.scatter(seeds, [index] * len(seeds), s=9, color="black", zorder=3)
            ax.axvline(math.exp(prune["reference"][corpus]), color="grey", ls="--", lw=1)
            ax.set_yticks(range(len(names)), names, fontsize=7)
            ax.invert_yaxis()
            ax.tick_params(axis="x", labelsize=7)
            ax.set_title(f"keep {budget['keep']:g}, {corpus}", fontsize=9)
            ax.set_xlabel("perplexity (dashed: unpruned)", fontsize=8)
    fig.tight_layout()
    save(fig, "prune.png")
    if any("search" in arm for budget in budgets for arm in budget["arms"].values()):
        search_plot(plots, budgets)
    return plots.written


def search_plot(plots: PlotDir, budgets: Sequence[Mapping[str, Any]]) -> None:
    """``plots/search.png``: per keep fraction, each search arm's fitness per generation on
    every calibration seed (left: one colour per search, one line style per seed; the legend
    says why each stopped, by its cap of generations or by patience, and at which generation;
    with patience also the parent's fitness on the tracked windows, thin, and a vertical line
    where patience stopped it), and the widths per layer on the first seed (right: the searched
    widths bold, the heuristics thin, a sweep such as OWL's grid as the setting its calibration
    loss chose, so the panel stays readable)."""
    from geospec.report.prune import unchosen_settings

    fig, axes = plots.plt.subplots(len(budgets), 2, figsize=(10, 3.4 * len(budgets)), squeeze=False)
    styles = ("-", "--", ":", "-.")
    for row, budget in enumerate(budgets):
        path, widths = axes[row]
        dropped = unchosen_settings(budget)
        searches = [name for name, arm in budget["arms"].items() if "search" in arm]
        heuristics = [
            name for name in budget["arms"] if name not in dropped and name not in searches
        ]
        for index, name in enumerate(heuristics):  # tab10 for the heuristics, thin
            first = next(iter(budget["arms"][name]["widths"].values()))
            widths.plot(range(len(first)), first, color=f"C{index % 10}", lw=0.9, label=name)
        for index, name in enumerate(searches):  # dark, bold, never a heuristic's colour
            colour, marker = (("black", "o"), ("teal", "s"), ("dimgrey", "^"))[index % 3]
            arm = budget["arms"][name]
            for order, (seed, found) in enumerate(arm["search"].items()):
                steps = range(1, len(found["fitness"]) + 1)
                style = styles[order % len(styles)]
                stopped = found.get("stopped") or {}
                why = (
                    ""
                    if not stopped
                    else f"; patience stopped it at {stopped['generation']}"
                    if stopped["by"] == "patience"
                    else f"; its cap of {stopped['generation']}"
                )
                path.plot(steps, found["fitness"], color=colour, lw=1.1, ls=style,
                          label=f"{name} (seed {seed}{why})")  # fmt: skip
                if "tracked" in found:  # the parent on the fixed windows: thin, same style
                    path.plot(steps, found["tracked"], color=colour, lw=0.6, ls=style,
                              alpha=0.6, label=f"{name} (seed {seed}): tracked")  # fmt: skip
                if stopped.get("by") == "patience":  # where patience ended it
                    path.axvline(stopped["generation"], color=colour, ls=style, lw=0.6)
            first = next(iter(arm["widths"].values()))
            widths.plot(range(len(first)), first, color=colour, lw=2.0, marker=marker,
                        markersize=3, label=name)  # fmt: skip
        path.set_title(f"keep {budget['keep']:g}: fitness per generation", fontsize=9)
        path.set_xlabel("generation", fontsize=8)
        path.set_ylabel("fitness (calibration windows)", fontsize=8)
        widths.set_title(
            f"keep {budget['keep']:g}: widths (first seed; bold: searched)", fontsize=9
        )
        widths.set_xlabel("layer", fontsize=8)
        widths.set_ylabel("FFN neurons", fontsize=8)
        for ax in (path, widths):
            ax.tick_params(labelsize=7)
        path.legend(fontsize=6)
        widths.legend(fontsize=6, ncol=2, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    plots.save(fig, "search.png")
