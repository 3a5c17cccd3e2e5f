"""The run directory: artifact names, the stage-key record, who owns a training directory, the
run's metadata, and one reader for JSON artifacts.

Layout (docs/pipeline.md): ``spec.resolved.toml``, ``plugins.json``, ``env.json``, ``run.json``,
``stages.json``, ``reference/``, ``clouds/``, ``profiles.json``, ``diagnostics.json``,
``widths.json``, ``arms/<arm>/seed-<k>/`` (one training directory each), ``results.json``,
``report.md``, ``plots/``. A training directory holds ``run_key.json`` (the key of the run it
belongs to) besides the files of :mod:`geospec.engine.checkpoint`.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from geospec import __version__
from geospec.atomic import atomic_write_json, atomic_write_text
from geospec.engine.run_files import RESULT_FILE
from geospec.errors import UsageError

if TYPE_CHECKING:
    from geospec.pipeline.context import RunContext
    from geospec.spec.sections import Spec

STAGES_FILE = "stages.json"
RUN_FILE = "run.json"
REFERENCE_DIR = "reference"
CLOUDS_DIR = "clouds"
PROFILES_FILE = "profiles.json"
DIAGNOSTICS_FILE = "diagnostics.json"
WIDTHS_FILE = "widths.json"
RESULTS_FILE = "results.json"
REPORT_FILE = "report.md"
RUN_KEY_FILE = "run_key.json"


def arm_seed_dir(run_dir: Path, arm: str, seed: int) -> Path:
    """The training directory of one arm and seed."""
    return run_dir / "arms" / arm / f"seed-{seed}"


def read_json(path: Path) -> Any:
    """A JSON artifact's content, None when it does not exist; a damaged one is a UsageError
    naming the file and what to do."""
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise UsageError(f"{path}: not valid JSON ({error}); delete it and rerun") from None


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


# ---------------------------------------------------------------------------------------------
# training directories


def stored_run_key(out: Path) -> str | None:
    record = read_json(out / RUN_KEY_FILE)
    return record.get("key") if isinstance(record, dict) else None


def is_trained(out: Path, key: str) -> bool:
    """``out`` holds the finished run ``key``."""
    return stored_run_key(out) == key and (out / RESULT_FILE).exists()


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
            run.say(f"[yellow]![/] {_shown(out, run.run_dir)}: inputs changed, starting over")
            shutil.rmtree(out)
        atomic_write_json(out / RUN_KEY_FILE, {"key": key, "widths": widths})
    barrier(run.dist)


def _shown(path: Path, run_dir: Path) -> Path:
    return path.relative_to(run_dir) if path.is_relative_to(run_dir) else path


# ---------------------------------------------------------------------------------------------
# what is recorded with every run


def write_run_metadata(run_dir: Path, spec: Spec, spec_path: Path) -> None:
    """The resolved spec, plugin versions, environment and what the report needs (run.json)."""
    import tomlkit

    from geospec.pipeline.keys import section
    from geospec.registry.loading import get_registries
    from geospec.spec.resolve import measures

    resolved = spec.model_dump(mode="json")
    resolved["measure"] = [section(e) for e in measures(spec)]
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
            "arms": [{"name": a.name, "schedule": section(a.schedule)} for a in spec.arms],
            "seeds": list(spec.train.seeds),
            "geospec": __version__,
        },
    )


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
