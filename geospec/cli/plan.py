"""``geospec plan RUN_DIR --effect 0.01``: how many paired seeds each comparison needs, from a
finished pilot run's paired standard deviations."""

from __future__ import annotations

import json
from pathlib import Path

import click


@click.command()
@click.argument("run_dir", metavar="RUN_DIR", type=click.Path(path_type=Path))
@click.option(
    "--effect",
    type=float,
    required=True,
    help="The difference in validation loss to detect (nats), for example 0.01.",
)
@click.option(
    "--power",
    type=click.FloatRange(0.5, 0.999),
    default=0.8,
    show_default=True,
    help="The probability of detecting it.",
)
@click.option(
    "--holm",
    is_flag=True,
    help="Plan for Holm's adjustment across the arms: the level divided by the comparisons.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON.")
def plan(run_dir: Path, effect: float, power: float, holm: bool, as_json: bool) -> None:
    """How many paired seeds each comparison of RUN_DIR needs to detect a difference of EFFECT
    with the given power (two-sided paired t-test at the report's confidence), from the paired
    standard deviations of its finished seeds."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from geospec.errors import UsageError
    from geospec.report.power import plan_seeds
    from geospec.report.results import build_results

    if not run_dir.is_dir():
        raise UsageError(f"{run_dir}: no such run directory")
    if not effect > 0:
        raise UsageError(f"--effect {effect}: give the difference to detect, a positive number")
    results = build_results(run_dir)
    planned = plan_seeds(results, effect, power, holm)
    if as_json:
        click.echo(json.dumps(planned, indent=2))
        return
    if not planned["comparisons"]:
        raise UsageError(
            f"{run_dir}: no arm has a finished seed paired with {results['baseline']!r}; "
            "train the pilot first"
        )
    table = Table(
        title=f"seeds to detect {effect:g} with {power:.0%} power "
        f"(two-sided paired t-test, level {planned['alpha']:.3g}"
        + (", Holm" if holm else "")
        + ")",
        title_justify="left",
    )
    for header in ("arm", "against", "pilot seeds", "pilot Δ", "paired sd", "seeds needed"):
        table.add_column(header, justify="left" if header in ("arm", "against") else "right")
    for row in planned["comparisons"]:
        sd, seeds = row["sd"], row["seeds"]
        needed = "-" if sd is None else (f"{seeds:,}" if seeds is not None else "> 1,000,000")
        table.add_row(
            escape(row["arm"]),
            escape(row["against"]),
            str(row["pilot_seeds"]),
            f"{row['mean']:+.4f}",
            "-" if sd is None else f"{sd:.4f}",
            needed,
        )
    console = Console(soft_wrap=True)
    console.print(table)
    console.print(
        f"The exact sign-flip test needs at least {planned['exact_minimum']} paired seeds to "
        f"reach p ≤ {planned['exact_level']:.3g} at all. A pilot's sd is itself uncertain: "
        "plan with a margin.",
        highlight=False,
    )
