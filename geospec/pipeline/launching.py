"""The trainer a launcher calls for each arm-seed run (:class:`geospec.kinds.RunTrainer`).

The train stage builds one :class:`Trainer` for its runs and hands it to the spec's launcher
(``[launch]``, :class:`geospec.kinds.Launcher`). The trainer pickles: a launcher may call it in
this process (``local``), in worker processes (``pool``) or in scheduler jobs (``slurm``); in
another process it rebuilds what it needs (the run context, the cached tokens) on first use.
Wherever it runs, :func:`geospec.pipeline.training.train_into` claims the run's directory, so
each run is trained exactly once and gives the same result.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from geospec.engine.run_files import RESULT_FILE
from geospec.kinds import RunOutcome, TrainingRun

if TYPE_CHECKING:
    from geospec.engine.token_data import TokenData
    from geospec.pipeline.context import RunContext
    from geospec.spec.sections import DataSpec, ModelSpec, TrainSpec


@dataclass
class Trainer:
    """Trains one run of the train stage in the calling process (see the module docstring)."""

    run_dir: Path
    spec_dir: Path
    device: str
    model: ModelSpec
    data: DataSpec
    train: TrainSpec
    widths: dict[str, list[int]]
    runs: tuple[TrainingRun, ...]
    redo: bool = False
    reuse: Path | None = None
    study: str = ""
    """The spec's name: experiment trackers group the runs by it."""
    context: RunContext | None = field(default=None, repr=False)
    tokens: TokenData | None = field(default=None, repr=False)

    def __getstate__(self) -> dict[str, Any]:
        # the console, the process group and the token arrays stay in this process
        return {**self.__dict__, "context": None, "tokens": None}

    def __call__(self, run: TrainingRun, threads: int | None = None) -> RunOutcome:
        from geospec.engine.distributed import process_group
        from geospec.pipeline.tracking import TrackAs
        from geospec.pipeline.training import TrainingJob, train_into

        context = self._context()
        if threads is not None:
            import torch

            torch.set_num_threads(threads)
        if self.tokens is None:
            self.tokens = context.token_data(self.data)
        index = self.runs.index(run) + 1 if run in self.runs else 0
        announce = f"[bold]train[/] [{index}/{len(self.runs)}]: arm {run.arm}, seed {run.seed}"
        with process_group():  # a scheduler job of several tasks: one DDP group per run
            job = TrainingJob(
                run.directory, run.key, self.widths[run.arm], self.model, self.train,
                self.tokens, run.seed, reuse=self.reuse, track=TrackAs(self.study, run.arm),
            )  # fmt: skip
            result = train_into(context, job, redo=self.redo, announce=announce)
        if result is None:
            return RunOutcome(run, "held")
        return RunOutcome(run, "done", f"final loss {result.final_val_loss:.4f}")

    def recorded(self, run: TrainingRun) -> RunOutcome | None:
        """What ``run``'s training directory says without training it (see
        :class:`geospec.kinds.Launch`): done, failed with its recorded error, or None."""
        from geospec.pipeline.run_dir import is_trained, read_failure

        if is_trained(run.directory, run.key):
            result = json.loads((run.directory / RESULT_FILE).read_text())
            return RunOutcome(run, "done", f"final loss {result['final_val_loss']:.4f}")
        failure = read_failure(run.directory)
        if failure is not None:  # its error is one line (record_failure), as status shows it
            return RunOutcome(run, "failed", failure["error"], failure.get("exit_code", 1))
        return None

    def _context(self) -> RunContext:
        if self.context is None:
            from rich.console import Console

            from geospec.engine.distributed import context
            from geospec.pipeline.context import RunContext

            self.context = RunContext(  # what a run does goes to stderr, as the stages' lines
                self.run_dir, self.spec_dir, Console(stderr=True, soft_wrap=True), context(),
                self.device,
            )  # fmt: skip
        return self.context
