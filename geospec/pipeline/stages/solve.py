"""The solve stage: every arm's FFN widths from its schedule and the profiles (measured, and
diagnostic when the diagnose stage ran), written to ``widths.json``.

The widths are computed on every rank (cheap) and keyed by their own values, so a change that
leaves them equal retrains nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

from geospec.errors import GeospecError
from geospec.pipeline.context import Done, Plan, RunContext
from geospec.pipeline.keys import digest
from geospec.pipeline.run_dir import WIDTHS_FILE, read_json_or_none
from geospec.solve.widths import WidthsResult, compute_widths, write_widths
from geospec.spec.sections import ArmSpec, ModelSpec, Spec


@dataclass(frozen=True)
class Solve:
    name: ClassVar[str] = "solve"
    model: ModelSpec
    arms: tuple[ArmSpec, ...]
    pretrained_reference: bool
    """Profiles of a pretrained reference may have another depth (schedules resample them)."""

    @classmethod
    def from_spec(cls, spec: Spec) -> Solve:
        return cls(spec.model, tuple(spec.arms), spec.reference.checkpoint is not None)

    def plan(self, run: RunContext, done: Mapping[str, Done], forced: bool) -> Plan:
        profiles = {**(done["measure"].output or {}), **(done["diagnose"].output or {})}
        result = compute_widths(
            self.model, self.arms, profiles, pretrained_reference=self.pretrained_reference
        )
        if result.pending:
            why = "".join(
                f"; {arm} {result.notes[arm]}" for arm in result.pending if arm in result.notes
            )
            raise GeospecError(f"solve: profiles missing for arms {sorted(result.pending)}{why}")
        path = run.run_dir / WIDTHS_FILE
        rewrite = read_json_or_none(path) != result.to_json()
        return Plan(
            digest("solve", result.to_json()),
            run=lambda: self.write(run, result),
            load=lambda: result.widths,
            artifacts=(path,),
            problem=f"{WIDTHS_FILE} does not hold the widths these profiles give"
            if rewrite
            else None,
            main_only=False,
        )

    def write(self, run: RunContext, result: WidthsResult) -> dict[str, list[int]]:
        if run.is_main:
            write_widths(run.run_dir / WIDTHS_FILE, result)
            for arm, values in result.widths.items():
                run.say(f"  {arm:<24} {' '.join(str(w) for w in values)}")
            for arm, note in result.notes.items():  # a derived arm equal to its source
                run.say(f"  [cyan]note:[/] {arm} {note}")
        return result.widths
