"""Speeds with their spread (geospec.prune.runtime): the best and median of the rounds, the
machine's load average and its warning, and What to ship's line built from a record (new and
old). llama.cpp's own timings are tested in tests/test_llamacpp.py."""

from __future__ import annotations

import os

import numpy as np
import pytest

from geospec.prune.runtime import Load, Speed, Timing, machine_load
from geospec.report.prune import shipped_line


def test_a_timing_is_the_best_and_the_median_of_each_figure() -> None:
    rounds = [Speed(300.0, 90.0), Speed(120.0, 101.0), Speed(280.0, 40.0), Speed(295.0, 99.0)]
    timing = Timing.of(rounds)
    prompts = np.array([r.prompt for r in rounds])
    generations = np.array([r.generation for r in rounds])
    assert timing.best == Speed(float(prompts.max()), float(generations.max()))
    assert timing.median == Speed(float(np.median(prompts)), float(np.median(generations)))
    assert timing.rounds == 4


def test_the_load_warns_where_the_last_minute_exceeds_the_cores() -> None:
    quiet, busy = Load(1.5, 3.0, 3.0, 2), Load(2.5, 1.0, 1.0, 2)
    assert not quiet.busy and "warning" not in quiet.words()
    assert quiet.words() == "load 1.50/3.00/3.00 on 2 cores"
    assert busy.busy and "warning: the 1-minute load exceeds the 2 cores" in busy.words()


@pytest.mark.skipif(not hasattr(os, "getloadavg"), reason="no load average on this system")
def test_the_machine_load_is_the_systems() -> None:
    found = machine_load()
    assert found is not None
    assert found.one == pytest.approx(os.getloadavg()[0], abs=0.5)  # it moves between the reads
    assert found.cores == len(os.sched_getaffinity(0))


def record(**speed: object) -> dict[str, object]:
    return {
        "seed": 0,
        "safetensors_bytes": 1_000_000,
        "export_dtype": "float32",
        "gguf": {"skipped": "x"},
        "speed": speed,
    }


def test_what_to_ship_gives_the_best_and_median_ratios_and_the_load() -> None:
    speed = {"threads": 2, "rounds": 5, "prompt": 300.0, "generation": 100.0,
             "source_prompt": 200.0, "source_generation": 80.0, "prompt_median": 250.0,
             "generation_median": 90.0, "source_prompt_median": 200.0,
             "source_generation_median": 100.0, "load": [2.5, 1.0, 0.5], "cores": 2}  # fmt: skip
    line = shipped_line(record(**speed))
    assert (
        f"llama.cpp prompt {300 / 200:.2f}x best, {250 / 200:.2f}x median, generation "
        f"{100 / 80:.2f}x best, {90 / 100:.2f}x median the source's"
    ) in line
    assert "2 threads, 5 rounds; load 2.50/1.00/0.50 on 2 cores (warning" in line


def test_a_record_from_before_the_median_reads_as_it_did() -> None:
    speed = {"threads": 2, "rounds": 3, "prompt": 300.0, "generation": 100.0,
             "source_prompt": 200.0, "source_generation": 80.0}  # fmt: skip
    line = shipped_line(record(**speed))
    assert "llama.cpp prompt 1.50x, generation 1.25x the source's (300 and 100.0 tok/s; " in line
    assert line.endswith("2 threads, best of 3)")
