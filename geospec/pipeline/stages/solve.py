"""The solve stage: every arm's FFN widths from its schedule and the profiles (measured, and
diagnostic and demand profiles when those stages ran), written to ``widths.json``.

The widths are computed on every rank (cheap) and keyed by their own values, so a change that
leaves them equal retrains nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from geospec.errors import GeospecError
from geospec.pipeline.context import Plan, RunContext, Upstream
from geospec.pipeline.keys import digest
from geospec.rundir.artifacts import read_json_or_none
from geospec.rundir.layout import WIDTHS_FILE
from geospec.solve.widths import WidthsResult, compute_widths
from geospec.spec.sections import ArmSpec, ModelSpec, Spec
from geospec.storage.atomic import atomic_write_json
from geospec.storage.digests import SEAL, seal_broken, sealed, unsealed


@dataclass(frozen=True)
class Solve:
    name: ClassVar[str] = "solve"
    reads: ClassVar[tuple[str, ...]] = ("measure", "diagnose", "demand")
    model: ModelSpec
    arms: tuple[ArmSpec, ...]
    pretrained_reference: bool
    """Profiles of a pretrained reference may have another depth (schedules resample them)."""

    @classmethod
    def from_spec(cls, spec: Spec) -> Solve:
        return cls(spec.model, tuple(spec.arms), spec.reference.checkpoint is not None)

    def plan(self, run: RunContext, upstream: Upstream, forced: bool) -> Plan:
        profiles = upstream.profiles()
        result = compute_widths(
            self.model, self.arms, profiles, pretrained_reference=self.pretrained_reference
        )
        if result.pending:
            why = "".join(
                f"; {arm} {result.notes[arm]}" for arm in result.pending if arm in result.notes
            )
            raise GeospecError(f"solve: profiles missing for arms {sorted(result.pending)}{why}")
        path = run.run_dir / WIDTHS_FILE
        return Plan(
            # keyed by the widths alone, as before widths.json held bounds, so that the stages
            # keyed on this one stay done; other changes to widths.json are its `problem`
            digest("solve", without_bounds(result.to_json())),
            run=lambda: self.write(run, result),
            load=lambda: result.widths,
            artifacts=(path,),
            problem=stored_problem(read_json_or_none(path), result),
            main_only=False,
        )

    def write(self, run: RunContext, result: WidthsResult) -> dict[str, list[int]]:
        if run.is_main:
            # sealed, so a report or `geospec train` reading it notices an edit
            atomic_write_json(run.run_dir / WIDTHS_FILE, sealed(result.to_json()))
            for arm, values in result.widths.items():
                run.say(f"  {arm:<24} {' '.join(str(w) for w in values)}")
                at_bounds = result.at_bounds(arm)
                if at_bounds:
                    run.say(f"  {'':<24} [dim]{at_bounds}[/]")
            for arm, note in result.notes.items():  # a derived arm equal to its source
                run.say(f"  [cyan]note:[/] {arm} {note}")
        return result.widths


def stored_problem(stored: object, result: WidthsResult) -> str | None:
    """Why a ``widths.json`` that exists (``stored``, its content) is written again, or None."""
    expected = result.to_json()
    if isinstance(stored, dict) and SEAL not in stored:
        # written before widths.json was sealed and held bounds: judged on its widths alone
        expected = without_bounds(expected)
    if not isinstance(stored, dict) or unsealed(stored) != expected:
        return f"{WIDTHS_FILE} does not hold the widths these profiles give"
    if seal_broken(stored):
        return f"{WIDTHS_FILE} was changed after geospec wrote it"
    return None


def without_bounds(plan: dict[str, Any]) -> dict[str, Any]:
    """widths.json's content as it was before it held each arm's bounds."""
    arms = {
        arm: {key: value for key, value in entry.items() if key != "bounds"}
        for arm, entry in plan["arms"].items()
    }
    return {**plan, "arms": arms}
