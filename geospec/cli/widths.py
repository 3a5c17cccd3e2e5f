"""``geospec widths SPEC``: every arm's FFN widths as a table, without training anything.

Torch-free: it reads the spec, the optional profiles file and the plugins' schedules only.
"""

from __future__ import annotations

import json
from pathlib import Path

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from geospec.engine.model_size import ffn_params
from geospec.pipeline.run_dir import WIDTHS_FILE
from geospec.solve.profiles import read_profiles
from geospec.solve.widths import WidthsResult, compute_widths, write_widths
from geospec.spec.sections import Spec


@click.command()
@click.argument("spec_path", metavar="SPEC", type=click.Path(path_type=Path))
@click.option(
    "--profiles",
    "profiles_path",
    metavar="FILE",
    type=click.Path(path_type=Path),
    help='Measured profiles: {"profiles": {"topology/hyperbolic": [one number per layer], ...}}.',
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help='Print {"arms": {ARM: {"widths": [...], "ffn_params": N}}, "pending": [ARM, ...]}.',
)
def widths(spec_path: Path, profiles_path: Path | None, as_json: bool) -> None:
    """Print every arm's FFN width per layer and write widths.json into the run directory.

    Arms whose schedule needs a measured profile (geometric, anti, permuted) are listed as pending
    unless --profiles gives it; an arm with exactly the widths of the arm it is derived from (a
    sorted arm of a monotone one) is noted.
    """
    from geospec.spec.loading import load_spec

    spec = load_spec(spec_path)
    profiles = None
    source = None
    if profiles_path is not None:
        profiles, source = read_profiles(profiles_path), str(profiles_path)
    result = compute_widths(
        spec.model,
        spec.arms,
        profiles,
        pretrained_reference=spec.reference.checkpoint is not None,
        profiles_source=source,
    )
    path = write_widths(Path(spec.run_dir) / WIDTHS_FILE, result)
    if as_json:
        click.echo(json.dumps(result.to_json(), indent=2))
        return
    console = Console(soft_wrap=True)
    console.print(widths_table(spec, result))
    for arm, missing in result.pending.items():
        needs = ", ".join(repr(name) for name in missing)
        reason = result.notes.get(arm) or (
            f"needs the profile(s) {needs}; give them with --profiles FILE"
        )
        console.print(f"[yellow]pending:[/] {escape(arm)} {escape(reason)}", highlight=False)
    for arm, note in result.notes.items():
        if arm not in result.pending:
            console.print(f"[cyan]note:[/] {escape(arm)} {escape(note)}", highlight=False)
    console.print(f"wrote {escape(str(path))}", highlight=False)


def widths_table(spec: Spec, result: WidthsResult) -> Table:
    """Layers down, arms across; each cell holds the width and that layer's FFN parameters."""
    m = spec.model
    table = Table(
        title=f"{escape(spec.name)}: FFN width · FFN parameters per layer "
        f"(budget {m.n_layers} x {m.ffn_width}, multiples of {m.multiple_of}, {m.activation})",
        title_justify="left",
    )
    table.add_column("layer", justify="right")
    for arm in result.widths:
        table.add_column(escape(arm), justify="right")
    for layer in range(m.n_layers):
        cells = [
            f"{w[layer]:,} · {ffn_params(m.d_model, w[layer], m.activation, m.bias):,}"
            for w in result.widths.values()
        ]
        table.add_row(str(layer), *cells)
    totals = [f"{sum(w):,} · {result.ffn_params[arm]:,}" for arm, w in result.widths.items()]
    table.add_section()
    table.add_row("total", *totals, style="bold")
    return table
