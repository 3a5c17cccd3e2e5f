"""``geospec eval SPEC``: score every trained arm x seed, and every pruned model a [prune]
exports, on the spec's lm-eval tasks."""

from __future__ import annotations

from pathlib import Path

import click

from geospec.cli.console import plugin_option, set_option, spec_argument


@click.command(name="eval")
@spec_argument
@click.option(
    "--again", is_flag=True, help="Evaluate every run again (after upgrading lm-eval, say)."
)
@click.option("--out", type=click.Path(path_type=Path), help="Run directory (overrides spec.out).")
@set_option
@plugin_option
def evaluate(spec_path: Path, again: bool, out: Path | None, overrides: tuple[str, ...]) -> None:
    """Evaluate every trained arm x seed of SPEC, and every pruned model its [prune] exports, on
    its [eval] tasks with lm-evaluation-harness (pip install "geospec[eval]"), then rebuild the
    report.

    Runs the pipeline as `geospec run` does, up to the eval stage (stages already done are
    skipped; runs not trained yet are trained first, units not pruned yet are pruned) and the
    report: each run is exported as a transformers checkpoint to a temporary directory and
    scored, each pruned model read from its export at its true widths; the scores go to the
    run's or unit's eval.json, and results.json and report.md compare every metric with the
    baseline, paired by seed (a pruned model by calibration seed). Models evaluated with the
    same settings are not evaluated again.
    """
    from geospec.cli.console import stderr, warn_broken_plugins
    from geospec.errors import UsageError
    from geospec.pipeline.executor import run_pipeline
    from geospec.spec.loading import load_spec

    warn_broken_plugins()
    spec = load_spec(spec_path, overrides)
    if spec.eval is None:
        raise UsageError(
            f"{spec_path}: no [eval] section; add one naming the tasks, for example\n"
            '  [eval]\n  tasks = ["geospec_austen_lastword"]'
        )
    run_pipeline(
        spec,
        spec_path,
        overrides=overrides,
        from_stage="eval" if again else None,
        run_dir=out,
        console=stderr(),  # what each stage does; the report's tables go to stdout
    )
