"""``geospec run SPEC``: the pipeline; finished stages are skipped, interrupted ones resume."""

from __future__ import annotations

from pathlib import Path

import click

from geospec.cli.console import set_option
from geospec.pipeline.executor import STAGES

STAGE = click.Choice(STAGES)


@click.command()
@click.argument("spec_path", metavar="SPEC", type=click.Path(path_type=Path))
@click.option("--from", "from_stage", type=STAGE, help="Redo this stage and every later one.")
@click.option("--until", "until_stage", type=STAGE, help="Stop after this stage.")
@click.option("--out", type=click.Path(path_type=Path), help="Run directory (overrides spec.out).")
@set_option
def run(
    spec_path: Path,
    from_stage: str | None,
    until_stage: str | None,
    out: Path | None,
    overrides: tuple[str, ...],
) -> None:
    """Run the pipeline of SPEC: reference, probe, measure, diagnose, demand, solve, prune, train,
    eval, report (diagnose, demand, prune and eval where SPEC enables them).

    Finished stages are skipped; an interrupted run resumes where it stopped.
    """
    from geospec.cli.console import warn_broken_plugins
    from geospec.pipeline.executor import run_pipeline
    from geospec.spec.loading import load_spec

    warn_broken_plugins()
    spec = load_spec(spec_path, overrides)
    run_pipeline(
        spec,
        spec_path,
        overrides=overrides,
        from_stage=from_stage,
        until_stage=until_stage,
        run_dir=out,
    )
