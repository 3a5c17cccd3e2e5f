"""The pipeline: validate -> reference -> probe -> measure -> diagnose -> demand -> solve -> prune
-> train -> eval -> report.

Each stage (one module in :mod:`geospec.pipeline.stages`) is built from the spec sections it
depends on and plans itself: a key (a hash of those sections and its upstream stages' keys), the
artifacts that prove it finished, and its work. This loop decides, for every stage alike, to skip
it (its recorded key in ``stages.json`` is unchanged and its artifacts exist) or to run it and
record its key; a stage's outputs go to the stages after it. So ``geospec run`` on a finished run
does nothing, changing one arm retrains only that arm, and a run killed at any moment and started
again ends with the same results (training resumes from its last checkpoint).

Under ``torchrun`` every arm-seed run is trained with DDP across all processes (one run at a time,
all GPUs on it); probe, measure and diagnose spread their work over the processes; stages marked
``main_only`` run on rank 0 while the others wait (for hours if need
be: :func:`geospec.engine.distributed.wait_for_main`), then read the outputs back.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from rich.console import Console

from geospec.errors import UsageError
from geospec.pipeline.context import INCOMPLETE, Done, RunContext, Stage, Upstream
from geospec.pipeline.run_dir import pin_measures, prepare_run_dir, write_run_metadata
from geospec.pipeline.stages.demand import DemandStage
from geospec.pipeline.stages.diagnose import Diagnose
from geospec.pipeline.stages.eval import Eval
from geospec.pipeline.stages.measure import Measure
from geospec.pipeline.stages.probe import Probe
from geospec.pipeline.stages.prune import PruneStage
from geospec.pipeline.stages.reference import Reference, release_reference
from geospec.pipeline.stages.report import Report
from geospec.pipeline.stages.solve import Solve
from geospec.pipeline.stages.train import Train
from geospec.rundir.layout import STAGES_FILE
from geospec.rundir.records import StageLog
from geospec.spec.sections import Spec

STAGE_TYPES: tuple[type[Stage], ...] = (
    Reference,
    Probe,
    Measure,
    Diagnose,
    DemandStage,
    Solve,
    PruneStage,
    Train,
    Eval,
    Report,
)
STAGES = tuple(stage.name for stage in STAGE_TYPES)


def stage_graph() -> dict[str, tuple[str, ...]]:
    """Each stage and the earlier stages it reads (its ``reads``), in pipeline order."""
    graph: dict[str, tuple[str, ...]] = {}
    for stage in STAGE_TYPES:
        later = [name for name in stage.reads if name not in graph]
        if later:  # a stage reads only what ran before it
            raise RuntimeError(f"the {stage.name} stage reads {later}, not earlier stages")
        graph[stage.name] = stage.reads
    return graph


def run_pipeline(
    spec: Spec,
    spec_path: Path,
    from_stage: str | None = None,
    until_stage: str | None = None,
    console: Console | None = None,
    run_dir: Path | None = None,
    overrides: Sequence[str] = (),
    arms: Sequence[str] | None = None,
    seeds: Sequence[int] | None = None,
    prune_arms: Sequence[str] | None = None,
    prune_keep: Sequence[float] | None = None,
) -> list[str]:
    """Run the stages in order; returns the stages that did work (empty: already up to date).

    ``from_stage`` redoes that stage and every later one; ``until_stage`` stops after it. Stages
    before ``from_stage`` still plan themselves: a later stage never runs on stale inputs.
    ``overrides``: the ``--set`` values ``spec`` was loaded with (a launcher whose later job runs
    the pipeline again passes them on). ``arms``, ``seeds``: train only these (the train stage
    then stays unfinished while other runs are untrained, and the report says which are
    missing); each must be one of the spec's. ``prune_arms``, ``prune_keep``: likewise compute
    only these prune units (:attr:`RunContext.prune_arms`); the prune stage then stays unfinished
    while other units are missing.
    """
    for option, value in (("--from", from_stage), ("--until", until_stage)):
        if value is not None and value not in STAGES:
            raise UsageError(f"{option} {value}: unknown stage; stages are {', '.join(STAGES)}")
    first = STAGES.index(from_stage) if from_stage else len(STAGES)
    last = STAGES.index(until_stage) if until_stage else len(STAGES) - 1
    if from_stage and first > last:
        raise UsageError(f"--from {from_stage} comes after --until {until_stage}")
    from geospec.engine.distributed import context, process_group, wait_for_main

    with process_group():
        same_spec_on_every_rank(spec, run_dir)
        run = RunContext(
            Path(run_dir or spec.run_dir),
            spec_path.parent,
            console or Console(),
            context(),
            spec.train.device,
            spec_path=spec_path.resolve(),
            overrides=tuple(overrides),
            arms=None if arms is None else tuple(arms),
            seeds=None if seeds is None else tuple(seeds),
            prune_arms=None if prune_arms is None else tuple(prune_arms),
            prune_keep=None if prune_keep is None else tuple(prune_keep),
        )
        if run.is_main:
            prepare_run_dir(run.run_dir)
            spec = pin_measures(spec, run.run_dir, run.say)
            write_run_metadata(run.run_dir, spec, spec_path)
        wait_for_main(run.dist)
        if not run.is_main:  # rank 0 has recorded measure = "all"
            spec = pin_measures(spec, run.run_dir, lambda _: None)
        log = StageLog(run.run_dir / STAGES_FILE)
        done: dict[str, Done] = {}
        partial = False  # a stage did part of its work: the later ones ran on part of it too
        try:
            for index, stage_type in enumerate(STAGE_TYPES[: last + 1]):
                stage = stage_type.from_spec(spec)
                if stage.name == "train":  # no later stage reads the reference model: free it
                    release_reference()
                upstream = Upstream(stage.name, stage.reads, done)
                plan = stage.plan(run, upstream, forced=index >= first)
                works_here = run.is_main or not plan.main_only
                if plan.key is None:  # the stage does not apply to this spec
                    if plan.note is not None:
                        run.say(plan.note)
                    done[stage.name] = Done(None, plan.load())
                    continue
                current = plan.current
                if current is None:
                    current = (
                        index < first
                        and log.keys().get(stage.name) == plan.key
                        and all(path.exists() for path in plan.artifacts)
                    )
                    if current and plan.problem is not None:
                        run.say(f"[yellow]![/] {stage.name}: {plan.problem}; running it again")
                        current = False
                if current:
                    run.say(
                        plan.note
                        if plan.note is not None
                        else f"[dim]✓ {stage.name}: up to date (skipped)[/]"
                    )
                output = (plan.load if current else plan.run)() if works_here else None
                wait_for_main(run.dist)  # rank 0 may work alone for hours (demand, prune)
                if not works_here:
                    output = plan.load()  # rank 0 has written the stage's artifacts
                partial = partial or output is INCOMPLETE
                if run.is_main and not partial:  # recorded: skipped next time
                    log.record(stage.name, plan.key)
                elif run.is_main:  # an older record would skip it next time
                    log.forget(stage.name)
                done[stage.name] = Done(plan.key, output, ran=not current)
        finally:  # a later pipeline in this process (a test, a notebook) loads afresh
            release_reference()
        ran = [name for name, stage_done in done.items() if stage_done.ran]
        if not ran:
            run.say("[green]nothing to do:[/] every stage is up to date")
        return ran


def same_spec_on_every_rank(spec: Spec, run_dir: Path | None) -> None:
    """Under torchrun, every process must run the same spec into the same directory (one started
    with another file or other --set values would train another experiment into this one's
    collectives): one line on every rank if they differ."""
    import hashlib

    from geospec.engine.distributed import context, gather_objects

    ctx = context()
    if not ctx.enabled:
        return
    mine = hashlib.sha256((spec.model_dump_json() + str(run_dir)).encode()).hexdigest()
    digests = gather_objects(mine, ctx)
    differing = [rank for rank, digest in enumerate(digests) if digest != digests[0]]
    if differing:
        raise UsageError(
            f"spec: the torchrun processes loaded different specs (rank {differing[0]}'s is "
            "not rank 0's); start every process with the same spec file, --set values and --out"
        )
