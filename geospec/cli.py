"""The ``geospec`` command line.

Errors a user can cause exit with status 2 (bad spec or input) or 1 (the run failed) and one clear
message; ``--debug`` (or ``GEOSPEC_DEBUG=1``) shows the traceback. Commands that only read specs
(validate, plugins, schema, widths) never import torch.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
from pathlib import Path
from typing import Any

import click

from geospec import __version__
from geospec.errors import GeospecError

SPEC_PATH = click.Path(path_type=Path)  # existence is checked by load_spec, with a clear message


# Commands that live in their own modules, imported only when invoked (keeps `validate` light).
LAZY_COMMANDS: dict[str, str] = {
    "widths": "geospec.cli_widths:widths",
    "train": "geospec.cli_train:train",
    "run": "geospec.cli_run:run",
    "report": "geospec.cli_run:report",
    "diagnose": "geospec.cli_diagnose:diagnose",
}


class GeospecGroup(click.Group):
    """Turns :class:`GeospecError` into one message and its exit status, unless debugging.

    Also resolves the commands in ``LAZY_COMMANDS`` on first use.
    """

    def list_commands(self, ctx: click.Context) -> list[str]:
        available = [name for name in LAZY_COMMANDS if _module_exists(LAZY_COMMANDS[name])]
        return sorted({*super().list_commands(ctx), *available})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = LAZY_COMMANDS.get(cmd_name)
        if target is None or not _module_exists(target):
            return super().get_command(ctx, cmd_name)
        module_name, attribute = target.split(":")
        command: click.Command = getattr(importlib.import_module(module_name), attribute)
        return command

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except GeospecError as error:
            if _debugging(ctx):
                raise
            _stderr().print(f"[bold red]error:[/] {_escape(str(error))}", highlight=False)
            ctx.exit(error.exit_code)
        except KeyboardInterrupt:
            if _debugging(ctx):
                raise
            _stderr().print("interrupted; run the same command again to resume", highlight=False)
            ctx.exit(130)


def _module_exists(target: str) -> bool:
    return importlib.util.find_spec(target.split(":")[0]) is not None


def _debugging(ctx: click.Context) -> bool:
    return bool((ctx.obj or {}).get("debug")) or os.environ.get("GEOSPEC_DEBUG") == "1"


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)


def _stderr() -> Any:
    from rich.console import Console

    return Console(stderr=True, soft_wrap=True)


def _stdout() -> Any:
    from rich.console import Console

    return Console(soft_wrap=True)


@click.group(cls=GeospecGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="geospec")
@click.option("--debug", is_flag=True, help="Show tracebacks instead of one-line errors.")
@click.pass_context
def cli(ctx: click.Context, debug: bool) -> None:
    """Decide how wide each transformer layer's FFN should be, from the geometry of its work."""
    ctx.ensure_object(dict)
    ctx.obj["debug"] = debug


def _warn_broken_plugins() -> None:
    from geospec.plugins import get_registries

    for broken in get_registries().errors:
        version = f" {broken.version}" if broken.version else ""
        _stderr().print(
            f"[yellow]warning:[/] plugin {_escape(broken.name + version)} failed to load: "
            f"{_escape(broken.error)}",
            highlight=False,
        )


@cli.command()
@click.argument("spec_path", metavar="SPEC", type=SPEC_PATH)
def validate(spec_path: Path) -> None:
    """Check a spec and print what it resolves to."""
    from geospec.specfile import load_spec
    from geospec.summary import spec_summary

    _warn_broken_plugins()
    spec = load_spec(spec_path)
    _stdout().print(spec_summary(spec))
    _stdout().print(f"[green]✓[/] {_escape(str(spec_path))} is valid", highlight=False)


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output (a stable shape).")
def plugins(as_json: bool) -> None:
    """List registered plugins by kind, with the package that provides each."""
    from geospec.plugins import get_registries

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
    console = _stdout()
    console.print(table)
    for broken in registries.errors:
        version = f" {broken.version}" if broken.version else ""
        console.print(
            f"[red]failed:[/] {_escape(broken.name + version)}: {_escape(broken.error)}",
            highlight=False,
        )


@cli.command()
@click.option("-o", "--output", type=click.Path(path_type=Path), help="Write to a file.")
def schema(output: Path | None) -> None:
    """Print the JSON Schema of a spec, including the installed plugins' parameters."""
    from geospec.spec import Spec

    text = json.dumps(Spec.model_json_schema(), indent=2)
    if output is None:
        click.echo(text)
    else:
        from geospec.atomic import atomic_write_text

        atomic_write_text(output, text + "\n")


def main() -> None:
    cli(prog_name="geospec")


if __name__ == "__main__":  # pragma: no cover
    main()
