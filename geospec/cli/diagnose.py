"""``geospec diagnose``: the reference model's diagnostics, without training any arm."""

from __future__ import annotations

import os
from pathlib import Path

import click

from geospec.cli.console import set_option
from geospec.pipeline.executor import STAGES

UP_TO_DIAGNOSE = STAGES[: STAGES.index("diagnose") + 1]


@click.command()
@click.argument("spec_path", metavar="SPEC", type=click.Path(path_type=Path))
@click.option(
    "--from",
    "from_stage",
    type=click.Choice(UP_TO_DIAGNOSE),
    help="Redo this stage and every later one up to diagnose.",
)
@click.option("--out", type=click.Path(path_type=Path), help="Run directory (overrides spec.out).")
@set_option
def diagnose(
    spec_path: Path, from_stage: str | None, out: Path | None, overrides: tuple[str, ...]
) -> None:
    """Diagnose the reference model of SPEC (its own trained model or a pretrained checkpoint).

    Runs the stages reference, probe, measure and diagnose, whether or not [diagnose] is enabled
    in SPEC (its settings are used), writes diagnostics.json and plots/ into the run directory,
    and prints per-layer residual norms, intrinsic dimensions and sensitivities, the correlations
    of the work profiles and the least additive layer pairs. No arm is trained.
    """
    from geospec.cli.console import warn_broken_plugins
    from geospec.errors import GeospecError
    from geospec.pipeline.executor import run_pipeline
    from geospec.pipeline.run_dir import DIAGNOSTICS_FILE
    from geospec.pipeline.stages.diagnose import read_diagnostics
    from geospec.report.terminal import print_diagnostics
    from geospec.spec.loading import load_spec

    warn_broken_plugins()
    spec = load_spec(spec_path, overrides)
    if not spec.diagnose.enabled:
        enabled = spec.diagnose.model_copy(update={"enabled": True})
        spec = spec.model_copy(update={"diagnose": enabled})
    run_dir = out or Path(spec.run_dir)
    run_pipeline(
        spec,
        spec_path,
        overrides=overrides,
        from_stage=from_stage,
        until_stage="diagnose",
        run_dir=run_dir,
    )
    if os.environ.get("RANK", "0") != "0":
        return  # under torchrun, rank 0 alone reports
    diagnostics = read_diagnostics(run_dir)
    if diagnostics is None:
        raise GeospecError(f"{run_dir}: the diagnose stage wrote no diagnostics.json")
    print_diagnostics(diagnostics)
    click.echo(f"diagnostics: {run_dir / DIAGNOSTICS_FILE}")
