"""Train one model into one training directory: the reference, each arm x seed of the train
stage, healing a pruned model, and ``geospec train`` all go through :func:`train_into`.

What is trained is one :class:`TrainingJob` (directory, run key, widths, model, settings, data,
seed, starting weights); how :func:`train_into` goes about it (retrain a finished run, replace a
directory of another key, say a line, show progress) are its keywords. The directory is claimed
(one process trains it; under torchrun every rank learns the answer), owned by the run's key (a
directory of other inputs is emptied, one of the same key resumes) and trained or resumed by
:func:`geospec.engine.train.train_model`.
"""

from __future__ import annotations

import json
import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, overload

from geospec.engine.run_files import RESULT_FILE
from geospec.errors import Preempted
from geospec.pipeline.run_dir import is_trained, own_training_dir, record_failure
from geospec.rundir.layout import FAILURE_FILE, RUN_KEY_FILE
from geospec.storage.atomic import atomic_path

if TYPE_CHECKING:
    import torch

    from geospec.engine.distill import Teacher
    from geospec.engine.model import GPTConfig
    from geospec.engine.token_data import TokenData
    from geospec.engine.train import TrainResult
    from geospec.pipeline.context import RunContext
    from geospec.pipeline.tracking import RunTrackers, TrackAs
    from geospec.spec.sections import ModelSpec, TrainSpec

__all__ = ["TrainingJob", "train_into"]


@dataclass(frozen=True)
class TrainingJob:
    """One model to train: the run ``key`` (``widths``, ``seed``) into the directory ``out``."""

    out: Path
    key: str
    widths: list[int]
    model: ModelSpec | GPTConfig
    """The spec's model section (built with ``widths``), or the config of a model given whole."""
    train: TrainSpec
    """The run's own settings: a budget other than the spec's (the reference's ``train_steps``,
    ``geospec train --steps``) is in them (:meth:`TrainSpec.with_steps`), so the trainer's
    fingerprint and the reuse check see the steps the run takes."""
    data: TokenData
    seed: int
    initial: dict[str, torch.Tensor] | None = None
    """Starting weights instead of the seeded initialisation (a pruned checkpoint to heal)."""
    reuse: Path | None = None
    """A finished training directory to copy instead of training when the trainer's fingerprint
    of both runs is identical (the reference is often exactly the uniform arm's run)."""
    track: TrackAs | None = None
    """How the spec's experiment trackers (``train.trackers``) name the run; none watch it
    without."""
    teacher: Teacher | None = None
    """A model to distil from (:mod:`geospec.engine.distill`: a pruned model healed towards the
    unpruned one); None: the next-token loss alone."""

    def config(self) -> GPTConfig:
        """The model's config: the one given, or the spec's model built with ``widths``."""
        from geospec.engine.model import GPTConfig, config_from_spec

        if isinstance(self.model, GPTConfig):
            return self.model
        return config_from_spec(self.model, self.widths, self.data.vocab_size)


@overload
def train_into(
    run: RunContext,
    job: TrainingJob,
    *,
    redo: bool = False,
    replace: bool = True,
    announce: str | None = None,
    progress: bool = True,
) -> TrainResult | None: ...


@overload
def train_into(
    run: RunContext,
    job: Path,
    key: str,
    widths: list[int],
    *,
    model: ModelSpec | GPTConfig,
    train: TrainSpec,
    data: TokenData,
    seed: int,
    steps: int | None = None,
    redo: bool = False,
    replace: bool = True,
    announce: str | None = None,
    reuse: Path | None = None,
    track: TrackAs | None = None,
    initial: dict[str, torch.Tensor] | None = None,
    progress: bool = True,
) -> TrainResult | None: ...


