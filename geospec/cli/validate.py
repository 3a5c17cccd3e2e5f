"""``geospec validate SPEC``: check a spec and print what it resolves to (never imports torch)."""

from __future__ import annotations

from pathlib import Path

import click

from geospec.cli.console import escape, stdout, warn_broken_plugins


@click.command()
@click.argument("spec_path", metavar="SPEC", type=click.Path(path_type=Path))
def validate(spec_path: Path) -> None:
    """Check a spec and print what it resolves to."""
    from geospec.spec.loading import load_spec
    from geospec.spec.summary import spec_summary

    warn_broken_plugins()
    spec = load_spec(spec_path)
    stdout().print(spec_summary(spec))
    stdout().print(f"[green]✓[/] {escape(str(spec_path))} is valid", highlight=False)
