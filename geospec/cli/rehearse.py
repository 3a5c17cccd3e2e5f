"""``geospec rehearse SPEC`` (also ``geospec run SPEC --dry-run``): every arm's model built at
full size and trained a few steps on this machine with a short context; per arm the parameters,
peak memory and step time measured here, and the tokens/s and GPU-hours a GPU would need at an
assumed MFU. Writes nothing."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import click

from geospec.cli.console import plugin_option, set_option, spec_argument, warn_broken_plugins
from geospec.spec.sections import Spec

DEFAULT_STEPS = 3
DEFAULT_CONTEXT = 64


@click.command()
@spec_argument
@click.option(
    "--steps",
    type=click.IntRange(1, 1000),
    default=DEFAULT_STEPS,
    show_default=True,
    help="Timed optimizer steps per arm (after one untimed step).",
)
@click.option(
    "--context",
    type=click.IntRange(2),
    default=DEFAULT_CONTEXT,
    show_default=True,
    help="Tokens per sequence here (at most model.seq_len).",
)
@click.option(
    "--mfu",
    type=float,
    default=None,
    help="Assumed model FLOPs utilisation of a GPU (default 0.35).",
)
@click.option(
    "--peak-tflops",
    type=click.FloatRange(min=1),
    default=None,
    help="The GPU's dense bf16 peak (default 989, an H100/H200).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
@click.option(
    "--job-script",
    is_flag=True,
    help="Print instead the script the spec's [launch] would submit for its runs (the slurm "
    "launcher's sbatch script); nothing is built or submitted.",
)
@set_option
@plugin_option
def rehearse(
    spec_path: Path,
    steps: int,
    context: int,
    mfu: float | None,
    peak_tflops: float | None,
    as_json: bool,
    job_script: bool,
    overrides: tuple[str, ...],
) -> None:
    """Dry-run SPEC's shapes here: build every arm's model at full size, train a few steps on
    random tokens, and print what the spec's runs will need on GPUs. Writes nothing."""
    from geospec.spec.loading import load_spec

    warn_broken_plugins()
    spec = load_spec(spec_path, overrides, check_memory=False)
    if job_script:
        click.echo(launcher_script(spec), nl=False)
        return
    show_rehearsal(spec, steps, context, mfu, peak_tflops, as_json)


def launcher_script(spec: Spec) -> str:
    """What the spec's launcher would submit for every arm x seed run of the spec."""
    from geospec.errors import UsageError
    from geospec.kinds import Launcher
    from geospec.registry.loading import get_registries

    launcher: Launcher = get_registries().create("launcher", spec.launch or "local")
    runs = len(spec.arms) * len(spec.train.seeds)
    script = launcher.job_script(Path(spec.run_dir), runs)
    if script is None:
        kind = spec.launch.kind if spec.launch is not None else "local"
        raise UsageError(
            f"launch: the {kind!r} launcher submits no job script; a [launch] table such as "
            '{ kind = "slurm", gpus_per_run = 8 } does (docs/cluster.md)'
        )
    return script


def show_rehearsal(
    spec: Spec,
    steps: int = DEFAULT_STEPS,
    context: int = DEFAULT_CONTEXT,
    mfu: float | None = None,
    peak_tflops: float | None = None,
    as_json: bool = False,
) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from geospec.engine.progress import format_bytes
    from geospec.engine.rehearsal import ASSUMED_MFU, H100_BF16_TFLOPS
    from geospec.engine.rehearsal import rehearse as rehearse_arms

    mfu = ASSUMED_MFU if mfu is None else mfu
    peak_tflops = H100_BF16_TFLOPS if peak_tflops is None else peak_tflops
    if spec.probe_only:  # no GPU-hours quoted for arms that are never trained
        if as_json:
            click.echo(json.dumps({"arms": [], "gpu_hours": 0.0, "trains": False}, indent=2))
        else:
            click.echo(
                f"dry run of {spec.name}: the spec trains no arm (probe_only"
                + (", [prune]" if spec.prune is not None else "")
                + "): no training to rehearse (0 GPU-hours); its other stages run on the "
                "reference checkpoint (docs/prune.md, docs/pretrained.md)"
            )
        return
    console = Console(stderr=True, soft_wrap=True)
    context = min(context, spec.model.seq_len)
    rows = []
    for row in rehearse_arms(spec, steps, context, mfu=mfu, peak_tflops=peak_tflops):
        rows.append(row)
        if not as_json:
            console.print(f"{row.arm}: {row.step_seconds:.2f} s a step here", highlight=False)
    runs = len(spec.train.seeds)
    total_hours = sum(row.gpu_hours for row in rows) * runs
    assumptions = {
        "mfu": mfu,
        "peak_tflops": peak_tflops,
        "flops_per_token": "6 x parameters",
        "context_here": context,
        "steps_here": steps,
        "seeds": runs,
    }
    if as_json:
        click.echo(
            json.dumps(
                {
                    "arms": [asdict(r) for r in rows],
                    "assumed": assumptions,
                    "gpu_hours": total_hours,
                    "trains": True,
                },
                indent=2,
            )
        )
        return
    table = Table(title=f"dry run of {spec.name}: every arm at full size", title_justify="left")
    for header in (
        "arm",
        "widths",
        "parameters",
        "peak memory here",
        "step here",
        "tokens/s here",
        "GPU state / GPU",
        "GPU tokens/s",
        "GPU-hours / run",
    ):
        table.add_column(header, justify="left" if header in ("arm", "widths") else "right")
    for row in rows:
        widths = f"{min(row.widths)}-{max(row.widths)}" + (" (stand-in)" if row.stand_in else "")
        table.add_row(
            escape(row.arm),
            widths,
            f"{row.params:,}",
            format_bytes(row.peak_memory),
            f"{row.step_seconds:.2f} s",
            f"{row.cpu_tokens_per_second:,.0f}",
            format_bytes(row.gpu_state_bytes),
            f"{row.gpu_tokens_per_second:,.0f}",
            f"{row.gpu_hours:.3g}",
        )
    out = Console(soft_wrap=True)
    if not out.is_terminal:  # logs: the whole table, unwrapped
        out.width = max(out.width, 150)
    out.print(table)
    out.print(
        f"{len(rows)} arms x {runs} seeds: about {total_hours:,.3g} GPU-hours of training.\n"
        f"Measured here (batch 1, context {context}, fp32, eager): parameters, peak memory, step "
        f"time. Assumed: {mfu:.0%} MFU of {peak_tflops:g} TFLOP/s (dense bf16), 6 x parameters "
        "FLOPs a token; GPU state = fp32 weights, gradients and AdamW moments (16 bytes a "
        "parameter), activations not included."
        + (
            " (stand-in): widths from a stand-in profile; the measured profiles will give others."
            if any(row.stand_in for row in rows)
            else ""
        ),
        highlight=False,
    )
