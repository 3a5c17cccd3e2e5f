"""``geospec train SPEC --arm NAME --seed K``: train one model of a spec (torchrun-ready).

Widths come from ``--widths``, else from the arm's schedule when it needs no measured profile
(uniform, cosine, ...), else from ``widths.json`` in the run directory (written by ``geospec
run``, its solve stage). The model is trained exactly as the train stage of
``geospec run`` trains it (:func:`geospec.pipeline.training.train_into`), into the same directory,
so ``geospec run`` later finds it trained. Under ``torchrun --nproc_per_node N -m geospec train
...`` the run is data-parallel over the N processes (``train.distributed``: ddp or fsdp2).
"""

from __future__ import annotations

from pathlib import Path

import click

from geospec.cli.console import plugin_option, set_option, spec_argument
from geospec.errors import UsageError
from geospec.spec.sections import Spec


def _parse_widths(text: str) -> list[int]:
    try:
        return [int(part) for part in text.replace(" ", "").split(",") if part]
    except ValueError:
        raise UsageError(
            f"--widths {text!r}: give comma-separated integers, e.g. 512,512,384"
        ) from None


def arm_widths(spec: Spec, arm: str, given: str | None) -> list[int]:
    """The FFN widths to train ``arm`` with, checked against the model's depth and budget."""
    from geospec.rundir.artifacts import json_problem, read_json
    from geospec.rundir.layout import WIDTHS_FILE
    from geospec.solve.widths import compute_widths, width_problems

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
        computed = compute_widths(m, spec.arms, {})
        path = Path(spec.run_dir) / WIDTHS_FILE
        if arm in computed.widths:
            return computed.widths[arm]
        if not path.is_file():
            raise UsageError(
                f"arm {arm!r} needs measured profiles: pass --widths, or compute {path} first "
                "(geospec run SPEC --until solve)"
            )
        problem = json_problem(path, "arms")
        if problem:
            raise UsageError(f"{path}: {problem}; run geospec run SPEC --until solve again")
        stored = read_json(path)["arms"]
        if arm not in stored:
            raise UsageError(
                f"{path}: no widths for arm {arm!r}; run geospec run SPEC --until solve again"
            )
        widths = [int(w) for w in stored[arm]["widths"]]
        source = str(path)
    if width_problems(widths, m, multiples=False):
        raise UsageError(
            f"{source}: {len(widths)} widths summing to {sum(widths)}; the model needs "
            f"{m.n_layers} positive widths summing to {m.n_layers * m.ffn_width} (n_layers x "
            "ffn_width), so that every arm has the same parameter count"
        )
    return widths


@click.command()
@spec_argument
@click.option("--arm", required=True, help="The arm to train (its name in the spec).")
@click.option(
    "--seed",
    type=click.IntRange(0, 2**32 - 1),
    required=True,
    help="Seed: initial weights and data order (0 to 2**32 - 1).",
)
@click.option("--widths", "widths_text", metavar="W1,W2,...", help="FFN width of every layer.")
@click.option(
    "--out",
    type=click.Path(path_type=Path),
    help="Output directory (default: RUN_DIR/arms/ARM/seed-K).",
)
@click.option("--steps", type=click.IntRange(min=1), help="Override the number of steps.")
@set_option
@plugin_option
def train(
    spec_path: Path,
    arm: str,
    seed: int,
    widths_text: str | None,
    out: Path | None,
    steps: int | None,
    overrides: tuple[str, ...],
) -> None:
    """Train one model of SPEC: the arm's widths, one seed. Resumes an interrupted run."""
    from rich.console import Console

    from geospec.cli.console import warn_broken_plugins
    from geospec.engine.distributed import context, process_group
    from geospec.engine.model import config_from_spec
    from geospec.pipeline.context import RunContext
    from geospec.pipeline.keys import arm_run_key
    from geospec.pipeline.tracking import TrackAs
    from geospec.pipeline.training import TrainingJob, train_into
    from geospec.rundir.layout import arm_seed_dir
    from geospec.spec.loading import load_spec

    warn_broken_plugins()
    spec = load_spec(spec_path, overrides, check_memory=False)  # the reference is not loaded
    widths = arm_widths(spec, arm, widths_text)
    run_dir = Path(spec.run_dir)
    out = out or arm_seed_dir(run_dir, arm, seed)
    # --steps trains another experiment than the spec's: its key and fingerprint say so
    settings = spec.train.with_steps(steps)
    key = arm_run_key(spec.model, spec.data, settings, widths, seed)
    with process_group():
        run = RunContext(
            run_dir,
            spec_path.parent,
            Console(stderr=True, soft_wrap=True),
            context(),
            spec.train.device,
        )
        run.say(f"preparing data ({spec.data.corpus or 'local files'})")
        # every process may call this: a lock lets one build the cache while the others wait
        data = run.token_data(spec.data)
        config = config_from_spec(spec.model, widths, data.vocab_size)
        run.say(
            f"training arm {arm}, seed {seed}: {config.num_params():,} parameters, widths "
            f"{' '.join(map(str, widths))}, {run.dist.world_size} process(es) -> {out}"
        )
        job = TrainingJob(
            out, key, widths, spec.model, settings, data, seed, track=TrackAs(spec.name, arm)
        )
        result = train_into(run, job, replace=False)
        if result is None:
            raise UsageError(
                f"{out}: another geospec process is training into this directory; let it "
                "finish (or stop it), or give another --out"
            )
        if run.is_main:
            click.echo(
                f"final validation loss {result.final_val_loss:.6f} after {result.steps} steps "
                f"({result.tokens:,} tokens, {result.tokens_per_second:,.0f} tokens/s)"
            )
