"""The measure stage: every geometry x statistic profile over the probed clouds.

``profiles.json`` holds ``{"profiles": {name: [one value per layer]}, "keys": {name: key},
"plugins": {name: {"statistic": provenance, "geometry": provenance}}}``, a provenance being
the plugin's distribution and version (and its module's source hash when it runs from source:
an editable install, an in-tree module, a plugin file). A profile's key holds its settings, the
clouds' key and the provenance of its third-party plugins: a profile measured before on the same
clouds with the same settings by the same plugins is kept, so adding one measure, or changing
one plugin, measures only the profiles it concerns. The builtins' provenance is recorded but not
keyed: like every stage's own code, a builtin whose results change changes its key explicitly
(docs/architecture.md), so upgrading geospec re-measures no run for nothing.
With ``probe.replicates`` R > 1 every profile is measured on each
of the R token samples: ``"replicates": {name: [[one value per layer] x R]}`` keeps them and
``"profiles"`` holds their per-layer mean (what the solver uses).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from geospec.pipeline.context import Plan, RunContext, Upstream
from geospec.pipeline.keys import digest, section
from geospec.rundir.artifacts import json_problem, read_json
from geospec.rundir.layout import CLOUDS_DIR, PROFILES_FILE
from geospec.spec.resolve import measures
from geospec.spec.sections import MeasureSpec, Spec
from geospec.stats import MIN_RELIABILITY
from geospec.storage.atomic import atomic_write_json
from geospec.storage.digests import sealed

Profiles = dict[str, list[float]]
#: A measure's plugins, as keys and profiles.json see them: ``{"statistic": ..., "geometry":
#: ...}``, each :meth:`geospec.registry.entries.Entry.provenance`.
Provenance = dict[str, dict[str, str | None]]


def provenance(entry: MeasureSpec, builtins: bool) -> Provenance:
    """The provenance of the statistic and geometry that measure ``entry`` (registries in
    effect); without the builtins' when ``builtins`` is False."""
    from geospec.registry.loading import BUILTIN_PROVIDER, get_registries

    registries = get_registries()
    found = {
        "statistic": registries["statistic"].get(entry.statistic.kind),
        "geometry": registries["geometry"].get(entry.geometry.kind),
    }
    return {
        role: plugin.provenance()
        for role, plugin in found.items()
        if builtins or plugin.provider != BUILTIN_PROVIDER
    }


