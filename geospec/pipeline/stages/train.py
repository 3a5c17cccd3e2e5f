"""The train stage: one model per arm and seed, each in its own training directory.

A run is trained when its directory does not hold the finished run of its key
(:func:`geospec.pipeline.keys.arm_run_key`); an interrupted run resumes. Runs go seed-major, so a
study stopped part-way holds every arm for the seeds it finished and its report already compares
arms on paired seeds. Several ``geospec run`` processes may share a run directory: each run is
claimed by one of them. Under torchrun every run is trained with DDP across all processes.

The runs to train go to the spec's launcher (``[launch]``, ``local`` by default: one after another
in this process), with a :class:`geospec.pipeline.launching.Trainer` that trains one of them
wherever the launcher calls it. Runs held by another process or submitted to a scheduler leave the
stage unfinished (the next ``geospec run`` completes it); failed runs are reported together, each
with its error, after the launcher has tried every run.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from geospec.errors import GeospecError, Preempted, UsageError
from geospec.kinds import Launch, Launcher, TrainingRun
from geospec.pipeline.context import INCOMPLETE, Plan, RunContext, Upstream
from geospec.pipeline.keys import arm_run_key, digest
from geospec.pipeline.launching import Trainer
from geospec.pipeline.run_dir import is_trained, record_submissions
from geospec.plugin_base import PluginParams
from geospec.rundir.layout import REFERENCE_DIR, arm_seed_dir
from geospec.rundir.records import PROBE_ONLY_TRAIN_KEY
from geospec.spec.sections import DataSpec, ModelSpec, Spec, TrainSpec


@dataclass(frozen=True)
class Train:
    name: ClassVar[str] = "train"
    reads: ClassVar[tuple[str, ...]] = ("solve",)
    model: ModelSpec
    data: DataSpec
    train: TrainSpec
    arms: tuple[str, ...]
    probe_only: bool
    launch: PluginParams | None = None
    """The spec's [launch] table (None: local)."""
    study: str = ""
    """The spec's name (experiment trackers group the runs by it)."""

    @classmethod
    def from_spec(cls, spec: Spec) -> Train:
        arms = tuple(a.name for a in spec.arms)
        return cls(spec.model, spec.data, spec.train, arms, spec.probe_only, spec.launch, spec.name)

    def plan(self, run: RunContext, upstream: Upstream, forced: bool) -> Plan:
        if self.probe_only:
            note = "[dim]- train: probe-only spec, no arm is trained[/]"
            return Plan(PROBE_ONLY_TRAIN_KEY, current=True, note=note, main_only=False)
        widths: dict[str, list[int]] = upstream.output("solve")
        runs = [
            (arm, seed, arm_seed_dir(run.run_dir, arm, seed), self.run_key(widths[arm], seed))
            for seed in self.train.seeds
            for arm in self.arms
        ]
        self.check_selection(run)
        chosen = [r for r in runs if self.selected(run, r[0], r[1])]
        todo = [r for r in chosen if forced or not is_trained(r[2], r[3])]
        left_out = [r for r in runs if r not in chosen and not is_trained(r[2], r[3])]
        return Plan(
            digest(
                "train", [self.run_key(widths[a], s) for a in self.arms for s in self.train.seeds]
            ),
            run=lambda: self.train_selected(run, todo, left_out, widths, redo=forced),
            current=not todo and not left_out,
            note="[dim]✓ train: every arm and seed is trained (skipped)[/]",
            main_only=False,
        )

    @staticmethod
    def selected(run: RunContext, arm: str, seed: int) -> bool:
        """Whether ``--arms`` and ``--seeds`` (none: every run) choose this run."""
        return (run.arms is None or arm in run.arms) and (run.seeds is None or seed in run.seeds)

    def check_selection(self, run: RunContext) -> None:
        unknown_arms = [a for a in run.arms or () if a not in self.arms]
        unknown_seeds = [s for s in run.seeds or () if s not in self.train.seeds]
        if unknown_arms:
            raise UsageError(
                f"--arms: {', '.join(map(repr, unknown_arms))} not in the spec's arms "
                f"({', '.join(self.arms)})"
            )
        if unknown_seeds:
            raise UsageError(
                f"--seeds: {unknown_seeds} not in train.seeds {list(self.train.seeds)}"
            )

    def train_selected(
        self,
        run: RunContext,
        todo: list[tuple[str, int, Path, str]],
        left_out: list[tuple[str, int, Path, str]],
        widths: dict[str, list[int]],
        redo: bool,
    ) -> Any:
        """Train ``todo``; with runs left out by --arms/--seeds untrained, the stage stays
        unfinished (a later ``geospec run`` trains them) and the report leaves them out."""
        outcome = self.train_runs(run, todo, widths, redo) if todo else None
        if left_out:
            names = ", ".join(f"{arm}/seed-{seed}" for arm, seed, _, _ in left_out)
            run.say(
                f"[yellow]![/] train: {len(left_out)} run(s) not chosen by --arms/--seeds are "
                f"untrained ({names}); the report below leaves them out"
            )
            return INCOMPLETE
        return outcome

    def run_key(self, widths: list[int], seed: int) -> str:
        return arm_run_key(self.model, self.data, self.train, widths, seed)

    def launcher(self) -> Launcher:
        from geospec.registry.loading import get_registries

        launcher: Launcher = get_registries().create("launcher", self.launch or "local")
        return launcher

    def train_runs(
        self,
        run: RunContext,
        todo: list[tuple[str, int, Path, str]],
        widths: dict[str, list[int]],
        redo: bool,
    ) -> Any:
        launcher = self.launcher()
        if run.dist.enabled and not launcher.under_torchrun:
            raise UsageError(
                f"launch: the {launcher.kind_name()!r} launcher cannot run under torchrun; "
                "start `geospec run` without torchrun, or remove [launch]"
            )
        runs = tuple(TrainingRun(arm, seed, out, key) for arm, seed, out, key in todo)
        trainer = Trainer(
            run.run_dir, run.spec_dir, run.device, self.model, self.data, self.train, widths,
            runs, redo=redo, reuse=run.run_dir / REFERENCE_DIR, study=self.study, context=run,
            tokens=run.token_data(self.data),
        )  # fmt: skip
        launch = Launch(
            runs, trainer, run.run_dir, run.say, run.spec_path, trainer.recorded, run.overrides
        )
        outcomes = launcher.launch(launch)
        if run.is_main:
            record_submissions(
                run.run_dir,
                {o.run.name: o.detail for o in outcomes if o.state == "submitted"},
            )
        by_state: dict[str, list[str]] = {}
        for outcome in outcomes:
            by_state.setdefault(outcome.state, []).append(
                f"{outcome.run.name}: {outcome.detail}" if outcome.detail else outcome.run.name
            )
        for outcome in outcomes:
            if outcome.state == "held":
                where = f"arm {outcome.run.arm}, seed {outcome.run.seed}"
                run.say(f"train: {where}: [yellow]another process is training it (skipped)[/]")
        if by_state.get("preempted"):
            raise Preempted(
                f"train: {'; '.join(by_state['preempted'])}: stopped by a signal after a "
                "checkpoint; run again to resume"
            )
        if by_state.get("failed"):
            error = GeospecError(
                f"train: {len(by_state['failed'])} run(s) failed: "
                + "; ".join(by_state["failed"])
                + f". Each error is recorded in its training directory (geospec status "
                f"{run.run_dir}); fix the cause and run again"
            )
            failed = [o for o in outcomes if o.state == "failed"]
            if all(o.exit_code == 2 for o in failed):  # a full disk, a bad input: not a crash
                error.exit_code = 2
            raise error
        unfinished = len(outcomes) < len(runs) or any(state != "done" for state in by_state)
        if by_state.get("submitted"):
            run.say(
                f"[yellow]![/] train: {len(by_state['submitted'])} run(s) were handed to a "
                "scheduler; the report below leaves them out and is built again when they have "
                "finished"
            )
        if by_state.get("held"):
            run.say(
                f"[yellow]![/] train: {len(by_state['held'])} run(s) were being trained by another "
                "process; the report below leaves them out until a later run finds them finished"
            )
        return INCOMPLETE if unfinished else None
