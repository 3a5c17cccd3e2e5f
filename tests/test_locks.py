"""Claims on training directories (geospec.storage.locks): exclusive, kept across emptying, released
by the kernel when the holder dies."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

from geospec.storage.locks import claim, claim_holder, file_lock

HOLD = """
import sys, time
from pathlib import Path
from geospec.storage.locks import claim
with claim(Path(sys.argv[1])) as granted:
    print(granted, flush=True)
    time.sleep(600)
"""


def test_a_claim_is_exclusive_until_released(tmp_path: Path) -> None:
    run = tmp_path / "arms" / "cosine" / "seed-0"
    with claim(run) as first, claim(run) as second:
        assert first and not second
    with claim(run) as again:
        assert again


def test_emptying_the_directory_keeps_the_claim(tmp_path: Path) -> None:
    run = tmp_path / "seed-0"
    run.mkdir()
    with claim(run) as granted:
        assert granted
        shutil.rmtree(run)  # what starting a run over does
        with claim(run) as other:
            assert not other


def test_the_claim_of_a_killed_process_is_released(tmp_path: Path) -> None:
    run = tmp_path / "seed-0"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(run)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "True"
        with claim(run) as granted:
            assert not granted
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    with claim(run) as granted:
        assert granted


def test_a_waiting_claim_is_told_its_holder_and_granted_once_it_is_gone(tmp_path: Path) -> None:
    """claim(directory, waiting=...) on a claim another process holds: ``waiting`` is told the
    holder's record (its pid), and the claim is granted when the holder is gone (killed here,
    by ``waiting`` itself), its record then this process's."""
    run = tmp_path / "seed-0"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(run)], stdout=subprocess.PIPE, text=True
    )
    told: list[object] = []

    def waiting(record: dict[str, object] | None) -> None:
        told.append(record)
        holder.send_signal(signal.SIGKILL)

    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "True"
        with claim(run, waiting=waiting) as granted:
            assert granted
            mine = claim_holder(run)
            assert mine is not None and mine["pid"] == os.getpid()
    finally:
        holder.kill()
        holder.wait()
    assert len(told) == 1 and isinstance(told[0], dict) and told[0]["pid"] == holder.pid
    assert claim_holder(run) is None  # emptied on release


def test_a_waiting_lock_is_always_granted(tmp_path: Path) -> None:
    with file_lock(tmp_path / ".cache.lock") as granted:
        assert granted
