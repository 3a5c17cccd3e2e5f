"""What the commands that run the pipeline up to one stage share (``geospec diagnose``,
``geospec demand``, ``geospec prune``): their ``--from`` and ``--out`` options, and the run;
for the two optional measurements (diagnose, demand), the stage turned on and its record read."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

import click

from geospec.pipeline.executor import STAGES
from geospec.spec.sections import Spec


def from_option(stage: str) -> Callable[[Any], Any]:
    """``--from STAGE``, any stage up to ``stage``."""
    return click.option(
        "--from",
        "from_stage",
        type=click.Choice(STAGES[: STAGES.index(stage) + 1]),
        help=f"Redo this stage and every later one up to {stage}.",
    )


def _set_threads(ctx: click.Context, param: click.Parameter, threads: int | None) -> None:
    from geospec.hardware import check_threads

    if threads is not None:  # checked and set before anything runs; None keeps torch's own
        checked = check_threads(threads)
        from geospec.engine.precision import set_threads

        set_threads(checked)


threads_option = click.option(
    "--threads",
    type=int,
    default=None,
    expose_value=False,
    callback=_set_threads,
    help="CPU threads for every forward pass (default: torch's, one per physical core); give "
    "each job its share when several share a machine (train.threads still sets training's).",
)

out_option = click.option(
    "--out", type=click.Path(path_type=Path), help="Run directory (overrides spec.out)."
)


def run_until(
    stage: str | Callable[[Spec], str],
    spec_path: Path,
    overrides: tuple[str, ...],
    from_stage: str | None,
    out: Path | None,
    adapt: Callable[[Spec], Spec] = lambda spec: spec,
    prune_arms: Sequence[str] | None = None,
    prune_keep: Sequence[float] | None = None,
) -> tuple[Spec, Path] | None:
    """Load the spec (``--set`` applied, then ``adapt``: a command enabling its own stage and
    checking its options), run the stages up to ``stage`` (only the prune units ``prune_arms``
    and ``prune_keep`` choose: :func:`~geospec.pipeline.executor.run_pipeline`) and return the
    spec and run directory; None on the ranks other than 0 under torchrun, which report
    nothing. ``stage`` may be chosen from the loaded spec."""
    from geospec.cli.console import stderr, warn_broken_plugins
    from geospec.pipeline.executor import run_pipeline
    from geospec.spec.loading import load_spec

    warn_broken_plugins()
    spec = adapt(load_spec(spec_path, overrides))
    run_dir = out or Path(spec.run_dir)
    run_pipeline(
        spec,
        spec_path,
        overrides=overrides,
        from_stage=from_stage,
        until_stage=stage if isinstance(stage, str) else stage(spec),
        run_dir=run_dir,
        console=stderr(),  # what each stage does; the command prints its result to stdout
        prune_arms=prune_arms,
        prune_keep=prune_keep,
    )
    if os.environ.get("RANK", "0") != "0":
        return None
    return spec, run_dir


def run_optional_stage(
    stage: Literal["diagnose", "demand"],
    spec_path: Path,
    overrides: tuple[str, ...],
    from_stage: str | None,
    out: Path | None,
    read: Callable[[Path], dict[str, Any] | None],
    file_name: str,
    show: Callable[[dict[str, Any]], None],
) -> None:
    """Run the stages up to the optional ``stage`` with its section enabled whether or not the
    spec enables it (its settings kept), then ``show`` the record it wrote (``read`` from the
    run directory) and print where it is; under torchrun rank 0 alone reports."""
    from geospec.errors import GeospecError

    def enabled(spec: Spec) -> Spec:
        settings = getattr(spec, stage)
        if settings.enabled:
            return spec
        return spec.model_copy(update={stage: settings.model_copy(update={"enabled": True})})

    done = run_until(stage, spec_path, overrides, from_stage, out, adapt=enabled)
    if done is None:
        return
    run_dir = done[1]
    record = read(run_dir)
    if record is None:
        raise GeospecError(f"{run_dir}: the {stage} stage wrote no {file_name}")
    show(record)
    click.echo(f"{Path(file_name).stem}: {run_dir / file_name}")
