"""The `jsonl` tracker: each training run's metrics as JSON lines, one file per run.

``<directory>/<spec name>/<arm>/seed-<k>.jsonl`` (default directory: the run directory's
``jsonl/``) gets ``{"step": ..., "loss": ..., ...}`` per row and ``{"result": {...}}`` at the end.
A resumed run first drops the rows after the step it resumes from, so every step appears once
with the value training kept. :func:`read_series` reads a file back.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any, Literal

from geospec import hookimpl
from geospec.kinds import TrackedRun, Tracker
from geospec.plugin import PluginParams, Register


class JsonLines(Tracker):
    """Metrics as JSON lines (a tracker needing no library: see the module docstring)."""

    class Params(PluginParams):
        kind: Literal["jsonl"] = "jsonl"
        directory: str | None = None
        """Where the files go (default: the run directory's jsonl/)."""

    params: Params
    file: IO[str]

    def path(self, run: TrackedRun) -> Path:
        root = Path(self.params.directory) if self.params.directory else run.run_dir / "jsonl"
        return root / run.group / f"{run.name}.jsonl"

    def start(self, run: TrackedRun) -> None:
        path = self.path(run)
        path.parent.mkdir(parents=True, exist_ok=True)
        kept = [row for row in _rows(path) if row.get("step", 0) <= run.step]
        path.write_text("".join(json.dumps(row) + "\n" for row in kept))
        self.file = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed by end()

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        self.file.write(json.dumps({"step": step, **metrics}) + "\n")
        self.file.flush()

    def end(self, result: Mapping[str, Any] | None) -> None:
        if result is not None:
            self.file.write(json.dumps({"result": dict(result)}) + "\n")
        self.file.close()


def _rows(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [row for row in rows if "step" in row]


def read_series(path: Path) -> dict[str, list[tuple[int, float]]]:
    """A run's file as ``{metric: [(step, value), ...]}`` in step order."""
    series: dict[str, list[tuple[int, float]]] = {}
    for row in _rows(path):
        step = row.pop("step")
        for name, value in row.items():
            series.setdefault(name, []).append((step, value))
    return series


@hookimpl
def geospec_register_trackers(register: Register) -> None:
    register(JsonLines)
