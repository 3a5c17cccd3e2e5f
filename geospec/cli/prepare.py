"""``geospec prepare SPEC``: tokenize the spec's corpus into this machine's token cache, once,
before any run (on a cluster's login node, say), with progress; ``geospec run`` then finds the
tokens there. A killed prepare resumes where it stopped when run again."""

from __future__ import annotations

from pathlib import Path

import click

from geospec.cli.console import set_option, spec_argument


@click.command()
@spec_argument
@set_option
def prepare(spec_path: Path, overrides: tuple[str, ...]) -> None:
    """Tokenize SPEC's [data] into the token cache ($GEOSPEC_CACHE/tokens, default
    ~/.cache/geospec/tokens): documents, tokens, rate, ETA and the size it will take every few
    seconds. Resumable: run it again after an interruption."""
    from rich.console import Console

    from geospec.engine.progress import format_bytes
    from geospec.engine.token_data import prepare_data, shared_cache_dir
    from geospec.spec.loading import load_spec

    spec = load_spec(spec_path, overrides, check_memory=False)  # the reference is not loaded
    console = Console(stderr=True, soft_wrap=True)

    def say(message: str) -> None:
        console.print(message, highlight=False)

    cache = shared_cache_dir()
    say(f"preparing the tokens of {spec.data.corpus or 'local files'} in {cache}")
    data = prepare_data(
        spec.data,
        cache,
        spec_dir=spec_path.parent,
        say=say,
        earlier=[Path(spec.run_dir) / "data"],  # where geospec run looks first, too
        progress=True,
    )
    tokens = data.meta["tokens"]
    size = sum((data.directory / f"{name}.bin").stat().st_size for name in ("train", "val"))
    click.echo(
        f"{data.directory}: {tokens['train']:,} training and {tokens['val']:,} validation "
        f"tokens ({format_bytes(size)}); geospec run {spec_path} reads them from there"
    )
