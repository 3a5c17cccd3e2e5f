"""``geospec status RUN_DIR``: every stage and every arm x seed of a run, finished or not."""

from __future__ import annotations

import json
from pathlib import Path

import click


def _mark(state: str) -> str:
    """A stage's state beside its name, readable without colour: ✓, (skipped), (pending)."""
    return "✓" if state == "done" else f"({state})"


def _duration(seconds: float) -> str:
    minutes = round(seconds / 60)
    return f"{minutes} min" if minutes < 90 else f"{minutes // 60} h {minutes % 60:02d} min"


@click.command()
@click.argument("run_dir", metavar="RUN_DIR", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the stable JSON form.")
def status(run_dir: Path, as_json: bool) -> None:
    """Show where RUN_DIR stands: each stage, and each arm x seed (done with its final loss,
    running with its step, speed and holder, queued on a scheduler with its job, pending, failed
    with its error, or a stale claim whose holder died; whether a trained run has been evaluated
    where the spec evaluates the arms). Reads the directory only; takes no lock."""
    from geospec.cli.console import escape, stdout
    from geospec.pipeline.status import describe
    from geospec.pipeline.status import status as read_status

    found = read_status(run_dir)
    if as_json:
        click.echo(json.dumps(found, indent=2, sort_keys=True))
        return
    from rich.table import Table

    colours = {
        "done": "green", "running": "cyan", "stale": "yellow", "failed": "red", "submitted": "blue"
    }  # fmt: skip
    console = stdout()
    # each stage's state in words too: colour alone is lost in a log file
    stages = "  ".join(
        f"[{colours.get(s['state'], 'dim')}]{s['name']} {_mark(s['state'])}[/]"
        for s in found["stages"]
    )
    console.print(f"[bold]{escape(found['name'])}[/] ({escape(found['run_dir'])})")
    console.print(f"stages: {stages}", highlight=False)
    if not found["trains"]:  # no table of runs that will never exist
        console.print("runs: none (the spec trains no arm: probe-only or pruning)")
        for note in found["notes"]:
            console.print(f"[yellow]note:[/] {escape(note)}", highlight=False)
        return
    table = Table("arm", "seed", "state", "detail")
    for entry in found["runs"]:
        colour = colours.get(entry["state"], "dim")
        table.add_row(
            escape(entry["arm"]),
            str(entry["seed"]),
            f"[{colour}]{entry['state']}[/]",
            escape(describe(entry)),
        )
    console.print(table)
    counts = ", ".join(f"{n} {state}" for state, n in found["counts"].items() if n)
    left = found["seconds_left"]
    if left is not None:
        processes = found["counts"]["running"]
        counts += (
            f"; about {_duration(left)} left at the finished runs' pace "
            f"({processes} process{'es' if processes > 1 else ''} training)"
        )
    console.print(f"runs: {counts}", highlight=False)
    for note in found["notes"]:
        console.print(f"[yellow]note:[/] {escape(note)}", highlight=False)
