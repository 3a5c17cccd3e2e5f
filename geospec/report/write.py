"""Writing a run's report: results.json, report.md and plots/, from the run directory."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from geospec.report.results import build_results
from geospec.rundir.artifacts import read_json
from geospec.rundir.layout import REPORT_FILE, RESULTS_FILE, RUN_FILE
from geospec.rundir.records import read_demand, read_diagnostics, read_prune
from geospec.storage.atomic import atomic_write_json, atomic_write_text
from geospec.storage.digests import sealed

#: Figures the diagnose stage draws; the report shows those that exist.
DIAGNOSTIC_PLOTS = ("plots/diagnostics.png", "plots/additivity.png")
#: The figure the demand stage draws.
DEMAND_PLOT = "plots/demand.png"


def write_report(run_dir: Path, plots: bool = True) -> dict[str, Any]:
    """Write results.json, report.md and plots/ from the run directory's artifacts."""
    from geospec.report.markdown import markdown

    results = build_results(run_dir)
    curves = results.pop("curves")
    results = sealed(results)  # report.md and the table show exactly what results.json holds
    atomic_write_json(run_dir / RESULTS_FILE, results)
    images: list[str] = []
    if plots:
        from geospec.report.plots import write_plots

        images = write_plots(run_dir, results, curves)
    text = markdown(results, images)
    diagnostics = read_diagnostics(run_dir)
    if diagnostics is not None:  # the diagnose stage ran: add its tables and its plots
        from geospec.report.diagnostics import diagnostics_markdown

        drawn = [name for name in DIAGNOSTIC_PLOTS if plots and (run_dir / name).exists()]
        text += "\n" + diagnostics_markdown(diagnostics, drawn)
    demand = read_demand(run_dir)
    if demand is not None:  # the demand stage ran
        from geospec.report.demand import demand_markdown

        drawn = [DEMAND_PLOT] if plots and (run_dir / DEMAND_PLOT).exists() else []
        text += "\n" + demand_markdown(demand, drawn)
    prune = read_prune(run_dir)
    if prune is not None:  # the prune stage ran
        from geospec.report.prune import prune_markdown, with_unit_scores

        prune = with_unit_scores(prune, run_dir)  # the pruned models' lm-eval scores, if any
        drawn = []
        if plots:
            from geospec.report.plots import prune_plot

            drawn = prune_plot(run_dir, prune)
        compare = [(a, b) for a, b in read_json(run_dir / RUN_FILE).get("compare", [])]
        text += "\n" + prune_markdown(prune, drawn, compare)
    atomic_write_text(run_dir / REPORT_FILE, text)
    return results
