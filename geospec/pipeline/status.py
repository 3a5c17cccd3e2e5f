"""Where a run directory stands: every stage, and every arm x seed (``geospec status``).

Read from the run directory alone, without torch and without taking any lock: ``stages.json``
and the stages' artifacts; for each training directory its ``result.json`` (done), the holder
record of its claim (:func:`geospec.storage.locks.claim_holder`: running, or a stale claim whose
holder died), ``failure.json`` (failed, with the last error line) and ``metrics.jsonl`` (the step
a run has reached and its speed); ``launch/submitted.json`` for the runs the last train stage left
queued on a scheduler (submitted, with the job), and ``eval.json`` where the spec evaluates the
arms. A spec that trains nothing (probe-only, pruning) has no runs: ``trains`` is false and the
train stage is skipped. The JSON form (:func:`status`) is stable: scripts may rely on its keys.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from geospec.engine.run_files import METRICS_FILE, RESULT_FILE
from geospec.errors import UsageError
from geospec.pipeline.run_dir import (
    measure_all_note,
    pinned_measures,
    read_failure,
    read_submissions,
)
from geospec.rundir.artifacts import json_problem
from geospec.rundir.layout import (
    EVAL_FILE,
    REPORT_FILE,
    RUN_FILE,
    RUN_KEY_FILE,
    STAGES_FILE,
    arm_seed_dir,
)
from geospec.rundir.records import StageLog, trains_nothing
from geospec.storage.locks import claim_holder, holder_alive

#: The pipeline's stages in order (as geospec.pipeline.executor.STAGES, without importing it).
STAGE_NAMES = (
    "reference",
    "probe",
    "measure",
    "diagnose",
    "demand",
    "solve",
    "prune",
    "train",
    "eval",
    "report",
)

#: Every state a run can be in.
RUN_STATES = ("done", "running", "stale", "failed", "submitted", "pending")


def status(run_dir: Path) -> dict[str, Any]:
    """The state of every stage and run of ``run_dir`` (see the module docstring)."""
    record = _run_record(run_dir)
    trains = not trains_nothing(run_dir, record["record"])
    keys = StageLog(run_dir / STAGES_FILE).keys()
    stages = []
    for index, name in enumerate(STAGE_NAMES):
        state = "done" if name in keys else "pending"
        if name == "train" and not trains:
            state = "skipped"  # it ran, and had nothing to do: no arm is trained
        if name == "report" and state == "done" and not (run_dir / REPORT_FILE).exists():
            state = "pending"
        if state == "pending" and any(later in keys for later in STAGE_NAMES[index + 1 :]):
            state = "skipped"  # the spec does not use it (diagnose off, probe-only, ...)
        stages.append({"name": name, "state": state})
    submissions = read_submissions(run_dir)
    runs = []
    for seed in record["seeds"] if trains else ():
        for arm in record["arms"]:
            entry = run_status(arm_seed_dir(run_dir, arm, seed), arm, seed, record["eval"])
            where = submissions["runs"].get(f"{arm}/seed-{seed}")
            if entry["state"] == "pending" and where is not None:  # queued, not started
                entry.update(state="submitted", job=where, since=submissions["time"])
            runs.append(entry)
    counts = {state: sum(r["state"] == state for r in runs) for state in RUN_STATES}
    notes = []
    pinned = pinned_measures(run_dir)
    note = measure_all_note(pinned[0], run_dir, pinned[1]) if pinned is not None else None
    if note is not None:
        notes.append(note)
    if "damaged" in submissions:
        notes.append(
            f"launch/submitted.json cannot be read ({submissions['damaged']}): runs queued on "
            "a scheduler show as pending; the next `geospec run` rewrites it"
        )
    return {
        "run_dir": str(run_dir),
        "name": record["name"],
        "stages": stages,
        "trains": trains,
        "runs": runs,
        "counts": counts,
        "seconds_left": seconds_left(runs),
        "notes": notes,
    }


def seconds_left(runs: list[dict[str, Any]]) -> float | None:
    """About how long until every run not yet done has trained: the finished runs' mean wall
    time for each pending (or stale) run and the unfinished fraction of each running one, shared
    by the processes training now. None when nothing trains here, when runs are queued on a
    scheduler (whose pace is not this machine's), or before any run has finished."""
    finished = [r for r in runs if r["state"] == "done" and r["wall_seconds"] and r["step"]]
    running = [r for r in runs if r["state"] == "running"]
    if not finished or not running or any(r["state"] == "submitted" for r in runs):
        return None
    per_run = sum(r["wall_seconds"] for r in finished) / len(finished)
    steps = max(r["step"] for r in finished)
    waiting = sum(r["state"] in ("pending", "stale") for r in runs)
    started = sum(max(0.0, 1 - (r["step"] or 0) / steps) for r in running)
    return per_run * (waiting + started) / len(running)


def _run_record(run_dir: Path) -> dict[str, Any]:
    if not run_dir.is_dir():
        raise UsageError(f"{run_dir}: no such run directory")
    problem = json_problem(run_dir / RUN_FILE, "name", "arms", "seeds")
    if problem is not None:
        raise UsageError(
            f"{run_dir}: not a readable run directory ({problem}); give the folder `geospec run` "
            "wrote (it holds run.json)"
        )
    data = json.loads((run_dir / RUN_FILE).read_text())
    arms = [a["name"] if isinstance(a, dict) else str(a) for a in data["arms"]]
    seeds = [int(s) for s in data["seeds"]]
    return {
        "name": data["name"],
        "arms": arms,
        "seeds": seeds,
        "eval": bool(data.get("eval")),
        "record": data,
    }


def run_status(directory: Path, arm: str, seed: int, evaluates: bool = False) -> dict[str, Any]:
    """One run's state: every key is always present (None where it does not apply).
    ``evaluated``: whether eval.json holds scores of the run's model (None when the spec does not
    evaluate the arms); ``job``: where a submitted run is queued; ``wall_seconds``: how long a
    finished run took (over all its attempts)."""
    entry: dict[str, Any] = {
        "arm": arm,
        "seed": seed,
        "state": "pending",
        "final_loss": None,
        "step": None,
        "tokens_per_s": None,
        "holder": None,
        "since": None,
        "error": None,
        "job": None,
        "evaluated": None,
        "wall_seconds": None,
    }
    if json_problem(directory / RESULT_FILE, "final_val_loss") is None:
        result = json.loads((directory / RESULT_FILE).read_text())
        entry.update(
            state="done",
            final_loss=result["final_val_loss"],
            step=result.get("steps"),
            wall_seconds=result.get("wall_seconds"),
        )
        if evaluates:
            entry["evaluated"] = _scored(directory)
        return entry
    last = _last_logged(directory)
    if last is not None:
        entry.update(step=last.get("step"), tokens_per_s=last.get("tokens_per_s"))
    holder = claim_holder(directory)
    if holder is not None:
        if holder.get("damaged"):
            entry["error"] = "the claim's holder record is unreadable"
        else:
            entry["holder"] = {k: holder[k] for k in ("pid", "host", "job") if k in holder}
            entry["since"] = holder["since"]
            alive = holder_alive(holder)
            entry["state"] = "stale" if alive is False else "running"
            return entry
    failure = read_failure(directory)
    if failure is not None:
        entry.update(state="failed", error=failure["error"], since=failure.get("time"))
    return entry


def _scored(directory: Path) -> bool:
    """An intact eval.json holds scores of the model this directory holds now (the eval stage
    also checks that they are for the spec's current tasks and settings)."""
    if json_problem(directory / EVAL_FILE, "run_key", "tasks") is not None:
        return False
    if json_problem(directory / RUN_KEY_FILE, "key") is not None:
        return False
    scores = json.loads((directory / EVAL_FILE).read_text())
    return bool(scores["run_key"] == json.loads((directory / RUN_KEY_FILE).read_text())["key"])


def _last_logged(directory: Path) -> dict[str, Any] | None:
    """The last training-loss row of metrics.jsonl (damaged lines are skipped)."""
    try:
        lines = (directory / METRICS_FILE).read_text(errors="replace").splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and "loss" in row and isinstance(row.get("step"), int):
            return row
    return None


def describe(entry: dict[str, Any], now: float | None = None) -> str:
    """One run's state in words (what the table's last column shows)."""
    now = time.time() if now is None else now
    state = entry["state"]
    if state == "done":
        scored = {True: ", evaluated", False: ", not yet evaluated"}.get(entry["evaluated"], "")
        return f"final loss {entry['final_loss']:.4f}{scored}"
    parts = []
    if state == "submitted":
        parts.append(f"queued: {entry['job']}" if entry["job"] else "queued")
    if entry["step"] is not None:
        parts.append(f"step {entry['step']}")
    if state in ("running", "stale") and entry["tokens_per_s"]:
        parts.append(f"{entry['tokens_per_s']:,.0f} tok/s")
    holder = entry["holder"]
    if holder:
        who = f"job {holder['job']}" if holder.get("job") else f"pid {holder['pid']}"
        parts.append(f"{who} on {holder['host']}")
    if entry["since"] is not None and state in ("running", "stale", "submitted"):
        parts.append(f"since {_ago(now - entry['since'])}")
    if state == "stale":
        parts.append("its holder died; the next `geospec run` takes it over")
    if entry["error"]:
        parts.append(entry["error"])
    return ", ".join(parts)


def _ago(seconds: float) -> str:
    seconds = max(0, int(seconds))
    if seconds < 120:
        return f"{seconds} s ago"
    if seconds < 7200:
        return f"{seconds // 60} min ago"
    return f"{seconds // 3600} h ago"
