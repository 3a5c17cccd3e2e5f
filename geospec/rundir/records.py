"""The run directory's records that the pipeline writes and the report reads (below both, so
that neither imports the other for them): the stages' keys (``stages.json``), the optional
stages' records (diagnostics.json, demand.json, prune.json) with the keys each must hold, a
training directory's run key, and whether a run trains nothing."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from geospec.rundir.artifacts import json_problem, read_json, read_json_or_none
from geospec.rundir.layout import (
    DEMAND_FILE,
    DIAGNOSTICS_FILE,
    PRUNE_FILE,
    RUN_FILE,
    RUN_KEY_FILE,
    STAGES_FILE,
)
from geospec.storage.atomic import atomic_write_json
from geospec.storage.digests import digest

#: The train stage's key in a spec that trains no arm (``probe_only``): the same for every such
#: spec, so a run directory says by it alone that nothing was to be trained.
PROBE_ONLY_TRAIN_KEY = digest("train", "probe-only")

#: What the demand measurement (keyed by the demand stage's compute key) consists of.
MEASURED_KEYS = (
    "loss",
    "importance",
    "keep",
    "multiple",
    "layers",
    "additivity",
    "orders",
    "fallback",
)
#: What each optional stage's record holds at the top level: one without these keys, unreadable
#: or changed after geospec sealed it is written again, and left out of the report until then.
DIAGNOSTICS_KEYS = ("profiles", "loss", "layers", "additivity", "correlations", "keys")
DEMAND_KEYS = ("profiles", *MEASURED_KEYS, "correlations", "keys")
PRUNE_KEYS = ("keep", "baseline", "corpora", "reference", "budgets", "key")


def _sound_record(path: Path, keys: tuple[str, ...]) -> dict[str, Any] | None:
    if json_problem(path, *keys) is not None:
        return None
    data: dict[str, Any] = read_json(path)
    return data


def read_diagnostics(run_dir: Path) -> dict[str, Any] | None:
    """The run's diagnostics.json, or None when the diagnose stage has not written a sound one."""
    return _sound_record(Path(run_dir) / DIAGNOSTICS_FILE, DIAGNOSTICS_KEYS)


def read_demand(run_dir: Path) -> dict[str, Any] | None:
    """The run's demand.json, or None when the demand stage has not written a sound one."""
    return _sound_record(Path(run_dir) / DEMAND_FILE, DEMAND_KEYS)


def read_prune(run_dir: Path) -> dict[str, Any] | None:
    """The run's prune.json, or None when the prune stage has not written a sound one."""
    return _sound_record(Path(run_dir) / PRUNE_FILE, PRUNE_KEYS)


def stored_measurement(
    record: Mapping[str, Any] | None, compute_key: str | None, fields: Sequence[str]
) -> dict[str, Any] | None:
    """The measurement (``fields``) of an optional stage's stored ``record`` where it was taken
    with the settings of ``compute_key`` (the record's ``keys["compute"]``): a stage whose key
    changed only in what is derived from its measurement writes its record again without
    measuring again. None where there is no record or it was measured otherwise."""
    if record is None or record.get("keys", {}).get("compute") != compute_key:
        return None
    return {field: record[field] for field in fields}


@dataclass(frozen=True)
class StageLog:
    """The stages' keys as ``stages.json`` records them (read afresh each time: several
    ``geospec run`` processes may share a run directory)."""

    path: Path

    def keys(self) -> dict[str, str]:
        try:
            stored = json.loads(self.path.read_text()) if self.path.exists() else {}
        except (json.JSONDecodeError, UnicodeDecodeError):
            stored = {}  # a damaged bookkeeping file only costs recomputation
        if not isinstance(stored, dict):
            return {}
        return {stage: key for stage, key in stored.items() if isinstance(key, str)}

    def record(self, stage: str, key: str) -> None:
        keys = self.keys()
        if keys.get(stage) != key:
            keys[stage] = key
            atomic_write_json(self.path, keys)

    def forget(self, stage: str) -> None:
        """Drop ``stage``'s key: it did part of its work, and runs again next time."""
        keys = self.keys()
        if stage in keys:
            del keys[stage]
            atomic_write_json(self.path, keys)


def stored_run_key(out: Path) -> str | None:
    """The key recorded in a training directory; None when there is none or it is unreadable
    (the run then resumes, and the trainer's own fingerprint check guards what it resumes)."""
    try:
        record = json.loads((out / RUN_KEY_FILE).read_text())
    except (OSError, ValueError):
        return None
    key = record.get("key") if isinstance(record, dict) else None
    return key if isinstance(key, str) else None


def trains_nothing(run_dir: Path, record: Any = None) -> bool:
    """Whether the run's spec trains no arm (``probe_only``: a probe-only or pruning spec), so
    that status and the report list no runs and count none as pending: its run.json
    (``record``, read here when None) says so, or, in a run directory from before run.json
    said it, its train stage recorded the probe-only key."""
    if record is None:
        record = read_json_or_none(run_dir / RUN_FILE)
    if isinstance(record, dict) and record.get("probe_only") is True:
        return True
    return StageLog(run_dir / STAGES_FILE).keys().get("train") == PROBE_ONLY_TRAIN_KEY
