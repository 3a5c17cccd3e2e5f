"""What every command shares: the consoles, markup escaping, and the warning about plugins
that failed to load."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click


def escape(text: str) -> str:
    from rich.markup import escape as rich_escape

    return rich_escape(text)


def stderr() -> Any:
    from rich.console import Console

    return Console(stderr=True, soft_wrap=True)


def stdout() -> Any:
    from rich.console import Console

    return Console(soft_wrap=True)


def warn_broken_plugins() -> None:
    """One warning line per plugin that failed to load (commands that read specs say this first:
    a spec naming a broken plugin's kind fails later with that plugin's error)."""
    from geospec.registry.loading import get_registries

    for broken in get_registries().errors:
        version = f" {broken.version}" if broken.version else ""
        stderr().print(
            f"[yellow]warning:[/] plugin {escape(broken.name + version)} failed to load: "
            f"{escape(broken.error)}",
            highlight=False,
        )


#: ``--set dotted.key=value`` (repeatable): a spec value changed for this command only, validated
#: exactly like the file (geospec.spec.loading.apply_overrides); spec.resolved.toml records it.
set_option = click.option(
    "--set",
    "overrides",
    multiple=True,
    metavar="KEY=VALUE",
    help="Change one spec value (a TOML value; repeatable), e.g. --set train.lr=1e-3 "
    "--set 'arms[1].schedule.start=1.2'.",
)


class SpecFile(click.ParamType):
    """A command's SPEC: a spec file, or the name of a spec shipped with geospec (``tiny``)."""

    name = "spec"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Path:
        from geospec.spec.loading import find_spec_file

        return find_spec_file(value)


#: The SPEC argument of every command that reads a spec.
spec_argument = click.argument("spec_path", metavar="SPEC", type=SpecFile())


def _use_plugin_files(ctx: click.Context, param: click.Parameter, paths: tuple[str, ...]) -> None:
    if paths:
        from geospec.registry.files import use_plugin_files

        use_plugin_files(paths, "--plugin")


#: ``--plugin path.py`` (repeatable): a Python file whose @geospec.hookimpl hooks register
#: plugins for this command, like an installed package's entry point (geospec.registry.files).
plugin_option = click.option(
    "--plugin",
    "plugin_files",
    multiple=True,
    metavar="FILE.py",
    expose_value=False,
    is_eager=True,
    callback=_use_plugin_files,
    help="Load plugins from a Python file (repeatable), like an installed plugin package.",
)


def format_option(help: str) -> Any:
    """``--format hf|gguf``: what an export writes (``geospec export``, ``geospec prune
    --export``)."""
    return click.option(
        "--format", "fmt", type=click.Choice(["hf", "gguf"]), default="hf", show_default=True,
        help=help,
    )  # fmt: skip


def gguf_dtype_option(help: str) -> Any:
    """``--dtype``: a GGUF export's weight type, one of the types the export writes."""
    from geospec.prune.gguf_quant import DTYPES

    return click.option(
        "--dtype", type=click.Choice(DTYPES, case_sensitive=False), default=None, help=help
    )
