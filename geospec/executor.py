"""The pipeline: validate -> reference -> probe -> measure -> diagnose -> solve -> train -> report.

Each stage reads only its own spec section and the previous stages' artifacts and writes its
artifacts into the run directory (atomically). A stage records a key (a hash of its spec section
and its inputs' keys) in ``stages.json``; when the key is unchanged and the artifacts exist the
stage is skipped, so ``geospec run`` on a finished run does nothing, and changing one arm retrains
only that arm. Training resumes from its last checkpoint, so a run killed at any moment and started
again ends with the same results.

Under ``torchrun`` every arm-seed run is trained with DDP across all processes (one run at a time,
all GPUs on it); the other stages run on rank 0 while the others wait.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console

from geospec import __version__
from geospec.atomic import atomic_write_json, atomic_write_text
from geospec.errors import GeospecError, UsageError
from geospec.spec import Spec, TrainSpec, measures

if TYPE_CHECKING:
    from geospec.distributed import DistContext

STAGES = ("reference", "probe", "measure", "diagnose", "solve", "train", "report")
STAGES_FILE = "stages.json"


def digest(*parts: Any) -> str:
    """A stable hash of JSON-serialisable parts (spec sections, upstream keys)."""
    text = json.dumps(parts, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def section(model: Any) -> Any:
    return model.model_dump(mode="json") if hasattr(model, "model_dump") else model


@dataclass
class Context:
    """What every stage can see: the spec, the run directory and how to talk to the user."""

    spec: Spec
    spec_path: Path
    run_dir: Path
    console: Console
    dist: DistContext
    """This process's place among torchrun's processes (rank 0 of 1 without torchrun)."""
    force: set[str] = field(default_factory=set)
    keys: dict[str, str] = field(default_factory=dict)
    ran: list[str] = field(default_factory=list)
    widths: dict[str, list[int]] = field(default_factory=dict)

    @property
    def is_main(self) -> bool:
        return self.dist.is_main

    def say(self, message: str) -> None:
        if self.is_main:
            self.console.print(message, highlight=False, soft_wrap=True)  # logs: no 80-col wrap

    def stored_keys(self) -> dict[str, str]:
        path = self.run_dir / STAGES_FILE
        if not path.exists():
            return {}
        try:
            stored: dict[str, str] = json.loads(path.read_text())
            return stored
        except json.JSONDecodeError:
            return {}  # a damaged bookkeeping file only costs recomputation

    def is_current(self, stage: str, key: str, *artifacts: Path) -> bool:
        if stage in self.force:
            return False
        return self.stored_keys().get(stage) == key and all(p.exists() for p in artifacts)

    def needs(self, stage: str, key: str, *artifacts: Path) -> bool:
        """Record the stage's key; say it is skipped and return False when it is up to date."""
        self.keys[stage] = key
        if self.is_current(stage, key, *artifacts):
            self.say(f"[dim]✓ {stage}: up to date (skipped)[/]")
            return False
        self.ran.append(stage)
        return True

    def finish(self, stage: str, key: str) -> None:
        if self.is_main:
            keys = self.stored_keys()
            keys[stage] = key
            atomic_write_json(self.run_dir / STAGES_FILE, keys)


# ---------------------------------------------------------------------------------------------
# data and models


def data_key(spec: Spec) -> str:
    return digest("data", section(spec.data))


def token_data(ctx: Context) -> Any:
    """Tokens of the spec's data, prepared once per data section (cached under data/<key>)."""
    from geospec.data import prepare_data

    # prepare_data keys its own sub-folder by the data section and the source files' contents
    return prepare_data(ctx.spec.data, ctx.run_dir / "data", spec_dir=ctx.spec_path.parent)


