"""``geospec prune``: the pretrained reference pruned to budgets with every [prune] arm."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple, TypeVar

import click

from geospec.cli.console import (
    format_option,
    gguf_dtype_option,
    plugin_option,
    set_option,
    spec_argument,
)
from geospec.cli.until import from_option, out_option, run_until, threads_option
from geospec.errors import UsageError
from geospec.spec.sections import BEST, PruneSpec, Spec


@click.command()
@spec_argument
@from_option("prune")
@out_option
@threads_option
@set_option
@plugin_option
@click.option(
    "--arms",
    metavar="A,B",
    help="Compute only these arms' units (a grid arm's name: every setting); the prune stays "
    "unfinished, and says which units are missing, until a run without --arms computes them.",
)
@click.option(
    "--keep",
    "keep_fractions",
    metavar="0.5,0.75",
    help="Compute only the units at these keep fractions (of prune.keep); like --arms.",
)
@click.option(
    "--export",
    "export_unit",
    metavar="ARM@KEEP",
    help="Write this arm's model at this keep fraction to --to (a finished unit is exported, "
    "not computed again).",
)
@click.option(
    "--seed",
    type=int,
    default=None,
    help="With --export: the calibration seed's unit (default: the first of prune.calibration).",
)
@click.option(
    "--to",
    type=click.Path(path_type=Path, file_okay=False),
    default=None,
    help="With --export: a new directory for the model, with the checkpoint's tokenizer.",
)
@format_option(
    "With --export: hf, a transformers directory; gguf, a llama.cpp file at the true widths."
)
@click.option(
    "--padded",
    is_flag=True,
    help="With --export: every FFN zero-padded to the widest layer, so that plain "
    "AutoModelForCausalLM.from_pretrained reads the directory (the same logits; the zero "
    "units cost parameters and time).",
)
@gguf_dtype_option(
    "With --format gguf: the weights' type (default: a GGUF checkpoint's own type, f16 "
    "otherwise; the K-quants need llama-cpp-python), as geospec export --dtype."
)
def prune(
    spec_path: Path,
    from_stage: str | None,
    out: Path | None,
    overrides: tuple[str, ...],
    arms: str | None,
    keep_fractions: str | None,
    export_unit: str | None,
    seed: int | None,
    to: Path | None,
    fmt: str,
    padded: bool,
    dtype: str | None,
) -> None:
    """Prune SPEC's pretrained reference.checkpoint to each [prune] keep fraction with every
    [prune] arm's allocation and each calibration seed (docs/prune.md).

    Runs the stages up to prune (profiles, diagnostics and demand where SPEC enables them, for
    the arms that read them), writes every pruned model's losses (and, with export, its
    transformers checkpoint) under prune/, prune.json and report.md's pruning section, and
    prints the comparison with the baseline arm. An interrupted prune resumes. With [eval] (and
    nothing to train), every exported pruned model is also scored on its lm-eval tasks, and the
    comparison has a row per metric.

    With --export ARM@KEEP --to DIR, also one pruned model as a directory that
    geospec.load_pruned reads (the checkpoint's tokenizer beside it), the units' other work
    reused: `geospec prune SPEC --export flap@0.5 --to flap-half`; with --padded, one that
    plain AutoModelForCausalLM.from_pretrained reads; with --format gguf, a GGUF file.
    --export best@KEEP exports the arm [prune] select recommends at KEEP (chosen without eval
    text: docs/prune.md, "What to ship").

    With --arms A,B and/or --keep F,G, only those units (every calibration seed's): each is
    recorded as it finishes, and a later `geospec prune SPEC` reuses them and computes the rest
    (prune.json and the comparison wait for every unit).
    """
    from geospec.report.prune import prune_markdown, what_to_ship, with_unit_scores
    from geospec.rundir.layout import PRUNE_DIR, PRUNE_FILE, REPORT_FILE
    from geospec.rundir.records import read_prune
    from geospec.storage.atomic import atomic_write_text

    if (export_unit is None) != (to is None) or (
        (seed is not None or padded or fmt != "hf" or dtype is not None) and export_unit is None
    ):
        raise UsageError(
            "--export ARM@KEEP and --to DIR go together (and --seed, --format, --dtype and "
            "--padded with them): geospec prune SPEC --export flap@0.5 --to flap-half"
        )
    if to is not None:
        check_target(to, fmt, padded, dtype)
    choice = Choice(_listed("--arms", arms, str), _listed("--keep", keep_fractions, float))
    done = run_prune(spec_path, overrides, from_stage, out, export_unit, seed, choice, padded)
    if done is None:
        return  # under torchrun, rank 0 alone reports
    spec, run_dir, wanted = done
    record = read_prune(run_dir)
    if record is not None:
        scored = with_unit_scores(record, run_dir)
        text = prune_markdown(scored, compare=spec.report.compare)
        atomic_write_text(run_dir / PRUNE_DIR / REPORT_FILE, text)
        # what to ship closes the output (the tables scroll past), once
        click.echo(prune_markdown(scored, compare=spec.report.compare, ship=False))
        shipped = what_to_ship(record)
        if shipped:
            click.echo("\n".join(["", *shipped]))
        click.echo(f"\nprune: {run_dir / PRUNE_FILE}, {run_dir / PRUNE_DIR / REPORT_FILE}")
    elif choice.arms is None and choice.keep is None:
        raise UsageError(f"{run_dir}: the prune stage wrote no {PRUNE_FILE}")
    else:  # the stage has said which units --arms/--keep left out
        click.echo(f"prune: the chosen units are in {run_dir / PRUNE_DIR}; no {PRUNE_FILE} yet")
    if wanted is not None and to is not None:
        from geospec.cli.console import stderr
        from geospec.prune.exports import export_padded, export_with_tokenizer
        from geospec.rundir.layout import prune_unit_dir

        keep, arm, chosen = wanted
        unit = prune_unit_dir(run_dir, keep, arm, chosen)
        if fmt == "gguf":
            from geospec.prune.exports import export_prune_unit

            # seconds to a minute of writing and quantizing: said, not silent
            stderr().print(f"prune: writing {arm}@{keep:g} (seed {chosen}) as GGUF to {to}")
            click.echo(export_prune_unit(unit, to, "gguf", dtype))
            say_speed(unit, to, "prune")
        else:
            click.echo(export_padded(unit, to) if padded else export_with_tokenizer(unit, to))


def say_speed(unit: Path, to: Path, command: str) -> None:
    """The GGUF file ``to``, written from the prune unit ``unit``, timed in llama.cpp against
    its source file (where llama-cpp-python is installed and the reference is a GGUF file):
    what the smaller file buys where it runs, measured now against the user's own."""
    from geospec.cli.console import stderr
    from geospec.prune.exports import run_checkpoint
    from geospec.prune.runtime import have_llamacpp, speed_line

    source = run_checkpoint(unit)
    if have_llamacpp() and source is not None and source.suffix == ".gguf":
        stderr().print(f"{command}: timing {to.name} against {source.name} in llama.cpp")
        click.echo(speed_line(to, source))


def run_prune(
    spec_path: Path,
    overrides: tuple[str, ...],
    from_stage: str | None,
    out: Path | None,
    export_unit: str | None,
    seed: int | None,
    choice: Choice,
    padded: bool = False,
) -> tuple[Spec, Path, tuple[float, str, int] | None] | None:
    """Run the prune (only the units ``choice`` names) with ``export_unit``'s model (``ARM@KEEP``
    or ``best@KEEP``: the prune first, then the arm it recommends) written into its unit: the
    spec, the run directory and that unit (keep, arm, seed); None on the ranks other than 0
    under torchrun. ``geospec prune`` and ``geospec heal`` both start so. ``padded``: the model
    is to be exported padded (checked before anything runs: a repair's bias the family's
    transformers MLP cannot hold)."""
    wanted: list[tuple[float, str, int]] = []
    best = export_unit is not None and export_unit.partition("@")[0] == BEST
    if export_unit is not None and best:
        # the recommendation needs every unit: the prune first, then its chosen arm
        keep = _best_keep(spec_path, overrides, export_unit, choice)
        done = run_until(
            _last_stage, spec_path, overrides, from_stage, out,
            adapt=_has_prune(spec_path, best=export_unit if padded else None),
        )  # fmt: skip
        if done is None:
            return None
        export_unit = f"{_recommended(done[1], keep)}@{keep:g}"
        from_stage = None  # the prune just ran: its units are reused, the chosen one exported
    adapt = _has_prune(spec_path, export_unit, seed, wanted, choice, padded)
    done = run_until(
        _last_stage, spec_path, overrides, from_stage, out, adapt=adapt,
        prune_arms=choice.arms, prune_keep=choice.keep,
    )  # fmt: skip
    if done is None:
        return None
    return done[0], done[1], wanted[0] if wanted else None


def _best_keep(spec_path: Path, overrides: tuple[str, ...], export: str, choice: Choice) -> float:
    """The keep fraction of ``--export best@KEEP``, checked against the spec with its --set
    ``overrides`` before anything runs (one line, exit 2): the spec recommends (prune.select),
    KEEP is one of prune.keep, and no --arms/--keep leaves a unit out (the recommendation
    compares every arm)."""
    from geospec.spec.loading import load_spec

    spec = load_spec(spec_path, overrides)
    text = export.partition("@")[2]
    try:
        keep = float(text)
    except ValueError:
        keep = math.nan
    if spec.prune is None:
        raise UsageError(f"{spec_path}: no [prune] section; add one (docs/prune.md)")
    if spec.prune.select is None:
        raise UsageError(
            f"--export {export}: {spec_path} recommends no arm; add [prune] select = "
            '{ windows = 8 } (docs/prune.md, "What to ship"), or name the arm (ARM@KEEP)'
        )
    if keep not in spec.prune.fractions:
        raise UsageError(
            f"--export {export}: the keep fraction after @ must be one of prune.keep "
            + ", ".join(f"{k:g}" for k in spec.prune.fractions)
        )
    if choice.arms is not None or choice.keep is not None:
        raise UsageError(f"--export {export}: the recommendation compares every unit; drop "
                         "--arms and --keep")  # fmt: skip
    return keep


def _recommended(run_dir: Path, keep: float) -> str:
    """The arm prune.json recommends at ``keep``."""
    from geospec.rundir.records import read_prune

    record = read_prune(run_dir)
    budgets = [] if record is None else [b for b in record["budgets"] if b["keep"] == keep]
    if not budgets or "recommended" not in budgets[0]:
        raise UsageError(f"{run_dir}: prune.json holds no recommendation at keep {keep:g}")
    arm: str = budgets[0]["recommended"]["arm"]
    return arm


def check_target(to: Path, fmt: str, padded: bool, dtype: str | None) -> None:
    """--to, --format, --padded and --dtype checked before anything runs (one line, exit 2)."""
    from geospec.storage.atomic import check_new_directory

    if padded and fmt == "gguf":
        raise UsageError("--padded is for --format hf; a GGUF file holds the true widths")
    if dtype is not None and fmt != "gguf":
        raise UsageError("--dtype is for --format gguf; an hf export keeps the model's dtype")
    if fmt == "hf":
        check_new_directory(to, f"--to {to}")
    elif to.exists():
        raise UsageError(f"--to {to}: exists; give a new file (nothing is overwritten)")
    elif to.suffix != ".gguf":
        raise UsageError(f"--to {to}: a GGUF file's name ends in .gguf (e.g. --to {to}.gguf)")


def _last_stage(spec: Spec) -> str:
    """Up to prune; with [eval] in a spec that trains nothing, up to eval: the pruned models
    are scored too (a spec that also trains arms scores them with geospec eval or run, which
    train first)."""
    return "eval" if spec.eval is not None and spec.probe_only else "prune"


class Choice(NamedTuple):
    """``--arms`` and ``--keep`` as given (None: every arm, every keep fraction)."""

    arms: list[str] | None = None
    keep: list[float] | None = None


T = TypeVar("T")


def _listed(option: str, text: str | None, kind: Callable[[str], T]) -> list[T] | None:
    """A comma-separated option's values (one line, exit 2, when one is not a ``kind``)."""
    if text is None:
        return None
    try:
        values = [kind(part.strip()) for part in text.split(",") if part.strip()]
    except ValueError:
        values = []
    if not values:
        example = "flap,owl" if option == "--arms" else "0.5,0.75"
        raise UsageError(f"{option} {text}: give values separated by commas ({option} {example})")
    return values


def _has_prune(
    spec_path: Path,
    export: str | None = None,
    seed: int | None = None,
    wanted: list[tuple[float, str, int]] | None = None,
    choice: Choice | None = None,
    padded: bool = False,
    best: str | None = None,
) -> Callable[[Spec], Spec]:
    """A check that the spec has a [prune] section (one line naming the file, exit 2) whose arms
    and keep fractions ``choice`` names; with ``export`` (``ARM@KEEP``, one of the chosen
    units), the spec exporting that unit group too, the unit appended to ``wanted`` (keep, arm,
    seed), refused ``padded`` where the checkpoint's family's transformers MLP cannot hold the
    arm's repair. Checked when the spec is loaded, before any stage runs; with ``best``
    (``--export best@KEEP`` padded), what may not be written is said
    (:func:`geospec.spec.file_checks.bias_export_warnings`)."""

    def check(spec: Spec) -> Spec:
        from geospec.prune.units import Unit, chosen_units
        from geospec.spec.file_checks import bias_export_warnings, export_option_problem

        if spec.prune is None:
            raise UsageError(f"{spec_path}: no [prune] section; add one (docs/prune.md)")
        prune = spec.prune
        if choice is not None:
            _check_choice(prune, choice)
        if best is not None:
            from geospec.cli.console import escape, stderr

            asked = f"--export {best} --padded"
            for warning in bias_export_warnings(spec, spec_path.parent, asked):
                stderr().print(f"[yellow]warning:[/] {escape(warning)}", highlight=False)
        if export is None:
            return spec
        arm, _, text = export.rpartition("@")
        names = [a.name for a in prune.arms]
        try:
            keep = float(text)
        except ValueError:
            keep = math.nan
        if arm not in names:
            raise UsageError(f"--export {export}: no [prune] arm is named {arm!r}; the arms are "
                             + ", ".join(names))  # fmt: skip
        if keep not in prune.fractions:
            raise UsageError(
                f"--export {export}: the keep fraction after @ must be one of prune.keep "
                + ", ".join(f"{k:g}" for k in prune.fractions)
            )
        seeds = prune.calibration.seeds
        chosen = seeds[0] if seed is None else seed
        if chosen not in seeds:
            raise UsageError(
                f"--seed {chosen}: not one of prune.calibration.seeds {', '.join(map(str, seeds))}"
            )
        if choice is not None and Unit(keep, arm, chosen) not in chosen_units(
            prune, choice.arms, choice.keep
        ):
            raise UsageError(f"--export {export}: --arms/--keep leave this unit out; choose it too")
        option = f"--export {export} --padded"
        if padded and (problem := export_option_problem(spec, spec_path.parent, option, arm)):
            raise UsageError(problem)
        if wanted is not None:
            wanted.append((keep, arm, chosen))
        if prune.exports(keep, arm):
            return spec
        entries = [] if isinstance(prune.export, bool) else list(prune.export)
        exported = prune.model_copy(update={"export": [*entries, f"{arm}@{keep:g}"]})
        return spec.model_copy(update={"prune": exported})

    return check


def _check_choice(prune: PruneSpec, choice: Choice) -> None:
    """--arms names arms (or grid arms) and --keep fractions of prune.keep (one line, exit 2)."""
    for name in choice.arms or ():
        if not prune.arms_named(name):
            arms = [*prune.sweeps, *(arm.name for arm in prune.arms)]
            raise UsageError(f"--arms: no [prune] arm is named {name!r}; the arms are "
                             + ", ".join(arms))  # fmt: skip
    for keep in choice.keep or ():
        if keep not in prune.fractions:
            raise UsageError(
                f"--keep {keep:g}: not one of prune.keep "
                + ", ".join(f"{k:g}" for k in prune.fractions)
            )
