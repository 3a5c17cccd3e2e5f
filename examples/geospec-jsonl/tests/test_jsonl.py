"""The jsonl tracker keeps the tracker contract, with its own reader for the round trip."""

from __future__ import annotations

from pathlib import Path

from geospec_jsonl import JsonLines, read_series

from geospec.kinds import TrackedRun
from geospec.testing import check_tracker


def test_it_keeps_the_tracker_contract_and_reads_back_what_it_logged(tmp_path: Path) -> None:
    def read_back(run: TrackedRun) -> dict[str, list[tuple[int, float]]]:
        return read_series(JsonLines().path(run))

    check_tracker(JsonLines, read_back=read_back, directory=tmp_path)


def test_a_directory_param_puts_the_files_there(tmp_path: Path) -> None:
    def read_back(run: TrackedRun) -> dict[str, list[tuple[int, float]]]:
        path = tmp_path / "logs" / run.group / f"{run.name}.jsonl"
        return read_series(path)

    params = {"directory": str(tmp_path / "logs")}
    check_tracker(JsonLines, params, read_back=read_back, directory=tmp_path)
