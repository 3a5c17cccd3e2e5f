"""``geospec train SPEC --arm NAME --seed K``: train one model of a spec (torchrun-ready).

Widths come from ``--widths``, else from the arm's schedule when it needs no measured profile
(uniform, cosine, ...), else from ``widths.json`` in the run directory (written by ``geospec
widths --profiles`` or by ``geospec run``). Under ``torchrun --nproc_per_node N -m geospec train
...`` the run is data-parallel over the N processes (``train.distributed``: ddp or fsdp2).
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from geospec.errors import UsageError
from geospec.spec import Spec


def _parse_widths(text: str) -> list[int]:
    try:
        return [int(part) for part in text.replace(" ", "").split(",") if part]
    except ValueError:
        raise UsageError(
            f"--widths {text!r}: give comma-separated integers, e.g. 512,512,384"
        ) from None


def arm_widths(spec: Spec, arm: str, given: str | None) -> list[int]:
    """The FFN widths to train ``arm`` with, checked against the model's depth and budget."""
    from geospec.widths import WIDTHS_FILE, compute_widths

    names = [a.name for a in spec.arms]
    if arm not in names:
        raise UsageError(
            f"--arm {arm!r}: the spec has no such arm; its arms are {', '.join(names)}"
        )
    m = spec.model
    if given is not None:
        widths = _parse_widths(given)
        source = "--widths"
    else:
        computed = compute_widths(spec, {})
        path = Path(spec.run_dir) / WIDTHS_FILE
        if arm in computed.widths:
            return computed.widths[arm]
        if not path.is_file():
            raise UsageError(
                f"arm {arm!r} needs measured profiles: pass --widths, or compute {path} first "
                f"(geospec widths SPEC --profiles FILE, or geospec run SPEC --until solve)"
            )
        stored = json.loads(path.read_text()).get("arms", {})
        if arm not in stored:
            raise UsageError(f"{path}: no widths for arm {arm!r}; run geospec widths again")
        widths = [int(w) for w in stored[arm]["widths"]]
        source = str(path)
    budget = m.n_layers * m.ffn_width
    if len(widths) != m.n_layers or sum(widths) != budget or min(widths) < 1:
        raise UsageError(
            f"{source}: {len(widths)} widths summing to {sum(widths)}; the model needs "
            f"{m.n_layers} positive widths summing to {budget} (n_layers x ffn_width), so that "
            "every arm has the same parameter count"
        )
    return widths


@click.command()
@click.argument("spec_path", metavar="SPEC", type=click.Path(path_type=Path))
@click.option("--arm", required=True, help="The arm to train (its name in the spec).")
@click.option("--seed", type=int, required=True, help="Seed: initial weights and data order.")
@click.option("--widths", "widths_text", metavar="W1,W2,...", help="FFN width of every layer.")
@click.option(
    "--out",
    type=click.Path(path_type=Path),
    help="Output directory (default: RUN_DIR/arms/ARM/seed-K).",
)
@click.option("--steps", type=click.IntRange(min=1), help="Override the number of steps.")
def train(
    spec_path: Path,
    arm: str,
    seed: int,
    widths_text: str | None,
    out: Path | None,
    steps: int | None,
) -> None:
    """Train one model of SPEC: the arm's widths, one seed. Resumes an interrupted run."""
    from rich.console import Console

    from geospec.data import prepare_data
    from geospec.distributed import claim_on_main, context, process_group
    from geospec.model import config_from_spec
    from geospec.specfile import load_spec
    from geospec.train import train_model

    spec = load_spec(spec_path)
    widths = arm_widths(spec, arm, widths_text)
    run_dir = Path(spec.run_dir)
    out = out or run_dir / "arms" / arm / f"seed-{seed}"
    console = Console(stderr=True, soft_wrap=True)
    with process_group() as (rank, world_size):
        if rank == 0:
            console.print(f"preparing data ({spec.data.corpus or 'local files'})", highlight=False)
        # every process may call this: a lock lets one build the cache while the others wait
        data = prepare_data(spec.data, run_dir / "data", spec_dir=spec_path.parent)
        config = config_from_spec(spec.model, widths, data.vocab_size)
        if rank == 0:
            console.print(
                f"training arm {arm}, seed {seed}: {config.num_params():,} parameters, widths "
                f"{' '.join(map(str, widths))}, {world_size} process(es) -> {out}",
                highlight=False,
            )
        with claim_on_main(out, context()) as claimed:
            if not claimed:
                raise UsageError(
                    f"{out}: another geospec process is training into this directory; let it "
                    "finish (or stop it), or give another --out"
                )
            result = train_model(spec.train, config, data, out, seed=seed, steps=steps)
        if rank == 0:
            click.echo(
                f"final validation loss {result.final_val_loss:.6f} after {result.steps} steps "
                f"({result.tokens:,} tokens, {result.tokens_per_second:,.0f} tokens/s)"
            )
