"""Train one model into one training directory: the reference, each arm x seed of the train
stage, and ``geospec train`` all go through :func:`train_into`.

The directory is claimed (one process trains it; under torchrun every rank learns the answer),
owned by the run's key (a directory of other inputs is emptied, one of the same key resumes) and
trained or resumed by :func:`geospec.engine.train.train_model`.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from geospec.atomic import atomic_path
from geospec.engine.run_files import RESULT_FILE
from geospec.errors import Preempted
from geospec.layout import FAILURE_FILE, RUN_KEY_FILE
from geospec.pipeline.run_dir import is_trained, own_training_dir, record_failure

if TYPE_CHECKING:
    import torch

    from geospec.engine.model import GPTConfig
    from geospec.engine.token_data import TokenData
    from geospec.engine.train import TrainResult
    from geospec.pipeline.context import RunContext
    from geospec.pipeline.tracking import RunTrackers, TrackAs
    from geospec.spec.sections import ModelSpec, TrainSpec


def train_into(
    run: RunContext,
    out: Path,
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
) -> TrainResult | None:
    """Train the run ``key`` (``widths``, ``seed``) into ``out`` and return its result.

    Returns None when another process holds the directory. A finished run of the same key is
    returned as it is unless ``redo``; a run of another key is replaced (or, without ``replace``,
    refused). ``reuse``: a finished training directory to copy instead of
    training when the trainer's fingerprint of both runs is identical (the reference is often
    exactly the uniform arm's run for its seed). ``announce`` is said when training starts.
    ``track``: how the spec's experiment trackers (``train.trackers``) name the run; none watch
    it without. ``model``: the spec's model section (built with ``widths``), or the config of
    a model given whole, ``initial`` its starting weights (a pruned checkpoint to heal).
    ``progress``: show training progress (on rank 0; off inside another stage's progress bar).

    A run that raises records the error in ``out`` (``failure.json``, read by ``geospec status``)
    before the error goes on; the next attempt removes the record. A preempted run (SIGTERM,
    SIGUSR1) and an interrupted one are not failures.
    """
    from geospec.engine.distributed import claim_on_main
    from geospec.engine.model import GPTConfig, config_from_spec
    from geospec.engine.train import TrainResult, train_model

    with claim_on_main(out, run.dist) as claimed:
        if not claimed:
            return None
        if is_trained(out, key) and not redo:
            return TrainResult.from_dict(json.loads((out / RESULT_FILE).read_text()))
        own_training_dir(run, out, key, widths, redo=redo, replace=replace)
        if run.is_main:
            (out / FAILURE_FILE).unlink(missing_ok=True)
        if announce:
            run.say(announce)
        try:
            config = (
                model
                if isinstance(model, GPTConfig)
                else config_from_spec(model, widths, data.vocab_size)
            )
            if reuse is not None and run.is_main:
                _reuse(run, reuse, out, train, config, data, seed)
            return train_model(
                train, config, data, out, seed=seed, steps=steps, progress=progress and run.is_main,
                observer=_trackers(run, out, key, widths, train, seed, track), initial=initial,
            )  # fmt: skip
        except Preempted:
            raise
        except Exception as error:
            if run.is_main:
                record_failure(out, error)
            raise


def _trackers(
    run: RunContext,
    out: Path,
    key: str,
    widths: list[int],
    train: TrainSpec,
    seed: int,
    track: TrackAs | None,
) -> RunTrackers | None:
    if track is None or not run.is_main:
        return None
    from geospec.pipeline.tracking import run_trackers

    return run_trackers(
        train.trackers, track, key=key, directory=out, run_dir=run.run_dir, seed=seed,
        widths=widths, say=run.say,
    )  # fmt: skip


def _reuse(
    run: RunContext,
    source: Path,
    out: Path,
    train: TrainSpec,
    config: GPTConfig,
    data: TokenData,
    seed: int,
) -> None:
    """Copy the finished run in ``source`` into ``out`` when it is the same experiment.

    The copy is made only when the trainer's own fingerprint (model config, data, seed, steps,
    batch and optimizer settings) is identical, so the result is the same as retraining.
    """
    from geospec.engine.train import fingerprint, total_steps

    result = source / RESULT_FILE
    if not result.exists() or (out / RESULT_FILE).exists():
        return
    wanted = fingerprint(train, config, data, seed, total_steps(train, config.seq_len))
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
