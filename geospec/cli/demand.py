"""``geospec demand``: what each layer's FFN needs, measured by cutting it on the reference."""

from __future__ import annotations

from pathlib import Path

import click

from geospec.cli.console import plugin_option, set_option, spec_argument
from geospec.cli.until import from_option, out_option, run_optional_stage, threads_option


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
    from geospec.report.terminal import print_demand
    from geospec.rundir.layout import DEMAND_FILE
    from geospec.rundir.records import read_demand

    run_optional_stage(
        "demand", spec_path, overrides, from_stage, out,
        read_demand, DEMAND_FILE, print_demand,
    )  # fmt: skip
