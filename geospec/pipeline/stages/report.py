"""The report stage: results.json, report.md and plots/ from the run directory's records
(:mod:`geospec.report`), printed as a table.

It is rebuilt whenever an earlier stage did work, so the report always shows the runs on disk.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from geospec.pipeline.context import Done, Plan, RunContext
from geospec.pipeline.keys import digest, section
from geospec.pipeline.run_dir import REPORT_FILE, RESULTS_FILE, json_problem, read_json
from geospec.spec.sections import ReportSpec, Spec


@dataclass(frozen=True)
class Report:
    name: ClassVar[str] = "report"
    report: ReportSpec
    arms: tuple[str, ...]

    @classmethod
    def from_spec(cls, spec: Spec) -> Report:
        return cls(spec.report, tuple(a.name for a in spec.arms))

    def plan(self, run: RunContext, done: Mapping[str, Done], forced: bool) -> Plan:
        # optional stages enter the key only where they apply (keys of runs without them stay)
        optional = [
            done[name].key
            for name in ("diagnose", "demand", "prune", "eval")
            if done[name].key is not None
        ]
        key = digest(
            "report",
            done["train"].key,
            done["measure"].key,
            section(self.report),
            list(self.arms),
            *optional,
        )
        return Plan(
            key,
            run=lambda: self.show(run, self.write(run)),
            load=lambda: self.show(run, read_json(run.run_dir / RESULTS_FILE)),
            artifacts=(run.run_dir / RESULTS_FILE,),
            problem=json_problem(run.run_dir / RESULTS_FILE, "arms", "checks"),
            current=False if any(d.ran for d in done.values()) else None,
        )

    def write(self, run: RunContext) -> dict[str, Any]:
        from geospec.report.write import write_report

        return write_report(run.run_dir, plots=self.report.plots)

    def show(self, run: RunContext, results: dict[str, Any]) -> dict[str, Any]:
        if run.is_main:
            from geospec.report.terminal import print_table

            print_table(results)
            run.say(f"report: {run.run_dir / REPORT_FILE}")
        return results
