"""The run directory as the pipeline keeps it: who owns a training directory, failure records,
the launcher's submissions, the run's metadata and ``measure = "all"`` pinned when a run begins.
The records the report reads too (the stage keys, the optional stages' records, a training
directory's key) are :mod:`geospec.rundir.records`'s, below both.

Layout (docs/pipeline.md): ``spec.resolved.toml``, ``plugins.json``, ``env.json``, ``run.json``,
``stages.json``, ``reference/``, ``clouds/``, ``profiles.json``, ``diagnostics.json``,
``widths.json``, ``arms/<arm>/seed-<k>/`` (one training directory each), ``results.json``,
``report.md``, ``plots/``. A training directory holds ``run_key.json`` (the key of the run it
belongs to) besides the files of :mod:`geospec.engine.checkpoint`, ``failure.json`` while
its last attempt failed (:func:`record_failure`), and ``eval.json`` once the eval stage has
scored its model. ``launch/submitted.json`` lists the runs the last train stage left queued on a
scheduler (:func:`record_submissions`).
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from geospec.engine.run_files import MODEL_FILE, RESULT_FILE, TRAINER_FILES
from geospec.errors import GeospecError, UsageError, last_line
from geospec.moved import moved_names
from geospec.rundir.artifacts import json_problem, read_json, read_json_or_none
from geospec.rundir.layout import (
    EVAL_FILE,
    FAILURE_FILE,
    MEASURES_FILE,
    RUN_FILE,
    RUN_KEY_FILE,
    SUBMITTED_FILE,
)
from geospec.rundir.records import stored_run_key
from geospec.storage.atomic import atomic_write_json, atomic_write_text
from geospec.storage.digests import file_digest, sealed
from geospec.version import __version__

if TYPE_CHECKING:
    from geospec.pipeline.context import RunContext
    from geospec.spec.sections import Spec

# ---------------------------------------------------------------------------------------------
# training directories


#: What geospec writes into a training directory (removed when geospec redoes a run in a
#: directory it did not mark as its own): the trainer's files and the run's evaluation.
TRAINING_FILES = (*TRAINER_FILES, RUN_KEY_FILE, FAILURE_FILE, EVAL_FILE)


def record_failure(out: Path, error: BaseException) -> None:
    """Record in ``out`` that its run raised ``error`` (the last line of the error, where and
    when), sealed like geospec's other records; the next attempt removes it. Never raises: a
    record that cannot be written (a full disk) is one warning, and ``error`` goes on."""
    import socket
    import time

    record = {
        "error": last_line(error),
        "type": type(error).__name__,
        "exit_code": getattr(error, "exit_code", 1),  # 2: a full disk, a bad input
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "time": time.time(),
    }
    try:
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_json(out / FAILURE_FILE, sealed(record))
    except Exception as problem:  # a full disk, say: the run's own error is what goes on
        sys.stderr.write(f"! could not record the failure in {out}: {last_line(problem)}\n")


def read_failure(out: Path) -> dict[str, Any] | None:
    """The failure recorded in ``out``: None when there is none; a damaged or edited record
    reads as ``{"error": "<why it cannot be read>", "damaged": True}``."""
    path = out / FAILURE_FILE
    if not path.exists():
        return None
    problem = json_problem(path, "error", "time")
    if problem is not None:
        return {"error": f"the failure record is damaged ({problem})", "damaged": True}
    record: dict[str, Any] = json.loads(path.read_text())
    return record


def record_submissions(run_dir: Path, submitted: dict[str, str]) -> None:
    """Record which runs (``"<arm>/seed-<k>"``) the train stage just left to a scheduler, each
    with the launcher's word on where (``"job 1234_5"``), for ``geospec status``. Every train
    stage rewrites the record, so a run trained, failed or no longer submitted since is not
    listed; a run directory that never submitted anything gets no file."""
    import time

    path = run_dir / SUBMITTED_FILE
    if submitted or path.exists():
        atomic_write_json(path, sealed({"time": time.time(), "runs": submitted}))


def read_submissions(run_dir: Path) -> dict[str, Any]:
    """The record of :func:`record_submissions`: ``{"time": t, "runs": {run: where}}``, empty
    runs when there is none, and ``{"damaged": "<why>", "runs": {}}`` when it cannot be read."""
    path = run_dir / SUBMITTED_FILE
    if not path.exists():
        return {"time": None, "runs": {}}
    problem = json_problem(path, "time", "runs")
    record = None if problem else json.loads(path.read_text())
    if record is None or not isinstance(record["runs"], dict):
        return {"damaged": problem or "its runs are not a table", "runs": {}}
    return {"time": record["time"], "runs": {str(k): str(v) for k, v in record["runs"].items()}}


def prepare_run_dir(path: Path) -> Path:
    """Check that ``path`` can be (or already is) a run directory, create it, return it resolved.

    geospec writes and deletes inside a run directory, so it refuses ``/``, the home directory,
    a file, and an existing folder that holds files but no ``run.json`` (the user's files).
    """
    resolved = path.expanduser().resolve()
    shown = f"{path} (that is {resolved})" if ".." in path.parts else str(path)
    if resolved == Path(resolved.anchor) or resolved == Path.home().resolve():
        raise UsageError(
            f"out: {shown} is the root or home directory; give the run a folder of its own"
        )
    if resolved.exists() and not resolved.is_dir():
        raise UsageError(f"out: {shown} is a file; give a folder for the run directory")
    if resolved.is_dir() and any(resolved.iterdir()) and not (resolved / RUN_FILE).exists():
        raise UsageError(
            f"out: {shown} already holds files that geospec did not make (no {RUN_FILE}); "
            "choose a new or empty folder"
        )
    try:
        resolved.mkdir(parents=True, exist_ok=True)
        probe = resolved / ".geospec-write-test"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as error:
        reason = error.strerror or type(error).__name__
        raise UsageError(
            f"out: {shown} cannot be written ({reason}); choose another folder"
        ) from None
    return resolved


def is_trained(out: Path, key: str) -> bool:
    """``out`` holds the finished run ``key`` (with a readable result)."""
    return stored_run_key(out) == key and json_problem(out / RESULT_FILE, "final_val_loss") is None


def finished_model_problem(out: Path) -> str | None:
    """What keeps a finished run's model from being trusted: an unreadable result, a missing
    weights file, or weights that changed after training (against the hash in result.json)."""
    problem = json_problem(out / RESULT_FILE, "final_val_loss")
    if problem is not None:
        return problem
    if not (out / MODEL_FILE).is_file():
        return f"{MODEL_FILE} is missing"
    checksums = json.loads((out / RESULT_FILE).read_text()).get("checksums") or {}
    recorded = checksums.get(MODEL_FILE) if isinstance(checksums, dict) else None
    if recorded is not None and file_digest(out / MODEL_FILE) != recorded:
        return f"{MODEL_FILE} changed after training (it does not match {RESULT_FILE})"
    return None


def own_training_dir(
    run: RunContext,
    out: Path,
    key: str,
    widths: list[int],
    redo: bool = False,
    replace: bool = True,
) -> None:
    """Make ``out`` the training directory of the run ``key`` (the caller holds its claim).

    A directory holding a run of another key (older inputs), or one to redo, is emptied first:
    it would otherwise be resumed wrongly; with ``replace`` False a run of another key is refused
    instead (a directory the user named). A directory of the same key is kept, so an interrupted
    run resumes from its last checkpoint.
    """
    from geospec.engine.distributed import barrier

    if run.is_main:
        stored = stored_run_key(out)
        other = stored is not None and stored != key
        if other and not replace and not redo:
            raise UsageError(
                f"{out} holds a run with different settings; delete it or train into another "
                "directory"
            )
        if out.exists() and (redo or other):
            why = "inputs changed, starting over" if other else "starting over"
            run.say(f"[yellow]![/] {_shown(out, run.run_dir)}: {why}")
            empty_training_dir(out)
        atomic_write_json(out / RUN_KEY_FILE, {"key": key, "widths": widths})
    barrier(run.dist)


def empty_training_dir(out: Path) -> None:
    """Remove a training run: the files the trainer writes and its own temporary files; anything
    else in the directory is the user's and stays."""
    for name in TRAINING_FILES:
        (out / name).unlink(missing_ok=True)
    for name in TRAINING_FILES:
        for partial in out.glob(f".{name}.*.tmp"):  # left by a crash in an atomic write
            partial.unlink(missing_ok=True)


def _shown(path: Path, run_dir: Path) -> Path:
    return path.relative_to(run_dir) if path.is_relative_to(run_dir) else path


# ---------------------------------------------------------------------------------------------
# what is recorded with every run


def write_run_metadata(run_dir: Path, spec: Spec, spec_path: Path) -> None:
    """The resolved spec, plugin versions, environment and what the report needs (run.json)."""
    import tomlkit

    from geospec.pipeline.keys import section
    from geospec.registry.loading import get_registries
    from geospec.spec.resolve import all_limited_to, resolved_spec

    resolved = resolved_spec(spec)
    limit = all_limited_to(spec)
    atomic_write_text(run_dir / "spec.resolved.toml", tomlkit.dumps(_without_none(resolved)))
    atomic_write_json(run_dir / "plugins.json", get_registries().describe())
    atomic_write_json(run_dir / "env.json", environment())
    atomic_write_json(
        run_dir / RUN_FILE,
        {
            "name": spec.name,
            "spec": str(spec_path),
            "baseline": spec.report.baseline,
            "confidence": spec.report.confidence,
            "bootstrap": spec.report.bootstrap,
            "min_reliability": spec.report.min_reliability,
            "compare": [list(pair) for pair in spec.report.compare],
            "arms": [{"name": a.name, "schedule": section(a.schedule)} for a in spec.arms],
            "seeds": list(spec.train.seeds),
            # the report reads the arms' eval.json files only when the spec evaluates them
            **({"eval": {"tasks": list(spec.eval.tasks)}} if spec.eval is not None else {}),
            # status and the report list no runs of a spec that trains none
            **({"probe_only": True} if spec.probe_only else {}),
            # what status compares a pinned measure = "all" with (a spec that only prunes)
            **({MEASURE_LIMIT: sorted(limit)} if limit is not None else {}),
            "geospec": __version__,
        },
    )


#: The mark of a measures.json written since ``measure = "all"`` depends on the spec
#: (:func:`geospec.spec.resolve.all_limited_to`): its ``measure`` holds every pair registered
#: when the run began, and the measures in effect are those of them the spec needs now (so a
#: [prune] arm added later finds the pair it reads). A record without it (an earlier geospec's)
#: holds the measures in effect, every one measured, so that the run keeps its stage keys.
LIMITED = "limited"
#: run.json's list of the profiles ``measure = "all"`` is limited to (a spec that only prunes:
#: those its [prune] arms read), for ``geospec status``; absent for every other spec.
MEASURE_LIMIT = "measure_limit"


def pin_measures(spec: Spec, run_dir: Path, say: Callable[[str], None]) -> Spec:
    """``spec`` with ``measure = "all"`` as this run first resolved it (``measures.json``): a
    plugin installed or removed later changes no stage key of the run; what it would change is
    said, here and by ``geospec status``. The first run records the pairs registered then (and
    :data:`LIMITED`); the measures in effect are those of them the spec needs. A spec that lists
    its measures keeps no record. A damaged record is said and made again."""
    from pydantic import ValidationError

    from geospec.spec.resolve import all_limited_to, registered_measures
    from geospec.spec.sections import MeasureSpec

    path = run_dir / MEASURES_FILE
    if spec.measure is not None:
        path.unlink(missing_ok=True)
        return spec
    problem = json_problem(path, "measure") if path.exists() else None
    if path.exists() and problem is None:
        record = read_json(path)
    else:
        if problem is not None:
            say(f'[yellow]![/] {problem}; measure = "all" is resolved again from the plugins now')
        record = {"measure": [entry.key_form() for entry in registered_measures()], LIMITED: True}
        atomic_write_json(path, sealed(record))
    recorded = record["measure"]
    limit = all_limited_to(spec) if record.get(LIMITED) is True else None
    # a pair the spec does not need is not read: a plugin since removed that measured it is
    # no loss to this run
    chosen = [table for table in recorded if limit is None or pinned_profile(table) in limit]
    try:
        pinned = [MeasureSpec.model_validate(table) for table in chosen]
    except (ValidationError, GeospecError) as error:
        raise UsageError(
            f'{path}: this run resolved measure = "all" when it began, but a plugin it measures '
            f"is gone ({last_line(str(error))}); install it again, or list the measures in the "
            "spec's [[measure]] tables"
        ) from None
    names = [name for name in map(pinned_profile, recorded) if name is not None]
    note = measure_all_note(names, run_dir, limit)
    if note is not None:
        from rich.markup import escape

        say(f"[yellow]![/] {escape(note)}")
    return spec.model_copy(update={"measure": pinned})


def pinned_profile(table: Any) -> str | None:
    """The profile a measures.json table measures (None for what geospec never writes)."""
    if not isinstance(table, dict):
        return None
    if isinstance(table.get("name"), str):
        return str(table["name"])
    kinds = [
        part.get("kind") if isinstance(part, dict) else part
        for part in (table.get("statistic"), table.get("geometry"))
    ]
    named = [kind for kind in kinds if isinstance(kind, str)]
    return "/".join(named) if len(named) == 2 else None


def measure_all_note(
    recorded: list[str], run_dir: Path, limit: set[str] | None = None
) -> str | None:
    """What the plugins registered now would measure that this run's recorded ``measure =
    "all"`` does not (or the other way), or None when they agree. With ``limit`` (a
    :data:`LIMITED` record of a spec that only prunes: the profiles its [prune] arms read), only
    those profiles count: a plugin whose pairs no arm reads changes nothing the run measures."""
    from geospec.registry.loading import get_registries

    now = [f"{statistic}/{geometry}" for statistic, geometry in get_registries().all_measures()]
    if limit is not None:
        now = [name for name in now if name in limit]
        recorded = [name for name in recorded if name in limit]
    added = [name for name in now if name not in recorded]
    gone = [name for name in recorded if name not in now]
    if not added and not gone:
        return None
    changes = ([f"adds {', '.join(added)}"] if added else []) + (
        [f"no longer has {', '.join(gone)}"] if gone else []
    )
    every = "every pair registered now" + ("" if limit is None else " that its [prune] arms read")
    return (
        f'measure = "all" was resolved when this run began ({MEASURES_FILE}); the plugins '
        f"installed now {' and '.join(changes)}: this run keeps its profiles. Delete "
        f"{run_dir / MEASURES_FILE} to measure {every}"
    )


def pinned_measures(run_dir: Path) -> tuple[list[str], set[str] | None] | None:
    """What ``geospec status`` compares with the plugins registered now: the profiles of the
    run's measures.json and the limit its spec puts on them (run.json's ``measure_limit``, for
    a :data:`LIMITED` record); None when the spec lists its measures (or the record cannot be
    read: the next run says)."""
    if json_problem(run_dir / MEASURES_FILE, "measure") is not None:
        return None
    record = read_json(run_dir / MEASURES_FILE)
    names = [name for name in map(pinned_profile, record["measure"]) if name is not None]
    run = read_json_or_none(run_dir / RUN_FILE)
    limit = run.get(MEASURE_LIMIT) if isinstance(run, dict) else None
    if record.get(LIMITED) is not True or not isinstance(limit, list):
        return names, None
    return names, {name for name in limit if isinstance(name, str)}


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


# the optional stages' readers lived here until they moved below the report (docs/diagnostics.md
# showed ``read_diagnostics`` imported from this module)
__getattr__ = moved_names(
    __name__,
    {
        name: "geospec.rundir.records"
        for name in ("read_diagnostics", "read_demand", "read_prune", "trains_nothing")
    },
)  # fmt: skip
