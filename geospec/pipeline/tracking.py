"""Experiment trackers watching a training run (``[train] trackers``; the contract is
:class:`geospec.kinds.Tracker`).

:class:`RunTrackers` is the observer :func:`geospec.engine.train.train_model` tells about a run on
rank 0 (where it starts, each ``metrics.jsonl`` row, the result); it hands everything to a fresh
instance of each tracker the spec lists. A tracker that raises (its package is missing, the
network is down, its server refuses) is turned off for the run with one warning: trackers never
stop training. The tracker run's id is derived from the run key, so a resumed run continues the
same tracker run, and a run trained again after its settings changed starts another.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from geospec.errors import last_line
from geospec.kinds import TrackedRun, Tracker
from geospec.pipeline.keys import digest
from geospec.plugin_base import PluginParams


@dataclass(frozen=True)
class TrackAs:
    """How trackers name a run: grouped by ``study`` (the spec's name), named
    ``<arm>/seed-<k>``."""

    study: str
    arm: str


def tracker_run_id(study: str, name: str, key: str) -> str:
    """The tracker run id of a run: the same for every session of one run (its key), different
    for another spec, arm or seed, and short and plain enough for every tracker's id rules."""
    return digest("tracker", study, name, key)


class RunTrackers:
    """The trackers of one training run (a :class:`geospec.engine.train.TrainObserver`)."""

    def __init__(
        self,
        tables: Sequence[PluginParams],
        run: TrackedRun,
        say: Callable[[str], None],
    ) -> None:
        self.tables = tuple(tables)
        self.run = run
        self.say = say
        self.active: list[tuple[str, Tracker]] = []

    def start(self, fingerprint: dict[str, Any], step: int) -> None:
        run = replace(self.run, config={**self.run.config, "fingerprint": fingerprint}, step=step)
        for table in self.tables:
            try:
                tracker = _create(table)
                tracker.start(run)
            except Exception as error:  # a tracker never stops training
                self._warn(table.kind, error)
                continue
            self.active.append((table.kind, tracker))

    def log(self, row: dict[str, Any]) -> None:
        # converted inside the guarded call: a row a tracker cannot take turns it off, never
        # training
        self._each(lambda tracker: tracker.log(int(row["step"]), _metrics(row)))

    def end(self, result: dict[str, Any] | None) -> None:
        self._each(lambda tracker: tracker.end(result))
        self.active = []

    def _each(self, call: Callable[[Tracker], None]) -> None:
        for kind, tracker in list(self.active):
            try:
                call(tracker)
            except Exception as error:
                self.active.remove((kind, tracker))
                self._warn(kind, error)

    def _warn(self, kind: str, error: Exception) -> None:
        from rich.markup import escape

        self.say(
            f"[yellow]![/] tracker {kind} ({self.run.name}): {escape(last_line(error))}; "
            "training goes on without it"
        )


def run_trackers(
    tables: Sequence[PluginParams],
    track: TrackAs,
    *,
    key: str,
    directory: Path,
    run_dir: Path,
    seed: int,
    widths: list[int],
    say: Callable[[str], None],
) -> RunTrackers | None:
    """The trackers watching one run, or None when the spec lists none."""
    if not tables:
        return None
    name = f"{track.arm}/seed-{seed}"
    run = TrackedRun(
        name=name,
        group=track.study,
        id=tracker_run_id(track.study, name, key),
        directory=directory,
        run_dir=run_dir,
        config={"arm": track.arm, "seed": seed, "widths": list(widths), "run_key": key},
    )
    return RunTrackers(tables, run, say)


def _metrics(row: dict[str, Any]) -> dict[str, float]:
    return {name: float(value) for name, value in row.items() if name != "step"}


def _create(table: PluginParams) -> Tracker:
    from geospec.registry.loading import get_registries

    tracker: Tracker = get_registries().create("tracker", table)
    return tracker