@dataclass(frozen=True)
class Measure:
    name: ClassVar[str] = "measure"
    reads: ClassVar[tuple[str, ...]] = ("probe",)
    entries: tuple[MeasureSpec, ...]
    """The measures in effect (``measure = "all"`` expanded)."""
    min_reliability: float = MIN_RELIABILITY
    """Profiles measured on replicates whose split-half reliability is below this are named in
    a warning (it changes no artifact, so no key)."""
    plugins: tuple[Provenance, ...] = ()
    """What measures each entry: its statistic's and geometry's provenance."""
    keyed: tuple[Provenance, ...] = ()
    """The part of each entry's provenance its key holds: its third-party plugins'."""

    @classmethod
    def from_spec(cls, spec: Spec) -> Measure:
        entries = tuple(measures(spec))
        plugins = tuple(provenance(entry, builtins=True) for entry in entries)
        keyed = tuple(provenance(entry, builtins=False) for entry in entries)
        return cls(entries, spec.report.min_reliability, plugins, keyed)

    def plan(self, run: RunContext, upstream: Upstream, forced: bool) -> Plan:
        probe_key = upstream.key("probe")
        keys = {  # a profile measured by builtins alone keeps the key it always had
            e.profile: digest("measure", section(e), probe_key, *([keyed] if keyed else []))
            for e, keyed in zip(self.entries, self.keyed, strict=True)
        }
        path = run.run_dir / PROFILES_FILE
        return Plan(
            digest("measure", keys),
            run=lambda: self.measure(run, path, keys, keep=not forced),
            load=lambda: read_profiles(run.run_dir),
            artifacts=(path,),
            problem=self.problem(path) if path.exists() else None,
            main_only=False,  # every rank measures its share of the layers (torchrun)
        )

    def problem(self, path: Path) -> str | None:
        """What keeps profiles.json from being trusted: unreadable, or a profile missing or
        not a list of finite numbers."""
        problem = json_problem(path, "profiles", "keys")
        if problem is not None:
            return problem
        profiles = json.loads(path.read_text())["profiles"]
        for entry in self.entries:
            values = profiles.get(entry.profile) if isinstance(profiles, dict) else None
            if not isinstance(values, list) or not all(_is_number(v) for v in values):
                return f"{PROFILES_FILE} has no valid profile {entry.profile!r}"
        return None

    def measure(self, run: RunContext, path: Path, keys: dict[str, str], keep: bool) -> Profiles:
        readable = json_problem(path, "profiles", "keys") is None
        previous = read_json(path) if keep and readable else None
        kept: Profiles = {}
        replicates: dict[str, list[list[float]]] = {}  # per profile, when measured on replicates
        if isinstance(previous, dict):
            kept = {
                name: values
                for name, values in previous.get("profiles", {}).items()
                if previous.get("keys", {}).get(name) == keys.get(name)
                and isinstance(values, list)
                and all(_is_number(v) for v in values)
            }
            stored = previous.get("replicates") or {}
            replicates = {name: stored[name] for name in kept if name in stored}
        todo = [e for e in self.entries if e.profile not in kept]
        if todo:
            from geospec.engine.train import resolve_device
            from geospec.measure.clouds import cloud_replicates, load_clouds
            from geospec.measure.work import measure_profiles, measure_replicates

            clouds = load_clouds(run.run_dir / CLOUDS_DIR)
            # distance matrices on this rank's GPU, when the run has one (float32 there)
            device = resolve_device(run.device, run.dist.local_rank)
            samples = cloud_replicates(run.run_dir / CLOUDS_DIR)
            times = f" x {samples} token samples" if samples > 1 else ""
            run.say(f"[bold]measure[/]: {len(todo)} profiles x {len(clouds)} layers{times}")
            if samples == 1:
                kept.update(
                    measure_profiles(
                        clouds, todo, progress=run.is_main, dist=run.dist, device=device
                    )
                )
            else:  # the solver takes the mean; profiles.json keeps every replicate
                measured = measure_replicates(
                    clouds, samples, todo, progress=run.is_main, dist=run.dist, device=device
                )
                replicates.update(measured)
                kept.update({name: _mean(values) for name, values in measured.items()})
        profiles = {e.profile: kept[e.profile] for e in self.entries}
        plugins = {e.profile: p for e, p in zip(self.entries, self.plugins, strict=True)}
        record: dict[str, object] = {"profiles": profiles, "keys": keys, "plugins": plugins}
        replicated = {
            e.profile: replicates[e.profile] for e in self.entries if e.profile in replicates
        }
        if replicated:
            record["replicates"] = replicated
            self.warn_unreliable(run, replicated)
        if run.is_main:
            atomic_write_json(path, sealed(record))
        return profiles

    def warn_unreliable(self, run: RunContext, replicated: dict[str, list[list[float]]]) -> None:
        """Name the profiles whose shape over the layers the replicates do not reproduce, before
        anyone trains on them."""
        from geospec.stats import shown_against, split_half_reliability

        for name, values in replicated.items():
            rho = split_half_reliability(values)
            if rho is None or rho < self.min_reliability:
                shown = shown_against(rho, self.min_reliability)
                run.say(
                    f"[yellow]![/] profile {name}: split-half reliability {shown} over "
                    f"{len(values)} token samples is below {self.min_reliability:g} "
                    "(report.min_reliability): its shape is largely sampling noise"
                )


def _mean(replicates: list[list[float]]) -> list[float]:
    return [sum(layer) / len(layer) for layer in zip(*replicates, strict=True)]


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def read_profiles(run_dir: Path) -> Profiles:
    """The measured profiles of a run (empty before the measure stage)."""
    stored = read_json(run_dir / PROFILES_FILE)
    return dict(stored.get("profiles", {})) if isinstance(stored, dict) else {}
