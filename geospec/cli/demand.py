"""``geospec demand``: what each layer's FFN needs, measured by cutting it on the reference."""

from __future__ import annotations

from pathlib import Path

import click

from geospec.cli.console import plugin_option, set_option, spec_argument
from geospec.cli.until import from_option, out_option, run_until, threads_option
from geospec.spec.sections import Spec


@click.command()
@spec_argument
@from_option("demand")
@out_option
@threads_option
@set_option
@plugin_option
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
    from geospec.errors import GeospecError
    from geospec.layout import DEMAND_FILE
    from geospec.records import read_demand
    from geospec.report.terminal import print_demand

    done = run_until("demand", spec_path, overrides, from_stage, out, adapt=_enabled)
    if done is None:
        return  # under torchrun, rank 0 alone reports
    run_dir = done[1]
    measured = read_demand(run_dir)
    if measured is None:
        raise GeospecError(f"{run_dir}: the demand stage wrote no demand.json")
    print_demand(measured)
    click.echo(f"demand: {run_dir / DEMAND_FILE}")


def _enabled(spec: Spec) -> Spec:
    """The spec with [demand] enabled (its settings kept)."""
    if spec.demand.enabled:
        return spec
    return spec.model_copy(update={"demand": spec.demand.model_copy(update={"enabled": True})})
