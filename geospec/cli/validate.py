"""``geospec validate SPEC``: check a spec and print what it resolves to (never imports torch)."""

from __future__ import annotations

from pathlib import Path

import click

from geospec.cli.console import (
    escape,
    plugin_option,
    set_option,
    spec_argument,
    stdout,
    warn_broken_plugins,
)


@click.command()
@spec_argument
@click.option(
    "--json", "as_json", is_flag=True, help="Print the fully resolved spec as JSON (defaults in)."
)
@set_option
@plugin_option
def validate(spec_path: Path, as_json: bool, overrides: tuple[str, ...]) -> None:
    """Check a spec and print what it resolves to (--json: every value, defaults filled in)."""
    from geospec.solve.widths import compute_widths
    from geospec.spec.loading import load_spec
    from geospec.spec.summary import memory_lines, spec_summary, uncached_hub_notes
    from geospec.spec.width_grid import grid_line

    warn_broken_plugins()
    spec = load_spec(spec_path, overrides)
    if as_json:
        import json

        from geospec.spec.resolve import resolved_spec

        click.echo(json.dumps(resolved_spec(spec), indent=2))
        return
    stdout().print(spec_summary(spec))
    # the widths computable without profiles: say which derived arm equals its source
    computable = compute_widths(
        spec.model, spec.arms, pretrained_reference=spec.reference.checkpoint is not None
    )
    for arm, note in computable.notes.items():
        stdout().print(f"[cyan]note:[/] arm {escape(arm)} {escape(note)}", highlight=False)
    for note in uncached_hub_notes(spec):
        stdout().print(f"[cyan]note:[/] {escape(note)}", highlight=False)
    if (grid := grid_line(spec, spec_path.parent)) is not None:
        stdout().print(f"[cyan]note:[/] {escape(grid)}", highlight=False)
    for line in memory_lines(spec, computable.widths):  # per process, before anything is built
        stdout().print(escape(line), highlight=False)
    stdout().print(f"[green]✓[/] {escape(str(spec_path))} is valid", highlight=False)
