"""``geospec prune``: the pretrained reference pruned to budgets with every [prune] arm."""

from __future__ import annotations

import os
from pathlib import Path

import click

from geospec.cli.console import set_option
from geospec.pipeline.executor import STAGES

UP_TO_PRUNE = STAGES[: STAGES.index("prune") + 1]


@click.command()
@click.argument("spec_path", metavar="SPEC", type=click.Path(path_type=Path))
@click.option(
    "--from",
    "from_stage",
    type=click.Choice(UP_TO_PRUNE),
    help="Redo this stage and every later one up to prune.",
)
@click.option("--out", type=click.Path(path_type=Path), help="Run directory (overrides spec.out).")
@set_option
def prune(
    spec_path: Path, from_stage: str | None, out: Path | None, overrides: tuple[str, ...]
) -> None:
    """Prune SPEC's pretrained reference.checkpoint to each [prune] keep fraction with every
    [prune] arm's allocation and each calibration seed (docs/prune.md).

    Runs the stages up to prune (profiles, diagnostics and demand where SPEC enables them, for
    the arms that read them), writes every pruned model's losses (and, with export, its
    transformers checkpoint) under prune/, prune.json and report.md's pruning section, and
    prints the comparison with the baseline arm. An interrupted prune resumes.
    """
    from geospec.cli.console import warn_broken_plugins
    from geospec.errors import UsageError
    from geospec.pipeline.executor import run_pipeline
    from geospec.pipeline.run_dir import REPORT_FILE
    from geospec.pipeline.stages.prune import read_prune
    from geospec.report.prune import prune_markdown
    from geospec.spec.loading import load_spec

    warn_broken_plugins()
    spec = load_spec(spec_path, overrides)
    if spec.prune is None:
        raise UsageError(f"{spec_path}: no [prune] section; add one (docs/prune.md)")
    run_dir = out or Path(spec.run_dir)
    run_pipeline(
        spec,
        spec_path,
        overrides=overrides,
        from_stage=from_stage,
        until_stage="prune",
        run_dir=run_dir,
    )
    if os.environ.get("RANK", "0") != "0":
        return
    record = read_prune(run_dir)
    if record is None:
        raise UsageError(f"{run_dir}: the prune stage wrote no prune.json")
    from geospec.atomic import atomic_write_text

    text = prune_markdown(record)
    atomic_write_text(run_dir / "prune" / REPORT_FILE, text)
    click.echo(text)
    click.echo(f"\nprune: {run_dir / 'prune.json'}, {run_dir / 'prune' / REPORT_FILE}")
