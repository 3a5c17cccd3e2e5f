"""The measure stage: every geometry x statistic profile over the probed clouds.

``profiles.json`` holds ``{"profiles": {name: [one value per layer]}, "keys": {name: key}}``;
a profile measured before on the same clouds with the same settings is kept, so adding one
measure measures only that one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from geospec.atomic import atomic_write_json
from geospec.pipeline.context import Done, Plan, RunContext
from geospec.pipeline.keys import digest, section
from geospec.pipeline.run_dir import CLOUDS_DIR, PROFILES_FILE, read_json
from geospec.spec.resolve import measures
from geospec.spec.sections import MeasureSpec, Spec

Profiles = dict[str, list[float]]


@dataclass(frozen=True)
class Measure:
    name: ClassVar[str] = "measure"
    entries: tuple[MeasureSpec, ...]
    """The measures in effect (``measure = "all"`` expanded)."""

    @classmethod
    def from_spec(cls, spec: Spec) -> Measure:
        return cls(tuple(measures(spec)))

    def plan(self, run: RunContext, done: Mapping[str, Done], forced: bool) -> Plan:
        probe_key = done["probe"].key
        keys = {e.profile: digest("measure", section(e), probe_key) for e in self.entries}
        path = run.run_dir / PROFILES_FILE
        return Plan(
            digest("measure", keys),
            run=lambda: self.measure(run, path, keys, keep=not forced),
            load=lambda: read_profiles(run.run_dir),
            artifacts=(path,),
        )

    def measure(self, run: RunContext, path: Path, keys: dict[str, str], keep: bool) -> Profiles:
        previous = read_json(path) if keep else None
        kept: Profiles = {}
        if isinstance(previous, dict):
            kept = {
                name: values
                for name, values in previous.get("profiles", {}).items()
                if previous.get("keys", {}).get(name) == keys.get(name)
            }
        todo = [e for e in self.entries if e.profile not in kept]
        if todo:
            from geospec.measure.work import measure_profiles
            from geospec.pipeline.stages.probe import load_clouds

            clouds = load_clouds(run.run_dir / CLOUDS_DIR)
            run.say(f"[bold]measure[/]: {len(todo)} profiles x {len(clouds)} layers")
            kept.update(measure_profiles(clouds, todo, progress=True))
        profiles = {e.profile: kept[e.profile] for e in self.entries}
        atomic_write_json(path, {"profiles": profiles, "keys": keys})
        return profiles


def read_profiles(run_dir: Path) -> Profiles:
    """The measured profiles of a run (empty before the measure stage)."""
    stored = read_json(run_dir / PROFILES_FILE)
    return dict(stored.get("profiles", {})) if isinstance(stored, dict) else {}
