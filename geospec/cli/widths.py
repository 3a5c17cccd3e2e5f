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

from geospec.cli.console import plugin_option, set_option, spec_argument, warn_broken_plugins
from geospec.errors import UsageError
from geospec.profiles import read_profiles
from geospec.rundir.layout import RUN_FILE, WIDTHS_FILE
from geospec.shapes.model_size import ffn_params
from geospec.solve.widths import WidthsResult, compute_widths, write_widths
from geospec.spec.sections import Spec


@click.command()
@spec_argument
@click.option(
    "--profiles",
    "profiles_paths",
    metavar="FILE",
    multiple=True,
    type=click.Path(path_type=Path),
    help='Measured profiles: {"profiles": {"topology/hyperbolic": [one number per layer], ...}} '
    "(repeatable: the files are merged; a profile in two files is an error).",
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help='Print {"arms": {ARM: {"widths": [...], "ffn_params": N}}, "pending": [ARM, ...]}.',
)
@click.option(
    "-o",
    "--output",
    type=click.Path(path_type=Path),
    help="Also write the --json shape to this file (never into a run directory's widths.json).",
)
@set_option
@plugin_option
def widths(
    spec_path: Path,
    profiles_paths: tuple[Path, ...],
    as_json: bool,
    output: Path | None,
    overrides: tuple[str, ...],
) -> None:
    """Print every arm's FFN width per layer, without training or writing anything.

    A run directory's widths.json is written only by ``geospec run`` (its solve stage), so a
    report never shows widths its models were not trained with.

    Arms whose schedule needs a measured profile (geometric, anti, permuted) are listed as pending
    unless --profiles gives it; an arm with exactly the widths of the arm it is derived from (a
    sorted arm of a monotone one) is noted.
    """
    from geospec.spec.loading import load_spec

    warn_broken_plugins()  # a spec naming its kind fails below with only a "did you mean"
    spec = load_spec(spec_path, overrides, check_memory=False)
    profiles = None
    source = None
    if profiles_paths:
        profiles, source = merged_profiles(profiles_paths), ", ".join(map(str, profiles_paths))
    result = compute_widths(
        spec.model,
        spec.arms,
        profiles,
        pretrained_reference=spec.reference.checkpoint is not None,
        profiles_source=source,
    )
    if profiles is not None:
        check_profile_names(result, profiles, str(source))
    if output is not None:
        if output.name == WIDTHS_FILE and (output.parent / RUN_FILE).exists():
            raise UsageError(
                f"--output {output}: that is a run directory's {WIDTHS_FILE}, which only "
                "geospec run writes; give another file name"
            )
        write_widths(output, result)
    if as_json:
        click.echo(json.dumps(result.to_json(), indent=2))
        return
    console = Console(soft_wrap=True)
    if not spec.arms:  # a pruning spec: its arms' widths are solved at each pruned budget
        console.print(
            escape(
                f"{spec.name} has no [[arms]]: it prunes the checkpoint, and geospec prune "
                "prints every [prune] arm's widths at each keep fraction (flap and owl allocate "
                "from the neuron scores of its calibration)"
            ),
            highlight=False,
        )
        return
    console.print(widths_table(spec, result))
    for arm, missing in result.pending.items():
        needs = ", ".join(repr(name) for name in missing)
        reason = result.notes.get(arm) or (
            f"needs the profile(s) {needs}; give them with --profiles FILE"
        )
        console.print(f"[yellow]pending:[/] {escape(arm)} {escape(reason)}", highlight=False)
    if profiles is not None:
        depths = sorted({len(values) for values in profiles.values()} - {spec.model.n_layers})
        if depths:  # another depth's profiles are resampled: said, so a wrong n_layers shows
            console.print(
                f"[cyan]note:[/] profiles of {' and '.join(map(str, depths))} layers "
                f"({escape(str(source))}) resampled to the model's {spec.model.n_layers} layers",
                highlight=False,
            )
    for arm, note in result.notes.items():
        if arm not in result.pending:
            console.print(f"[cyan]note:[/] {escape(arm)} {escape(note)}", highlight=False)
    for arm in result.widths:
        at_bounds = result.at_bounds(arm)
        if at_bounds:  # there the bound, not the profile, may have set the width
            console.print(f"[cyan]bounds:[/] {escape(arm)} {escape(at_bounds)}", highlight=False)
    if output is not None:
        console.print(f"wrote {escape(str(output))}", highlight=False)


def merged_profiles(paths: tuple[Path, ...]) -> dict[str, list[float]]:
    """The profiles of every file, merged; a profile named in two files is a UsageError (which
    one was meant cannot be guessed)."""
    merged: dict[str, list[float]] = {}
    origin: dict[str, Path] = {}
    for path in paths:
        for name, values in read_profiles(path).items():
            if name in merged:
                raise UsageError(
                    f"--profiles: {name!r} is in both {origin[name]} and {path}; give it once"
                )
            merged[name], origin[name] = list(values), path
    return merged


def check_profile_names(
    result: WidthsResult, profiles: dict[str, list[float]], source: str
) -> None:
    """An arm left pending for a profile that the file has under a close, misspelt name is an
    error with a did-you-mean, not a silent "pending"."""
    import difflib

    for arm, missing in result.pending.items():
        for name in missing:
            close = difflib.get_close_matches(name, list(profiles), n=1, cutoff=0.6)
            if close:
                raise UsageError(
                    f"{source}: arm {arm!r} needs the profile {name!r}, which the file does not "
                    f"have; did you mean {close[0]!r}? (profiles in the file: "
                    + ", ".join(repr(p) for p in profiles)
                    + ")"
                )


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
