"""``geospec export TRAINING_DIR --to DIR``: a trained model as a Hugging Face checkpoint."""

from __future__ import annotations

from pathlib import Path

import click


@click.command()
@click.argument("training_dir", metavar="RUN_DIR/arms/ARM/seed-K", type=click.Path(path_type=Path))
@click.option("--to", "to", required=True, type=click.Path(path_type=Path), help="New directory.")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["hf"]),
    default="hf",
    show_default=True,
    help="hf: a transformers checkpoint (AutoModelForCausalLM.from_pretrained loads it).",
)
@click.option(
    "--tokenizer",
    "tokenizer_dir",
    type=click.Path(path_type=Path),
    help="A token cache directory holding the run's tokenizer.json (default: found by its key).",
)
def export(training_dir: Path, to: Path, fmt: str, tokenizer_dir: Path | None) -> None:
    """Write a finished run's model and tokenizer to DIR as a transformers checkpoint: GPT-2
    (learned positions, layernorm, gelu) or Llama (rope, rmsnorm, swiglu). Per-layer FFN widths
    are zero-padded to the widest (exactly the same function; the true widths are in config.json's
    "geospec" block)."""
    from geospec.engine.export import export_training_dir

    exported = export_training_dir(training_dir, to, tokenizer_dir)
    padding = (
        f"; FFNs zero-padded to {exported.padded_to} (true widths "
        f"{' '.join(map(str, exported.widths))} in config.json's geospec block)"
        if exported.padded_to is not None
        else ""
    )
    click.echo(f"exported {exported.family} checkpoint -> {to}{padding}")
