"""geospec status's estimate of the time left (torch-free: the core session runs it too)."""

from __future__ import annotations

from typing import Any

import pytest

from geospec.pipeline.status import seconds_left


def entry(state: str, step: int | None = None, wall: float | None = None) -> dict[str, Any]:
    return {"state": state, "step": step, "wall_seconds": wall}


def test_time_left_is_the_finished_pace_times_the_work_left_shared_by_the_processes() -> None:
    runs = [
        entry("done", 100, 200.0),
        entry("done", 100, 400.0),  # mean: 300 s a run
        entry("running", 25),  # three quarters left
        entry("running", 100),  # at its last step: nothing left
        entry("pending"),
        entry("stale"),  # the next `geospec run` takes it over
        entry("failed"),  # trains again only when someone fixes it: not counted
    ]
    assert seconds_left(runs) == pytest.approx(300.0 * (2 + 0.75 + 0.0) / 2)


@pytest.mark.parametrize(
    "runs",
    [
        [entry("pending"), entry("running", 10)],  # no run has finished: no pace yet
        [entry("done", 100, 60.0), entry("pending")],  # nothing is training
        [entry("done", 100, 60.0), entry("running", 10), entry("submitted")],  # a cluster's pace
    ],
    ids=["nothing finished", "nothing running", "runs queued on a scheduler"],
)
def test_no_estimate_without_a_pace_or_a_process(runs: list[dict[str, Any]]) -> None:
    assert seconds_left(runs) is None
