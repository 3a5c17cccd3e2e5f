"""The report stage: results.json, report.md and plots/ from the run directory's records
(:mod:`geospec.report`), printed as a table.

It is rebuilt whenever an earlier stage did work, so the report always shows the runs on disk.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from geospec.pipeline.context import Plan, RunContext, Upstream
from geospec.pipeline.keys import digest, section
from geospec.pipeline.status import STAGE_NAMES
from geospec.rundir.artifacts import json_problem, read_json
from geospec.rundir.layout import REPORT_FILE, RESULTS_FILE
from geospec.spec.sections import ReportSpec, Spec


@dataclass(frozen=True)
class Report:
    name: ClassVar[str] = "report"
    # every stage before it: the report is written again whenever any of them did work
    reads: ClassVar[tuple[str, ...]] = STAGE_NAMES[: STAGE_NAMES.index("report")]
    report: ReportSpec
    arms: tuple[str, ...]

    @classmethod
    def from_spec(cls, spec: Spec) -> Report:
        return cls(spec.report, tuple(a.name for a in spec.arms))

    def plan(self, run: RunContext, upstream: Upstream, forced: bool) -> Plan:
        # optional stages enter the key only where they apply (keys of runs without them stay)
        optional = [
            upstream.key(name)
            for name in ("diagnose", "demand", "prune", "eval")
            if upstream.key(name) is not None
        ]
        key = digest(
            "report",
            upstream.key("train"),
            upstream.key("measure"),
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
            current=False if upstream.any_ran() else None,
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