def reference_key(spec: Spec) -> str:
    ref = spec.reference
    if ref.checkpoint is not None:
        path = Path(ref.checkpoint)
        stamp = [(str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in _files(path)]
        return digest("reference-checkpoint", str(path.resolve()), stamp)
    return digest(
        "reference",
        section(spec.model),
        data_key(spec),
        section(spec.reference),
        training_settings(spec.train.model_copy(update={"seeds": [ref.seed]})),
    )


#: Train settings that change how a run is carried out (CPU threads, how often it saves and
#: logs) but not what it computes. Keys see them at their defaults, so changing one never
#: retrains anything.
BOOKKEEPING = ("threads", "checkpoint_interval", "log_interval")


def training_settings(train: TrainSpec) -> dict[str, Any]:
    """The train section as run keys see it (bookkeeping fields at their defaults)."""
    defaults = {name: TrainSpec.model_fields[name].default for name in BOOKKEEPING}
    return section(train.model_copy(update=defaults))


def _files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    return sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else []


# ---------------------------------------------------------------------------------------------
# stages


def stage_reference(ctx: Context) -> None:
    from geospec.distributed import claim_on_main

    spec = ctx.spec
    key = reference_key(spec)
    ctx.keys["reference"] = key
    if spec.reference.checkpoint is not None:
        checkpoint = Path(spec.reference.checkpoint)
        if not checkpoint.exists():
            raise UsageError(
                f"reference.checkpoint: {checkpoint} does not exist; give a local Hugging Face "
                "model directory or .gguf file"
            )
        ctx.say(f"[green]✓[/] reference: pretrained checkpoint {checkpoint}")
        ctx.finish("reference", key)
        return
    out = ctx.run_dir / "reference"
    if not ctx.needs("reference", key, out / "result.json"):
        return
    widths = [spec.model.ffn_width] * spec.model.n_layers
    with claim_on_main(out, ctx.dist) as claimed:
        if not claimed:
            raise UsageError(
                f"{out}: another geospec process is training the reference of this run; "
                "let it finish (or stop it), then run again"
            )
        _own_run_dir(ctx, out, key, widths, redo="reference" in ctx.force)
        data = token_data(ctx)
        ctx.say(f"[bold]reference[/]: training the uniform model ({_budget(spec)})")
        _train(ctx, data, widths, out, seed=spec.reference.seed, steps=spec.reference.train_steps)
    ctx.finish("reference", key)


def _budget(spec: Spec) -> str:
    if spec.reference.train_steps:
        return f"{spec.reference.train_steps} steps"
    return f"{spec.train.steps} steps" if spec.train.steps else f"{spec.train.tokens:,} tokens"


def _train(
    ctx: Context,
    data: Any,
    widths: list[int],
    out: Path,
    seed: int,
    steps: int | None = None,
    reuse_reference: bool = False,
) -> Any:
    from geospec.model import config_from_spec
    from geospec.train import train_model

    config = config_from_spec(ctx.spec.model, widths, data.vocab_size)
    if reuse_reference and ctx.is_main:
        _reuse_reference(ctx, config, data, out, seed)
    return train_model(
        ctx.spec.train, config, data, out, seed=seed, steps=steps, progress=ctx.is_main
    )


def _reuse_reference(ctx: Context, config: Any, data: Any, out: Path, seed: int) -> None:
    """The reference is often exactly the uniform arm's run for its seed: copy it, don't retrain.

    The copy is made only when the trainer's own fingerprint (model config, data, seed, steps,
    batch and optimizer settings) is identical, so the result is the same as retraining.
    """
    from geospec.train import fingerprint, total_steps

    source = ctx.run_dir / "reference"
    result = source / "result.json"
    if not result.exists() or (out / "result.json").exists():
        return
    wanted = fingerprint(
        ctx.spec.train, config, data, seed, total_steps(ctx.spec.train, config.seq_len)
    )
    if json.loads(result.read_text()).get("fingerprint") != wanted:
        return
    out.mkdir(parents=True, exist_ok=True)
    for path in sorted(source.iterdir()):
        if path.is_file() and path.name not in ("result.json", RUN_KEY_FILE):
            shutil.copy2(path, out / path.name)
    shutil.copy2(result, out / "result.json")  # last: marks the copy complete
    ctx.say(f"  identical to the reference run: reused {source.relative_to(ctx.run_dir)}")


RUN_KEY_FILE = "run_key.json"


def stored_run_key(out: Path) -> str | None:
    path = out / RUN_KEY_FILE
    return json.loads(path.read_text()).get("key") if path.exists() else None


def is_trained(out: Path, key: str) -> bool:
    """``out`` holds the finished run ``key``."""
    from geospec.report import RESULT_FILE

    return stored_run_key(out) == key and (out / RESULT_FILE).exists()


def _own_run_dir(ctx: Context, out: Path, key: str, widths: list[int], redo: bool) -> None:
    """Make ``out`` the training directory of the run ``key`` (the caller holds its claim).

    A directory holding a run of another key (older inputs), or one to redo, is emptied first:
    it would otherwise be resumed wrongly. A directory of the same key is kept, so an
    interrupted run resumes from its last checkpoint.
    """
    if ctx.is_main:
        stored = stored_run_key(out)
        if out.exists() and (redo or (stored is not None and stored != key)):
            ctx.say(f"[yellow]![/] {out.relative_to(ctx.run_dir)}: inputs changed, starting over")
            shutil.rmtree(out)
        atomic_write_json(out / RUN_KEY_FILE, {"key": key, "widths": widths})
    _barrier(ctx)


def stage_probe(ctx: Context) -> None:
    spec = ctx.spec
    # the data section matters too: a pretrained reference's key covers only its checkpoint files
    key = digest("probe", section(spec.probe), ctx.keys["reference"], data_key(spec))
    clouds_dir = ctx.run_dir / "clouds"
    if not ctx.needs("probe", key, clouds_dir / "meta.json") or not ctx.is_main:
        return
    from geospec.clouds import run_probe

    run_probe(ctx, clouds_dir)
    ctx.finish("probe", key)


def stage_measure(ctx: Context) -> None:
    entries = measures(ctx.spec)
    keys = {e.profile: digest("measure", section(e), ctx.keys["probe"]) for e in entries}
    key = digest("measure", keys)
    path = ctx.run_dir / "profiles.json"
    if not ctx.needs("measure", key, path) or not ctx.is_main:
        return
    # Profiles measured before on the same clouds with the same settings are kept.
    previous = json.loads(path.read_text()) if path.exists() else {}
    kept = {
        name: values
        for name, values in previous.get("profiles", {}).items()
        if previous.get("keys", {}).get(name) == keys.get(name) and "measure" not in ctx.force
    }
    todo = [e for e in entries if e.profile not in kept]
    if todo:
        from geospec.clouds import load_clouds
        from geospec.measure import measure_profiles

        clouds = load_clouds(ctx.run_dir / "clouds")
        ctx.say(f"[bold]measure[/]: {len(todo)} profiles x {len(clouds)} layers")
        measured = measure_profiles(clouds, todo, progress=True)
        kept.update(measured)
    profiles = {e.profile: kept[e.profile] for e in entries}
    atomic_write_json(path, {"profiles": profiles, "keys": keys})
    ctx.finish("measure", key)


def stage_diagnose(ctx: Context) -> None:
    """Diagnostics of the reference (geospec.diagnostics); only when [diagnose] is enabled.

    The reference's measurements are keyed by the diagnose settings, the probe and the data; the
    correlations with the work profiles also by the measure stage, so adding a profile only
    recomputes correlations.
    """
    from geospec.diagnostics import DIAGNOSTICS_FILE, diagnose, read_diagnostics

    spec = ctx.spec
    path = ctx.run_dir / DIAGNOSTICS_FILE
    if not spec.diagnose.enabled:
        stale = read_diagnostics(ctx.run_dir) if ctx.is_main else None
        if stale is not None and stale.get("keys", {}).get("probe") != ctx.keys["probe"]:
            path.unlink()  # made from another reference or probe: it would be reported wrongly
        return
    settings = spec.diagnose.model_dump(mode="json", exclude={"enabled"})
    compute_key = digest(
        "diagnose", settings, ctx.keys["probe"], data_key(spec), spec.model.seq_len
    )
    key = digest("diagnose", compute_key, ctx.keys["measure"])
    if not ctx.needs("diagnose", key, path) or not ctx.is_main:
        return
    previous = None if "diagnose" in ctx.force else read_diagnostics(ctx.run_dir)
    diagnostics = diagnose(ctx, compute_key, previous)
    atomic_write_json(path, diagnostics)
    if spec.report.plots:
        from geospec.diagnostics_report import diagnostic_plots

        diagnostic_plots(ctx.run_dir, diagnostics)
    ctx.finish("diagnose", key)


def stage_solve(ctx: Context) -> None:
    from geospec.widths import compute_widths, write_widths

    spec = ctx.spec
    path = ctx.run_dir / "profiles.json"
    profiles = json.loads(path.read_text())["profiles"] if path.exists() else {}
    if spec.diagnose.enabled:
        from geospec.diagnostics import diagnostic_profiles

        profiles = {**profiles, **diagnostic_profiles(ctx.run_dir)}
    result = compute_widths(spec, profiles)
    if result.pending:
        raise GeospecError(f"solve: profiles missing for arms {sorted(result.pending)}")
    key = digest("solve", result.to_json())
    ctx.widths = result.widths
    if not ctx.needs("solve", key, ctx.run_dir / "widths.json"):
        return
    if ctx.is_main:
        write_widths(ctx.run_dir, result)
        _print_widths(ctx, result.widths)
    ctx.finish("solve", key)


def _print_widths(ctx: Context, widths: dict[str, list[int]]) -> None:
    for arm, values in widths.items():
        ctx.say(f"  {arm:<24} {' '.join(str(w) for w in values)}")


def arm_run_key(spec: Spec, arm_widths: list[int], seed: int) -> str:
    train = training_settings(spec.train)
    train.pop("seeds")
    return digest("train", section(spec.model), data_key(spec), train, arm_widths, seed)


def stage_train(ctx: Context) -> None:
    from geospec.distributed import claim_on_main
    from geospec.report import arm_seed_dir

    spec = ctx.spec
    if spec.probe_only:
        ctx.keys["train"] = digest("train", "probe-only")
        ctx.say("[dim]- train: probe-only spec, no arm is trained[/]")
        return
    widths = ctx.widths
    todo = []
    # Seed-major order: a study stopped part-way holds every arm for the seeds it finished, so
    # its report already compares arms on paired seeds.
    for seed in spec.train.seeds:
        for arm in spec.arms:
            out = arm_seed_dir(ctx.run_dir, arm.name, seed)
            key = arm_run_key(spec, widths[arm.name], seed)
            if not is_trained(out, key) or "train" in ctx.force:
                todo.append((arm.name, seed, out, key))
    ctx.keys["train"] = digest(
        "train", [arm_run_key(spec, widths[a.name], s) for a in spec.arms for s in spec.train.seeds]
    )
    if not todo:
        ctx.say("[dim]✓ train: every arm and seed is trained (skipped)[/]")
        return
    ctx.ran.append("train")
    data = token_data(ctx)
    held_elsewhere = 0
    for index, (arm_name, seed, out, key) in enumerate(todo, start=1):
        name = f"[bold]train[/] [{index}/{len(todo)}]: arm {arm_name}, seed {seed}"
        with claim_on_main(out, ctx.dist) as claimed:
            if not claimed:  # another `geospec run` of this directory is training it
                ctx.say(f"{name}: [yellow]another process is training it (skipped)[/]")
                held_elsewhere += 1
                continue
            if is_trained(out, key) and "train" not in ctx.force:
                continue  # finished by another process since the list was made
            _own_run_dir(ctx, out, key, widths[arm_name], redo="train" in ctx.force)
            ctx.say(name)
            _train(ctx, data, widths[arm_name], out, seed=seed, reuse_reference=True)
    if held_elsewhere:
        ctx.say(
            f"[yellow]![/] train: {held_elsewhere} run(s) were being trained by another process; "
            "the report below leaves them out until a later run finds them finished"
        )
        return
    ctx.finish("train", ctx.keys["train"])


def stage_report(ctx: Context) -> None:
    from geospec.report import print_table, write_report

    if not ctx.is_main:
        return
    spec = ctx.spec
    key = digest(
        "report",
        ctx.keys.get("train"),
        ctx.keys.get("measure"),
        section(spec.report),
        [a.name for a in spec.arms],
        *([ctx.keys["diagnose"]] if "diagnose" in ctx.keys else []),
    )
    if ctx.is_current("report", key, ctx.run_dir / "results.json") and not ctx.ran:
        ctx.say("[dim]✓ report: up to date (skipped)[/]")
        results = json.loads((ctx.run_dir / "results.json").read_text())
    else:
        ctx.ran.append("report")
        results = write_report(ctx.run_dir, plots=spec.report.plots)
        ctx.finish("report", key)
    print_table(results)
    ctx.say(f"report: {ctx.run_dir / 'report.md'}")


STAGE_FUNCTIONS: dict[str, Callable[[Context], None]] = {
    "reference": stage_reference,
    "probe": stage_probe,
    "measure": stage_measure,
    "diagnose": stage_diagnose,
    "solve": stage_solve,
    "train": stage_train,
    "report": stage_report,
}


# ---------------------------------------------------------------------------------------------
# the run


def write_run_metadata(ctx: Context) -> None:
    """The resolved spec, plugin versions and environment, recorded with every run."""
    from geospec.plugins import get_registries

    spec = ctx.spec
    resolved = spec.model_dump(mode="json")
    resolved["measure"] = [section(e) for e in measures(spec)]
    import tomlkit

    atomic_write_text(ctx.run_dir / "spec.resolved.toml", tomlkit.dumps(_without_none(resolved)))
    atomic_write_json(ctx.run_dir / "plugins.json", get_registries().describe())
    atomic_write_json(ctx.run_dir / "env.json", environment())
    atomic_write_json(
        ctx.run_dir / "run.json",
        {
            "name": spec.name,
            "spec": str(ctx.spec_path),
            "baseline": spec.report.baseline,
            "confidence": spec.report.confidence,
            "bootstrap": spec.report.bootstrap,
            "arms": [{"name": a.name, "schedule": section(a.schedule)} for a in spec.arms],
            "seeds": list(spec.train.seeds),
            "geospec": __version__,
        },
    )


def _without_none(value: Any) -> Any:
    """TOML has no null: leave unset options out (they resolve to their defaults again)."""
    if isinstance(value, dict):
        return {k: _without_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_none(v) for v in value]
    return value


def environment() -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "torch": torch.__version__,
        "cuda": torch.cuda.is_available(),
        "devices": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
        "cpu_count": os.cpu_count(),
        "geospec": __version__,
        "world_size": int(os.environ.get("WORLD_SIZE", "1")),
    }
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            cwd=Path(__file__).parent,
        )
        info["git_sha"] = sha.stdout.strip() or None
    except (OSError, subprocess.TimeoutExpired):
        info["git_sha"] = None
    return info


