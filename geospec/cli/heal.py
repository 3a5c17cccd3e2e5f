"""``geospec heal SPEC ARM@KEEP --to OUT``: one pruned model healed by distillation from the
unpruned one, and exported like any other."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from geospec.cli.console import (
    format_option,
    gguf_dtype_option,
    plugin_option,
    set_option,
    spec_argument,
)
from geospec.cli.until import out_option, threads_option
from geospec.shapes.heal_time import DEFAULT_STEPS

if TYPE_CHECKING:
    from geospec.pipeline.healing import ShippedFile


@click.command()
@spec_argument
@click.argument("unit", metavar="ARM@KEEP")
@out_option
@threads_option
@set_option
@plugin_option
@click.option(
    "--steps",
    type=click.IntRange(min=1),
    default=DEFAULT_STEPS,
    show_default=True,
    help="Optimizer steps of [prune.heal].batch_size sequences (8 by default) of model.seq_len "
    "tokens; geospec validate and What to ship say how long they take.",
)
@click.option(
    "--to",
    type=click.Path(path_type=Path),
    required=True,
    help="A new directory (hf) or .gguf file (gguf) for the healed model.",
)
@format_option("hf, a transformers directory; gguf, a llama.cpp file at the true widths.")
@gguf_dtype_option(
    "With --format gguf: the weights' type (default: a GGUF checkpoint's own type), as "
    "geospec export --dtype."
)
@click.option("--padded", is_flag=True, help="With --format hf: as geospec prune --padded.")
@click.option(
    "--seed",
    type=int,
    default=None,
    help="The calibration seed's unit (default: the first of prune.calibration).",
)
def heal(
    spec_path: Path,
    unit: str,
    out: Path | None,
    overrides: tuple[str, ...],
    steps: int,
    to: Path,
    fmt: str,
    dtype: str | None,
    padded: bool,
    seed: int | None,
) -> None:
    """Heal the model SPEC's prune ships, and write it to --to: `geospec heal SPEC best@0.5
    --format gguf --to model-half-healed.gguf`.

    Runs the prune as `geospec prune SPEC --export ARM@KEEP` does (its finished units reused;
    best@KEEP: the arm [prune] select recommends), then heals that one model: imported into
    geospec's engine and distilled from the unpruned model for --steps steps of the spec's
    training text, with [prune.heal]'s settings (distill = 1 and a tenth of the steps' warmup
    unless it sets them; its steps must stay 0, or the prune heals every arm itself). The
    healing resumes where it was interrupted and is reused by a later heal of the same model and
    settings (the unit's healed/). Prints the perplexities and the fixed prompts' greedy
    continuations before and after, then the export's line (docs/prune.md, "Healing")."""
    import math

    from geospec.cli.console import stderr
    from geospec.cli.prune import Choice, check_target, run_prune
    from geospec.errors import UsageError
    from geospec.pipeline.healing import heal_exported
    from geospec.prune.exports import export_prune_unit
    from geospec.prune.units import Unit
    from geospec.report.prune import corpus_labels
    from geospec.rundir.records import read_prune
    from geospec.spec.loading import load_spec

    check_target(to, fmt, padded, dtype)
    spec = load_spec(spec_path, overrides)
    if spec.prune is None:
        raise UsageError(f"{spec_path}: no [prune] section; add one (docs/prune.md)")
    if spec.prune.heal.steps > 0:
        raise UsageError(
            f"{spec_path}: [prune.heal] steps = {spec.prune.heal.steps} heals every pruned model "
            "in the prune already; geospec prune SPEC --export ARM@KEEP hands out the healed "
            "one (or set steps = 0 to heal only the model you ship with geospec heal)"
        )
    done = run_prune(spec_path, overrides, None, out, unit, seed, Choice(), padded)
    if done is None:
        return  # under torchrun, rank 0 alone reports
    spec, run_dir, wanted = done
    assert wanted is not None
    chosen = Unit(*wanted)
    healed = heal_exported(spec, spec_path, run_dir, chosen, steps, stderr())
    record = read_prune(run_dir) or {}
    labels = corpus_labels(list(healed.before))
    unpruned = record.get("reference", {})
    perplexity = ", ".join(
        f"{labels.get(corpus, corpus)} {math.exp(loss):.2f} -> {math.exp(healed.after[corpus]):.2f}"
        + (f" (unpruned {math.exp(unpruned[corpus]):.2f})" if corpus in unpruned else "")
        for corpus, loss in healed.before.items()
    )
    settings = healed.settings
    how = f"{settings.steps} steps of {settings.batch_size} x {spec.model.seq_len} tokens"
    if settings.distill:
        how += f", distilled from the unpruned model (distill {settings.distill:g})"
    reused = "" if healed.now else " (reused)"
    click.echo(f"healed {chosen.label}{reused}: {how}; perplexity {perplexity}")
    if healed.continuations is not None:
        click.echo(healed_lines(healed.continuations))
    unit_dir = chosen.directory(run_dir)
    click.echo(export_prune_unit(unit_dir, to, fmt, dtype, padded=padded, model=healed.model))
    if fmt == "gguf":
        from geospec.cli.prune import say_speed
        from geospec.pipeline.healing import shipped_file_scores
        from geospec.prune.gguf_quant import source_type

        # a minute or so of de-quantizing and scoring: said, not silent
        stderr().print(f"heal: scoring {to.name}'s own weights")
        shipped = shipped_file_scores(spec, spec_path, run_dir, healed.model, to, stderr())
        kind = source_type(to).label
        click.echo(shipped_words(to, kind, shipped, healed.before_select, labels))
        say_speed(unit_dir, to, "heal")


def healed_lines(found: dict[str, list[str]]) -> str:
    """The fixed prompts' greedy continuations before and after healing, one line each, as the
    report prints the prune's."""
    from geospec.report.prune import continuation_lines

    models = [("before healing", found["before"]), ("healed", found["after"])]
    lines = continuation_lines(found["prompts"], models)
    return "\n".join(["greedy continuations of fixed prompts (no decision reads them):", *lines])


#: Where the file gives back more than this share of what healing gained on the selection
#: windows, its line names a larger type.
GIVEN_BACK = 0.5


def shipped_words(
    to: Path, kind: str, shipped: ShippedFile, unhealed: float | None, labels: dict[str, str]
) -> str:
    """The healed GGUF file's own perplexities on the eval corpora (shown), and how much of the
    healing its type keeps on the selection windows (``unhealed``: the unhealed model's loss
    there, as its unit recorded it): healing moves every weight off the source file's grid, so
    a 4-bit file can round away most of it (SmolLM2-135M at keep 1/2: Q4_1 gave back 81% on
    the eval corpora, Q8_0 nothing; docs/prune.md, "Healing"). Its advice reads no eval
    text."""
    import math

    from geospec.prune.gguf_quant import FLOATS

    perplexity = ", ".join(
        f"{labels.get(corpus, corpus)} {math.exp(loss):.2f}"
        for corpus, loss in shipped.eval.items()
    )
    line = f"as shipped ({to.name}'s own {kind} weights): perplexity {perplexity}"
    if shipped.select is None or unhealed is None:
        return line + " (no [prune] select: nothing says how much of the healing the type keeps)"
    above = shipped.select["shipped"] - shipped.select["float32"]
    gained = unhealed - shipped.select["float32"]
    line += (
        f"; on the selection windows {above:.3f} nats above the healed model, where healing "
        f"gained {gained:.3f}"
    )
    if gained > 0 and above > GIVEN_BACK * gained and kind.lower() not in FLOATS:
        line += (
            f" (the {kind} file rounds away {above / gained:.0%} of the healing: a larger type "
            'keeps more of it, --dtype q5_1 or q8_0; docs/prune.md, "Healing")'
        )
    return line
