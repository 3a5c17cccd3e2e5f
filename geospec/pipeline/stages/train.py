"""The train stage: one model per arm and seed, each in its own training directory.

A run is trained when its directory does not hold the finished run of its key
(:func:`geospec.pipeline.keys.arm_run_key`); an interrupted run resumes. Runs go seed-major, so a
study stopped part-way holds every arm for the seeds it finished and its report already compares
arms on paired seeds. Several ``geospec run`` processes may share a run directory: each run is
claimed by one of them. Under torchrun every run is trained with DDP across all processes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from geospec.pipeline.context import INCOMPLETE, Done, Plan, RunContext
from geospec.pipeline.keys import arm_run_key, digest
from geospec.pipeline.run_dir import REFERENCE_DIR, arm_seed_dir, is_trained
from geospec.pipeline.training import train_into
from geospec.spec.sections import DataSpec, ModelSpec, Spec, TrainSpec


@dataclass(frozen=True)
class Train:
    name: ClassVar[str] = "train"
    model: ModelSpec
    data: DataSpec
    train: TrainSpec
    arms: tuple[str, ...]
    probe_only: bool

    @classmethod
    def from_spec(cls, spec: Spec) -> Train:
        arms = tuple(a.name for a in spec.arms)
        return cls(spec.model, spec.data, spec.train, arms, spec.probe_only)

    def plan(self, run: RunContext, done: Mapping[str, Done], forced: bool) -> Plan:
        if self.probe_only:
            note = "[dim]- train: probe-only spec, no arm is trained[/]"
            return Plan(digest("train", "probe-only"), current=True, note=note, main_only=False)
        widths: dict[str, list[int]] = done["solve"].output
        runs = [
            (arm, seed, arm_seed_dir(run.run_dir, arm, seed), self.run_key(widths[arm], seed))
            for seed in self.train.seeds
            for arm in self.arms
        ]
        todo = [r for r in runs if forced or not is_trained(r[2], r[3])]
        return Plan(
            digest(
                "train", [self.run_key(widths[a], s) for a in self.arms for s in self.train.seeds]
            ),
            run=lambda: self.train_runs(run, todo, widths, redo=forced),
            current=not todo,
            note="[dim]✓ train: every arm and seed is trained (skipped)[/]",
            main_only=False,
        )

    def run_key(self, widths: list[int], seed: int) -> str:
        return arm_run_key(self.model, self.data, self.train, widths, seed)

    def train_runs(
        self,
        run: RunContext,
        todo: list[tuple[str, int, Path, str]],
        widths: dict[str, list[int]],
        redo: bool,
    ) -> Any:
        data = run.token_data(self.data)
        held_elsewhere = 0
        for index, (arm, seed, out, key) in enumerate(todo, start=1):
            name = f"[bold]train[/] [{index}/{len(todo)}]: arm {arm}, seed {seed}"
            result = train_into(
                run,
                out,
                key,
                widths[arm],
                model=self.model,
                train=self.train,
                data=data,
                seed=seed,
                redo=redo,
                announce=name,
                reuse=run.run_dir / REFERENCE_DIR,
            )
            if result is None:  # another `geospec run` of this directory is training it
                run.say(f"{name}: [yellow]another process is training it (skipped)[/]")
                held_elsewhere += 1
        if held_elsewhere:
            run.say(
                f"[yellow]![/] train: {held_elsewhere} run(s) were being trained by another "
                "process; the report below leaves them out until a later run finds them finished"
            )
            return INCOMPLETE
        return None
