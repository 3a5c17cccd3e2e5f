"""``geospec demand``: what each layer's FFN needs, measured by cutting it on the reference."""

from __future__ import annotations

import os
from pathlib import Path

import click

from geospec.cli.console import set_option
from geospec.pipeline.executor import STAGES

UP_TO_DEMAND = STAGES[: STAGES.index("demand") + 1]


@click.command()
@click.argument("spec_path", metavar="SPEC", type=click.Path(path_type=Path))
@click.option(
    "--from",
    "from_stage",
    type=click.Choice(UP_TO_DEMAND),
    help="Redo this stage and every later one up to demand.",
)
@click.option("--out", type=click.Path(path_type=Path), help="Run directory (overrides spec.out).")
@set_option
def demand(
    spec_path: Path, from_stage: str | None, out: Path | None, overrides: tuple[str, ...]
) -> None:
    """Measure the demand of every layer of SPEC's reference model (its own trained model or a
    pretrained checkpoint).

    Runs the stages up to demand, whether or not [demand] is enabled in SPEC (its settings are
    used): each layer's FFN alone is cut to each keep fraction and the loss increase measured,
    fitted to lambda_l ((w/W)^-a_l - 1); writes demand.json and plots/demand.png into the run
    directory and prints the fits and which profiles track the demand. No arm is trained.
    """
    from geospec.cli.console import warn_broken_plugins
    from geospec.errors import GeospecError
    from geospec.pipeline.executor import run_pipeline
    from geospec.pipeline.run_dir import DEMAND_FILE
    from geospec.pipeline.stages.demand import read_demand
    from geospec.report.terminal import print_demand
    from geospec.spec.loading import load_spec

    warn_broken_plugins()
    spec = load_spec(spec_path, overrides)
    if not spec.demand.enabled:
        enabled = spec.demand.model_copy(update={"enabled": True})
        spec = spec.model_copy(update={"demand": enabled})
    run_dir = out or Path(spec.run_dir)
    run_pipeline(
        spec,
        spec_path,
        overrides=overrides,
        from_stage=from_stage,
        until_stage="demand",
        run_dir=run_dir,
    )
    if os.environ.get("RANK", "0") != "0":
        return  # under torchrun, rank 0 alone reports
    measured = read_demand(run_dir)
    if measured is None:
        raise GeospecError(f"{run_dir}: the demand stage wrote no demand.json")
    print_demand(measured)
    click.echo(f"demand: {run_dir / DEMAND_FILE}")
