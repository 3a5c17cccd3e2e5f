"""``geospec diagnose``: the reference model's diagnostics, without training any arm."""

from __future__ import annotations

from pathlib import Path

import click

from geospec.cli.console import plugin_option, set_option, spec_argument
from geospec.cli.until import from_option, out_option, run_optional_stage, threads_option


@click.command()
@spec_argument
@from_option("diagnose")
@out_option
@threads_option
@set_option
@plugin_option
def diagnose(
    spec_path: Path, from_stage: str | None, out: Path | None, overrides: tuple[str, ...]
) -> None:
    """Diagnose the reference model of SPEC (its own trained model or a pretrained checkpoint).

    Runs the stages reference, probe, measure and diagnose, whether or not [diagnose] is enabled
    in SPEC (its settings are used), writes diagnostics.json and plots/ into the run directory,
    and prints per-layer residual norms, intrinsic dimensions and sensitivities, the correlations
    of the work profiles and the least additive layer pairs. No arm is trained.
    """
    from geospec.report.terminal import print_diagnostics
    from geospec.rundir.layout import DIAGNOSTICS_FILE
    from geospec.rundir.records import read_diagnostics

    run_optional_stage(
        "diagnose", spec_path, overrides, from_stage, out,
        read_diagnostics, DIAGNOSTICS_FILE, print_diagnostics,
    )  # fmt: skip