def _barrier(ctx: Context) -> None:
    from geospec.distributed import barrier

    barrier(ctx.dist)


def run_pipeline(
    spec: Spec,
    spec_path: Path,
    from_stage: str | None = None,
    until_stage: str | None = None,
    console: Console | None = None,
    run_dir: Path | None = None,
) -> list[str]:
    """Run the stages in order; returns the stages that did work (empty: already up to date)."""
    for name, value in (("--from", from_stage), ("--until", until_stage)):
        if value is not None and value not in STAGES:
            raise UsageError(f"{name} {value}: unknown stage; stages are {', '.join(STAGES)}")
    first = STAGES.index(from_stage) if from_stage else 0
    last = STAGES.index(until_stage) if until_stage else len(STAGES) - 1
    if first > last:
        raise UsageError(f"--from {from_stage} comes after --until {until_stage}")
    from geospec.distributed import context, process_group

    with process_group():
        ctx = Context(
            spec,
            spec_path,
            run_dir or Path(spec.run_dir),
            console or Console(),
            context(),
            force=set(STAGES[first:]) if from_stage else set(),
        )
        if ctx.is_main:
            ctx.run_dir.mkdir(parents=True, exist_ok=True)
            write_run_metadata(ctx)
        _barrier(ctx)
        # Stages before --from still run, but only to recompute their keys (they are up to date
        # or are brought up to date: a later stage never runs on stale inputs).
        for stage in STAGES[: last + 1]:
            STAGE_FUNCTIONS[stage](ctx)
            _barrier(ctx)
        if not ctx.ran:
            ctx.say("[green]nothing to do:[/] every stage is up to date")
        return ctx.ran
