"""Two `geospec prune` processes on one run directory: each unit is computed once (a unit another
process holds is waited for, then reused), the results are one process's, and a holder killed
with SIGKILL leaves no claim behind (docs/prune.md, "What it writes")."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from test_prune import invoke, prune_spec

from geospec.storage.digests import unsealed

pytestmark = [pytest.mark.torch, pytest.mark.usefixtures("one_torch_thread")]

#: `geospec prune ARGS` in which every unit computed is first written to LOG (the process's pid
#: and the unit), then waits until the file GATE exists: the test sees which process computes
#: what, and holds the first unit for as long as it needs to.
COUNTED = """
import os, sys, time
from pathlib import Path
import geospec.prune.study as study
from geospec.cli import main

log, gate = Path(sys.argv[1]), Path(sys.argv[2])
compute = study.pruned_unit

def counted(*args, **kwargs):
    with log.open("a") as out:
        out.write(f"{os.getpid()} {args[5].label}\\n")
    while not gate.exists():
        time.sleep(0.05)
    return compute(*args, **kwargs)

study.pruned_unit = counted
sys.argv = ["geospec", *sys.argv[3:]]
main()
"""

ARMS = [
    {"name": "uniform", "schedule": {"kind": "uniform"}},
    {"name": "flap", "schedule": {"kind": "flap"}},
]


def small_prune(directory: Path, arms: int, seeds: list[int]) -> Path:
    """test_prune's tiny checkpoint pruned to 1/2 by the first ``arms`` of :data:`ARMS`, nothing
    exported."""
    calibration = {"windows": 8, "seeds": seeds}
    return prune_spec(directory, arms=ARMS[:arms], keep=0.5, export=False, calibration=calibration)


#: Seconds a process may take to start torch, load the tiny checkpoint and prune it.
PATIENCE = 300.0


def counted_prune(spec: Path, log: Path, gate: Path, output: Path) -> subprocess.Popen[bytes]:
    """`geospec prune SPEC` in a process of its own, its units counted in ``log``."""
    command = [sys.executable, "-c", COUNTED, str(log), str(gate), "prune", str(spec)]
    environment = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    with output.open("wb") as out:
        return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=environment)


def wait_until(ready: Callable[[], bool], what: str, *processes: subprocess.Popen[bytes]) -> None:
    """Poll ``ready`` until it holds; fail (killing ``processes``) after :data:`PATIENCE`."""
    deadline = time.monotonic() + PATIENCE
    while not ready():
        if time.monotonic() > deadline or any(p.poll() is not None for p in processes):
            for process in processes:
                process.kill()
            pytest.fail(f"never saw {what}")
        time.sleep(0.1)


def finished(process: subprocess.Popen[bytes], output: Path) -> None:
    """Wait for ``process`` to exit 0 (killed, and the test failed, after :data:`PATIENCE`)."""
    try:
        status = process.wait(timeout=PATIENCE)
    except subprocess.TimeoutExpired:
        process.kill()
        pytest.fail(f"still running after {PATIENCE:g} s: {text(output)}")
    assert status == 0, text(output)


def text(path: Path) -> str:
    return path.read_text() if path.exists() else ""


def computed(log: Path) -> list[tuple[int, str]]:
    """(pid, unit) of every unit computation the log recorded."""
    lines = [line.split(" ", 1) for line in text(log).splitlines()]
    return [(int(pid), unit) for pid, unit in lines]


def prune_record(run: Path) -> dict[str, Any]:
    """prune.json without its seal and keys (which differ in another directory: the reference's
    key holds the checkpoint's path)."""
    record = dict(unsealed(json.loads((run / "prune.json").read_text())))
    record.pop("key")
    record.pop("arm_keys")
    return record


def test_two_prunes_on_one_run_directory_compute_each_unit_once(tmp_path: Path) -> None:
    """The second prune reaches the unit the first is computing, says so (naming the first's
    pid) and waits; both finish, no unit is computed twice, and prune.json is what one process
    alone writes."""
    spec = small_prune(tmp_path, 2, [0, 1])
    log, gate = tmp_path / "computed.txt", tmp_path / "gate"
    first = counted_prune(spec, log, gate, tmp_path / "first.txt")
    wait_until(lambda: bool(computed(log)), "the first prune hold a unit", first)
    second = counted_prune(spec, log, gate, tmp_path / "second.txt")
    waiting = "waiting for unit uniform@0.5 (seed 0): another geospec prune (pid"
    wait_until(lambda: waiting in text(tmp_path / "second.txt"), "the wait", first, second)
    assert f"(pid {first.pid}) is computing it" in text(tmp_path / "second.txt")
    gate.touch()
    finished(first, tmp_path / "first.txt")
    finished(second, tmp_path / "second.txt")

    units = Counter(unit for _, unit in computed(log))
    assert sorted(units) == [f"{arm}@0.5 (seed {seed})" for arm in ("flap", "uniform")
                             for seed in (0, 1)]  # fmt: skip
    assert set(units.values()) == {1}, units

    alone = tmp_path / "alone"
    alone.mkdir()
    invoke("prune", str(small_prune(alone, 2, [0, 1])))
    assert prune_record(tmp_path / "run") == prune_record(alone / "run")


def test_a_killed_prune_leaves_its_unit_to_the_next(tmp_path: Path) -> None:
    """A prune killed with SIGKILL while it computes a unit: the kernel drops its claim, so the
    next prune computes that unit without waiting."""
    spec = small_prune(tmp_path, 1, [0])
    log, gate = tmp_path / "computed.txt", tmp_path / "gate"
    holder = counted_prune(spec, log, gate, tmp_path / "holder.txt")
    wait_until(lambda: bool(computed(log)), "the prune hold its unit", holder)
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    assert not (tmp_path / "run" / "prune.json").exists()

    gate.touch()
    next_output = tmp_path / "next.txt"
    after = counted_prune(spec, log, gate, next_output)
    finished(after, next_output)
    assert "waiting for unit" not in text(next_output)
    assert [unit for pid, unit in computed(log) if pid == after.pid] == ["uniform@0.5 (seed 0)"]
    assert (tmp_path / "run" / "prune.json").exists()
