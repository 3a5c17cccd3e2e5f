"""``geospec export DIR --to OUT``: a trained run's or a prune unit's model as a Hugging Face
checkpoint or a GGUF file."""

from __future__ import annotations

from pathlib import Path

import click

from geospec.cli.console import format_option, gguf_dtype_option


@click.command()
@click.argument(
    "training_dir",
    metavar="RUN_DIR/arms/ARM/seed-K | RUN_DIR/prune/keep-F/ARM/seed-K",
    type=click.Path(path_type=Path),
)
@click.option(
    "--to", "to", required=True, type=click.Path(path_type=Path), help="New directory or file."
)
@format_option(
    "hf: a transformers checkpoint directory; gguf: one .gguf file that llama.cpp loads with "
    "the true per-layer FFN widths (Llama-family models; the gguf extra)."
)
@gguf_dtype_option(
    "gguf: the weights' type (norms stay f32). Default: a prune unit's reference GGUF file's own "
    "type (Q4_1 for SmolLM2's file, Q4_K_M for Gemma's and Qwen's), f16 otherwise. Quantized "
    "types through llama.cpp's quantizer where llama-cpp-python is installed; without it gguf-py "
    "writes q8_0, q4_0, q4_1, q5_0 and q5_1, and the K-quants need it."
)
@click.option(
    "--tokenizer",
    "tokenizer_dir",
    type=click.Path(path_type=Path),
    help="A trained run: a token cache directory holding its tokenizer.json (default: found by "
    "its key). A prune unit (gguf): a .gguf file or a directory with tokenizer.json (default: "
    "the run's reference checkpoint).",
)
@click.option(
    "--padded",
    is_flag=True,
    help="A prune unit (hf): every FFN zero-padded to the widest layer, so that plain "
    "AutoModelForCausalLM.from_pretrained and tools that need one intermediate_size read it "
    "(the same logits; the zero units cost parameters and time). A trained run's hf export is "
    "always padded.",
)
def export(
    training_dir: Path,
    to: Path,
    fmt: str,
    dtype: str | None,
    tokenizer_dir: Path | None,
    padded: bool,
) -> None:
    """Write a finished run's model to OUT. A trained run: its model and tokenizer as a
    transformers checkpoint, GPT-2 (learned positions, layernorm, gelu) or Llama (rope, rmsnorm,
    swiglu), per-layer FFN widths zero-padded to the widest (the same function; the true widths
    in config.json's "geospec" block), or a GGUF file at the true widths. A prune unit: the
    checkpoint the prune exported (geospec.load_pruned reads it), with --padded one that plain
    transformers reads, or a GGUF file at the true widths with the reference's tokenizer."""
    from geospec.errors import UsageError
    from geospec.prune.exports import export_prune_unit, export_training_gguf, is_prune_unit

    if dtype is not None and fmt != "gguf":
        raise UsageError("--dtype is for --format gguf; an hf export keeps the model's dtype")
    if is_prune_unit(training_dir):
        click.echo(export_prune_unit(training_dir, to, fmt, dtype, tokenizer_dir, padded))
        return
    if fmt == "gguf":
        click.echo(export_training_gguf(training_dir, to, dtype, tokenizer_dir))
        return
    from geospec.engine.export import export_training_dir

    exported = export_training_dir(training_dir, to, tokenizer_dir)
    padding = (
        f"; FFNs zero-padded to {exported.padded_to} (true widths "
        f"{' '.join(map(str, exported.widths))} in config.json's geospec block)"
        if exported.padded_to is not None
        else ""
    )
    click.echo(f"exported {exported.family} checkpoint -> {to}{padding}")