def train_into(
    run: RunContext,
    job: TrainingJob | Path,
    key: str | None = None,
    widths: list[int] | None = None,
    *,
    redo: bool = False,
    replace: bool = True,
    announce: str | None = None,
    progress: bool = True,
    **old: Any,
) -> TrainResult | None:
    """Train ``job`` and return its result.

    Returns None when another process holds the directory. A finished run of the same key is
    returned as it is unless ``redo``; a run of another key is replaced (or, without ``replace``,
    refused). ``announce`` is said when training starts. ``progress``: show training progress
    (on rank 0; off inside another stage's progress bar).

    A run that raises records the error in the job's directory (``failure.json``, read by
    ``geospec status``) before the error goes on; the next attempt removes the record. A
    preempted run (SIGTERM, SIGUSR1) and an interrupted one are not failures.

    The form of earlier versions, ``train_into(run, out, key, widths, model=..., train=...,
    data=..., seed=..., steps=..., reuse=..., track=..., initial=...)``, still works with a
    DeprecationWarning.
    """
    if not isinstance(job, TrainingJob):
        warnings.warn(
            "train_into(run, out, key, widths, model=..., ...) is deprecated: pass a "
            "geospec.pipeline.training.TrainingJob (its train holds any steps override)",
            DeprecationWarning,
            stacklevel=2,
        )
        assert key is not None and widths is not None
        steps = old.pop("steps", None)
        train = old.pop("train")
        job = TrainingJob(Path(job), key, widths, train=train.with_steps(steps), **old)
    return _train(run, job, redo=redo, replace=replace, announce=announce, progress=progress)


def _train(
    run: RunContext, job: TrainingJob, *, redo: bool, replace: bool, announce: str | None,
    progress: bool,
) -> TrainResult | None:  # fmt: skip
    from geospec.engine.distributed import claim_on_main
    from geospec.engine.train import TrainResult, train_model

    out = job.out
    with claim_on_main(out, run.dist) as claimed:
        if not claimed:
            return None
        if is_trained(out, job.key) and not redo:
            return TrainResult.from_dict(json.loads((out / RESULT_FILE).read_text()))
        own_training_dir(run, out, job.key, job.widths, redo=redo, replace=replace)
        if run.is_main:
            (out / FAILURE_FILE).unlink(missing_ok=True)
        if announce:
            run.say(announce)
        try:
            config = job.config()
            if job.reuse is not None and run.is_main:
                _reuse(run, job, config)
            return train_model(
                job.train, config, job.data, out, seed=job.seed,
                progress=progress and run.is_main, observer=_trackers(run, job),
                initial=job.initial, teacher=job.teacher,
            )  # fmt: skip
        except Preempted:
            raise
        except Exception as error:
            if run.is_main:
                record_failure(out, error)
            raise


def _trackers(run: RunContext, job: TrainingJob) -> RunTrackers | None:
    if job.track is None or not run.is_main:
        return None
    from geospec.pipeline.tracking import run_trackers

    return run_trackers(
        job.train.trackers, job.track, key=job.key, directory=job.out, run_dir=run.run_dir,
        seed=job.seed, widths=job.widths, say=run.say,
    )  # fmt: skip


def _reuse(run: RunContext, job: TrainingJob, config: GPTConfig) -> None:
    """Copy the finished run in ``job.reuse`` into ``job.out`` when it is the same experiment.

    The copy is made only when the trainer's own fingerprint (model config, data, seed, steps,
    batch and optimizer settings) is identical, so the result is the same as retraining.
    """
    from geospec.engine.identity import fingerprint
    from geospec.engine.train import total_steps

    assert job.reuse is not None
    source, out = job.reuse, job.out
    result = source / RESULT_FILE
    if not result.exists() or (out / RESULT_FILE).exists():
        return
    steps = total_steps(job.train, config.seq_len)
    wanted = fingerprint(job.train, config, job.data, job.seed, steps, job.initial)
    if json.loads(result.read_text()).get("fingerprint") != wanted:
        return
    out.mkdir(parents=True, exist_ok=True)
    for path in sorted(source.iterdir()):
        if path.is_file() and path.name not in (RESULT_FILE, RUN_KEY_FILE):
            with atomic_path(out / path.name) as tmp:  # a full disk leaves no partial copy
                shutil.copy2(path, tmp)
    with atomic_path(out / RESULT_FILE) as tmp:  # last: marks the copy complete
        shutil.copy2(result, tmp)
    shown = source.relative_to(run.run_dir) if source.is_relative_to(run.run_dir) else source
    run.say(f"  identical to the reference run: reused {shown}")
