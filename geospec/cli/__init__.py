"""The ``geospec`` command line: one module per command, loaded when the command is invoked.

Errors a user can cause exit with status 2 (bad spec or input) or 1 (the run failed) and one clear
message; ``--debug`` (or ``GEOSPEC_DEBUG=1``) shows the traceback. Commands that only read specs
(validate, plugins, schema, widths) never import torch.
"""

from __future__ import annotations

import difflib
import importlib
import os
from typing import Any

import click

from geospec.cli.console import escape, stderr
from geospec.errors import GeospecError
from geospec.storage.disk import unplaced_out_of_space
from geospec.version import __version__

#: Command name -> "module:function"; each module is imported only when its command runs.
COMMANDS: dict[str, str] = {
    "validate": "geospec.cli.validate:validate",
    "plugins": "geospec.cli.plugins:plugins",
    "schema": "geospec.cli.schema:schema",
    "widths": "geospec.cli.widths:widths",
    "run": "geospec.cli.run:run",
    "train": "geospec.cli.train:train",
    "diagnose": "geospec.cli.diagnose:diagnose",
    "demand": "geospec.cli.demand:demand",
    "prune": "geospec.cli.prune:prune",
    "heal": "geospec.cli.heal:heal",
    "report": "geospec.cli.report:report",
    "plan": "geospec.cli.plan:plan",
    "export": "geospec.cli.export:export",
    "eval": "geospec.cli.eval:evaluate",
    "status": "geospec.cli.status:status",
    "prepare": "geospec.cli.prepare:prepare",
    "rehearse": "geospec.cli.rehearse:rehearse",
}


class GeospecGroup(click.Group):
    """Resolves the commands in :data:`COMMANDS` on first use, and turns :class:`GeospecError`
    into one message and its exit status, unless debugging."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = COMMANDS.get(cmd_name)
        if target is None:
            return None
        module_name, attribute = target.split(":")
        command: click.Command = getattr(importlib.import_module(module_name), attribute)
        return command

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        # click says "No such command"; a typo deserves the command that was meant.
        name = args[0] if args else ""
        if name and not name.startswith("-") and name not in COMMANDS:
            close = difflib.get_close_matches(name, COMMANDS, n=2, cutoff=0.6)
            if close:
                meant = " or ".join(repr(candidate) for candidate in close)
                ctx.fail(f"No such command {name!r}. Did you mean {meant}?")
        return super().resolve_command(ctx, args)

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        # --debug is the group's option, but users put it after the command too
        # (`geospec validate spec.toml --debug`): move it before the command, up to a `--`
        end = args.index("--") if "--" in args else len(args)
        if "--debug" in args[1:end]:
            args = ["--debug", *(a for a in args[:end] if a != "--debug"), *args[end:]]
        return super().parse_args(ctx, args)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except GeospecError as error:
            if _debugging(ctx):
                raise
            stderr().print(f"[bold red]error:[/] {escape(str(error))}", highlight=False)
            ctx.exit(error.exit_code)
        except Exception as error:  # a full disk where no writer named its file: still one line
            full = None if _debugging(ctx) else unplaced_out_of_space(error)
            if full is None:
                raise
            stderr().print(f"[bold red]error:[/] {escape(str(full))}", highlight=False)
            ctx.exit(full.exit_code)
        except KeyboardInterrupt:
            if _debugging(ctx):
                raise
            stderr().print("interrupted; run the same command again to resume", highlight=False)
            ctx.exit(130)


def _debugging(ctx: click.Context) -> bool:
    return bool((ctx.obj or {}).get("debug")) or os.environ.get("GEOSPEC_DEBUG") == "1"


@click.group(cls=GeospecGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="geospec")
@click.option(
    "--debug",
    is_flag=True,
    help="Show tracebacks instead of one-line errors (before or after the command).",
)
@click.pass_context
def cli(ctx: click.Context, debug: bool) -> None:
    """Decide how wide each transformer layer's FFN should be, from the geometry of its work."""
    ctx.ensure_object(dict)
    ctx.obj["debug"] = debug


def main() -> None:
    cli(prog_name="geospec")


if __name__ == "__main__":  # pragma: no cover
    main()
