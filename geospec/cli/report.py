"""``geospec report RUN_DIR``: rebuild results.json, report.md and plots/ from a run directory."""

from __future__ import annotations

from pathlib import Path

import click


@click.command()
@click.argument("run_dir", metavar="RUN_DIR", type=click.Path(path_type=Path))
@click.option("--no-plots", is_flag=True, help="Skip the PNG plots.")
def report(run_dir: Path, no_plots: bool) -> None:
    """Rebuild results.json, report.md and plots/ from RUN_DIR's artifacts."""
    from geospec.errors import UsageError
    from geospec.report.terminal import print_table
    from geospec.report.write import write_report

    if not run_dir.is_dir():
        raise UsageError(f"{run_dir}: no such run directory")
    results = write_report(run_dir, plots=not no_plots)
    print_table(results)
    click.echo(f"report: {run_dir / 'report.md'}")
