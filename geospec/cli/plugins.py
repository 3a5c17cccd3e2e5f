"""``geospec plugins [--json]``: the registered plugins by kind, and those that failed to load."""

from __future__ import annotations

import json

import click

from geospec.cli.console import escape, plugin_option, stdout


@click.command()
@plugin_option
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output (a stable shape).")
def plugins(as_json: bool) -> None:
    """List registered plugins by kind, with the package that provides each."""
    from geospec.registry.loading import get_registries

    registries = get_registries()
    if as_json:
        click.echo(json.dumps(registries.describe(), indent=2))
        return
    from rich.table import Table

    table = Table(title="geospec plugins")
    table.add_column("kind")
    table.add_column("name")
    table.add_column("provided by")
    for kind, registry in registries.by_kind.items():
        if not registry.entries:
            table.add_row(kind, "[dim](none registered)[/]", "")
        for entry in registry.entries.values():
            table.add_row(kind, entry.name, str(entry.provider))
    console = stdout()
    console.print(table)
    for broken in registries.errors:
        version = f" {broken.version}" if broken.version else ""
        console.print(
            f"[red]failed:[/] {escape(broken.name + version)}: {escape(broken.error)}",
            highlight=False,
        )
