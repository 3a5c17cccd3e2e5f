"""``geospec run SPEC``: the pipeline; finished stages are skipped, interrupted ones resume."""

from __future__ import annotations

from pathlib import Path

import click

from geospec.cli.console import plugin_option, set_option, spec_argument
from geospec.cli.until import threads_option
from geospec.pipeline.executor import STAGES
from geospec.spec.sections import Spec

STAGE = click.Choice(STAGES)


@click.command()
@spec_argument
@click.option("--from", "from_stage", type=STAGE, help="Redo this stage and every later one.")
@click.option("--until", "until_stage", type=STAGE, help="Stop after this stage.")
@click.option("--out", type=click.Path(path_type=Path), help="Run directory (overrides spec.out).")
@click.option(
    "--arms",
    metavar="A,B",
    help="Train only these arms (comma-separated); the report says which runs are missing.",
)
@click.option(
    "--seeds",
    metavar="0,1",
    help="Train only these seeds (comma-separated); the report says which runs are missing.",
)
@click.option(
    "--dry-run",
    is_flag=True,
    help="Build every arm's model at full size, train a few steps here and print what the runs "
    "will need on GPUs (geospec rehearse SPEC); runs nothing, writes nothing.",
)
@set_option
@plugin_option
@threads_option
def run(
    spec_path: Path,
    from_stage: str | None,
    until_stage: str | None,
    out: Path | None,
    arms: str | None,
    seeds: str | None,
    dry_run: bool,
    overrides: tuple[str, ...],
) -> None:
    """Run the pipeline of SPEC: reference, probe, measure, diagnose, demand, solve, prune, train,
    eval, report (diagnose, demand, prune and eval where SPEC enables them).

    Finished stages are skipped; an interrupted run resumes where it stopped.
    """
    from geospec.cli.console import stderr, warn_broken_plugins
    from geospec.pipeline.executor import run_pipeline
    from geospec.spec.loading import load_spec

    warn_broken_plugins()
    spec = load_spec(spec_path, overrides)
    if dry_run:
        from geospec.cli.rehearse import show_rehearsal

        show_rehearsal(spec)
        return
    chosen_arms = None if arms is None else _names(arms)
    chosen_seeds = None if seeds is None else _seeds(seeds)
    _check_choice(spec, chosen_arms, chosen_seeds)
    run_pipeline(
        spec,
        spec_path,
        overrides=overrides,
        from_stage=from_stage,
        until_stage=until_stage,
        run_dir=out,
        arms=chosen_arms,
        seeds=chosen_seeds,
        console=stderr(),  # what each stage does; the report's table goes to stdout
    )


def _names(text: str) -> list[str]:
    return [name.strip() for name in text.split(",") if name.strip()]


def _seeds(text: str) -> list[int]:
    from geospec.errors import UsageError

    try:
        return [int(seed) for seed in _names(text)]
    except ValueError:
        raise UsageError(f"--seeds {text!r}: give whole numbers separated by commas") from None


def _check_choice(spec: Spec, arms: list[str] | None, seeds: list[int] | None) -> None:
    """--arms and --seeds name arms and seeds of the spec (one line, exit 2, before any work)."""
    from geospec.errors import UsageError

    names = [arm.name for arm in spec.arms]
    unknown = [arm for arm in arms or () if arm not in names]
    if unknown:
        raise UsageError(f"--arms: {unknown} not among the spec's arms {names}")
    missing = [seed for seed in seeds or () if seed not in spec.train.seeds]
    if missing:
        raise UsageError(f"--seeds: {missing} not in train.seeds {list(spec.train.seeds)}")
