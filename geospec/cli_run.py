"""``geospec run`` (the whole pipeline) and ``geospec report`` (rebuild the report)."""

from __future__ import annotations

from pathlib import Path

import click

from geospec.executor import STAGES

STAGE = click.Choice(STAGES)


@click.command()
@click.argument("spec_path", metavar="SPEC", type=click.Path(path_type=Path))
@click.option("--from", "from_stage", type=STAGE, help="Redo this stage and every later one.")
@click.option("--until", "until_stage", type=STAGE, help="Stop after this stage.")
@click.option("--out", type=click.Path(path_type=Path), help="Run directory (overrides spec.out).")
def run(spec_path: Path, from_stage: str | None, until_stage: str | None, out: Path | None) -> None:
    """Run the pipeline of SPEC: reference, probe, measure, diagnose, solve, train, report.

    Finished stages are skipped; an interrupted run resumes where it stopped.
    """
    from geospec.cli import _warn_broken_plugins
    from geospec.executor import run_pipeline
    from geospec.specfile import load_spec

    _warn_broken_plugins()
    spec = load_spec(spec_path)
    run_pipeline(spec, spec_path, from_stage=from_stage, until_stage=until_stage, run_dir=out)


@click.command()
@click.argument("run_dir", metavar="RUN_DIR", type=click.Path(path_type=Path))
@click.option("--no-plots", is_flag=True, help="Skip the PNG plots.")
def report(run_dir: Path, no_plots: bool) -> None:
    """Rebuild results.json, report.md and plots/ from RUN_DIR's artifacts."""
    from geospec.errors import UsageError
    from geospec.report import print_table, write_report

    if not run_dir.is_dir():
        raise UsageError(f"{run_dir}: no such run directory")
    results = write_report(run_dir, plots=not no_plots)
    print_table(results)
    click.echo(f"report: {run_dir / 'report.md'}")
