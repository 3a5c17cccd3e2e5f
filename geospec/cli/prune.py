"""``geospec prune``: the pretrained reference pruned to budgets with every [prune] arm."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import click

from geospec.cli.console import plugin_option, set_option, spec_argument
from geospec.cli.until import from_option, out_option, run_until
from geospec.spec.sections import Spec


@click.command()
@spec_argument
@from_option("prune")
@out_option
@set_option
@plugin_option
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
    from geospec.atomic import atomic_write_text
    from geospec.errors import UsageError
    from geospec.layout import PRUNE_DIR, PRUNE_FILE, REPORT_FILE
    from geospec.pipeline.run_dir import read_prune
    from geospec.report.prune import prune_markdown

    done = run_until("prune", spec_path, overrides, from_stage, out, adapt=_has_prune(spec_path))
    if done is None:
        return  # under torchrun, rank 0 alone reports
    spec, run_dir = done
    record = read_prune(run_dir)
    if record is None:
        raise UsageError(f"{run_dir}: the prune stage wrote no {PRUNE_FILE}")
    text = prune_markdown(record, compare=spec.report.compare)
    atomic_write_text(run_dir / PRUNE_DIR / REPORT_FILE, text)
    click.echo(text)
    click.echo(f"\nprune: {run_dir / PRUNE_FILE}, {run_dir / PRUNE_DIR / REPORT_FILE}")


def _has_prune(spec_path: Path) -> Callable[[Spec], Spec]:
    """A check that the spec has a [prune] section (one line naming the file, exit 2)."""

    def check(spec: Spec) -> Spec:
        from geospec.errors import UsageError

        if spec.prune is None:
            raise UsageError(f"{spec_path}: no [prune] section; add one (docs/prune.md)")
        return spec

    return check
