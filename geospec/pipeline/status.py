"""Where a run directory stands: every stage, and every arm x seed (``geospec status``).

Read from the run directory alone, without torch and without taking any lock: ``stages.json``
and the stages' artifacts; for each training directory its ``result.json`` (done), the holder
record of its claim (:func:`geospec.locks.claim_holder`: running, or a stale claim whose holder
died), ``failure.json`` (failed, with the last error line) and ``metrics.jsonl`` (the step a run
has reached and its speed). The JSON form (:func:`status`) is stable: scripts may rely on its
keys.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from geospec.engine.run_files import METRICS_FILE, RESULT_FILE
from geospec.errors import UsageError
from geospec.locks import claim_holder, holder_alive
from geospec.pipeline.run_dir import (
    REPORT_FILE,
    RUN_FILE,
    STAGES_FILE,
    StageLog,
    arm_seed_dir,
    json_problem,
    read_failure,
)

#: The pipeline's stages in order (as geospec.pipeline.executor.STAGES, without importing it).
STAGE_NAMES = ("reference", "probe", "measure", "diagnose", "solve", "train", "eval", "report")

#: Every state a run can be in.
RUN_STATES = ("done", "running", "stale", "failed", "pending")


def status(run_dir: Path) -> dict[str, Any]:
    """The state of every stage and run of ``run_dir`` (see the module docstring)."""
    record = _run_record(run_dir)
    keys = StageLog(run_dir / STAGES_FILE).keys()
    stages = []
    for index, name in enumerate(STAGE_NAMES):
        state = "done" if name in keys else "pending"
        if name == "report" and state == "done" and not (run_dir / REPORT_FILE).exists():
            state = "pending"
        if state == "pending" and any(later in keys for later in STAGE_NAMES[index + 1 :]):
            state = "skipped"  # the spec does not use it (diagnose off, probe-only, ...)
        stages.append({"name": name, "state": state})
    runs = [
        run_status(arm_seed_dir(run_dir, arm, seed), arm, seed)
        for seed in record["seeds"]
        for arm in record["arms"]
    ]
    counts = {state: sum(r["state"] == state for r in runs) for state in RUN_STATES}
    return {
        "run_dir": str(run_dir),
        "name": record["name"],
        "stages": stages,
        "runs": runs,
        "counts": counts,
    }


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
    return {"name": data["name"], "arms": arms, "seeds": [int(s) for s in data["seeds"]]}


def run_status(directory: Path, arm: str, seed: int) -> dict[str, Any]:
    """One run's state: every key is always present (None where it does not apply)."""
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
    }
    if json_problem(directory / RESULT_FILE, "final_val_loss") is None:
        result = json.loads((directory / RESULT_FILE).read_text())
        entry.update(state="done", final_loss=result["final_val_loss"], step=result.get("steps"))
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
        return f"final loss {entry['final_loss']:.4f}"
    parts = []
    if entry["step"] is not None:
        parts.append(f"step {entry['step']}")
    if state in ("running", "stale") and entry["tokens_per_s"]:
        parts.append(f"{entry['tokens_per_s']:,.0f} tok/s")
    holder = entry["holder"]
    if holder:
        who = f"job {holder['job']}" if holder.get("job") else f"pid {holder['pid']}"
        parts.append(f"{who} on {holder['host']}")
    if entry["since"] is not None and state in ("running", "stale"):
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
