"""``geospec schema``: the JSON Schema of a spec with the installed plugins' parameters."""

from __future__ import annotations

import json
from pathlib import Path

import click

from geospec.cli.console import plugin_option


@click.command()
@plugin_option
@click.option("-o", "--output", type=click.Path(path_type=Path), help="Write to a file.")
def schema(output: Path | None) -> None:
    """Print the JSON Schema of a spec, including the installed plugins' parameters."""
    from geospec.spec.sections import Spec

    text = json.dumps(Spec.model_json_schema(), indent=2)
    if output is None:
        click.echo(text)
    else:
        from geospec.storage.atomic import atomic_write_text

        atomic_write_text(output, text + "\n")
