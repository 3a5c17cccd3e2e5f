"""The slurm launcher against a real Slurm cluster: `nox -s slurm` starts a one-node cluster on
this machine (scripts/slurm_local.sh) and runs this module with GEOSPEC_SLURM_TESTS=1.

A tiny study is submitted (`geospec run` returns after sbatch), one of its runs is preempted
with `scancel --signal USR1`, requeued through submitit and resumed; the report job builds the
report when the array has ended; every run ends with the serial run's loss and weights.
Without GEOSPEC_SLURM_TESTS=1 the module is skipped: it submits jobs to whatever cluster the
Slurm clients reach, so it never runs by accident on a login node.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from small_spec import small_spec

from geospec.cli import cli
from geospec.storage.locks import claim_holder

pytestmark = [
    pytest.mark.slurm,
    pytest.mark.torch,
    pytest.mark.skipif(
        os.environ.get("GEOSPEC_SLURM_TESTS") != "1",
        reason="needs a Slurm cluster to submit to (nox -s slurm starts one)",
    ),
]

STEPS = 150
#: The preempted run's only checkpoint is the signal's (checkpoint_interval is never reached).
SPEC = small_spec(
    "slurm-test",
    {"steps": STEPS, "seeds": [0, 1], "checkpoint_interval": 1000, "log_interval": 1},
)
LAUNCH = '\n[launch]\nkind = "slurm"\ncpus_per_task = 1\nminutes = 30\n'
RUNS = ["uniform/seed-0", "cosine/seed-0", "uniform/seed-1", "cosine/seed-1"]
PREEMPTED = "cosine/seed-1"


def geospec_run(spec: Path, out: Path) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "geospec", "run", str(spec), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return " ".join((done.stderr + done.stdout).split())  # the stages' lines, then the report


def queued(name: str) -> list[str]:
    found = subprocess.run(
        ["squeue", "--noheader", "--name", name, "--format", "%i %T"],
        capture_output=True,
        text=True,
        check=True,
    )
    return found.stdout.splitlines()


def wait_until(condition: object, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"waited {seconds:.0f} s for {what}"
        time.sleep(0.05)


def logged_steps(directory: Path) -> int:
    try:
        return (directory / "metrics.jsonl").read_text().count('"loss"')
    except FileNotFoundError:
        return 0


def test_a_study_on_slurm_with_a_preempted_run_ends_with_the_serial_results(
    tmp_path: Path,
) -> None:
    spec = tmp_path / "spec.toml"
    spec.write_text(SPEC + LAUNCH)
    out = tmp_path / "run"
    said = geospec_run(spec, out)
    array = re.search(r"submitted as job array (\d+)", said)
    report = re.search(r"the report follows in job (\d+)", said)
    assert array and report, said
    assert f"geospec status {out}" in said and f"squeue -j {array[1]},{report[1]}" in said
    jobs = dict(re.findall(r"(\w+/seed-\d) = (\d+_\d+)", said))
    assert sorted(jobs) == sorted(RUNS)

    again = geospec_run(spec, out)  # while the jobs are queued: nothing is submitted twice
    assert "still queued or running" in again and "nothing submitted" in again
    status = CliRunner().invoke(cli, ["status", str(out), "--json"])
    for entry in json.loads(status.output)["runs"]:  # queued ones name their job array
        assert entry["state"] in ("submitted", "running", "done"), entry
        assert entry["state"] != "submitted" or array[1] in entry["job"], entry

    target = out / "arms" / PREEMPTED
    wait_until(
        lambda: claim_holder(target) is not None and logged_steps(target) >= 3,
        300,
        f"{PREEMPTED} to train",
    )
    subprocess.run(["scancel", "--signal", "USR1", jobs[PREEMPTED]], check=True)
    name = re.search(r"squeue --name (\S+)", again)
    assert name, again
    wait_until(
        lambda: not queued(name[1]) and not queued(f"{name[1]}-report"),
        600,
        "the array and the report job to end",
    )

    assert (out / "report.md").exists(), "the report job built no report"
    logs = out / "launch" / "slurm"
    log = " ".join(p.read_text() for p in logs.glob(f"{jobs[PREEMPTED]}_*_log.*"))
    assert "stopped by SIGUSR1" in log and "asking submitit to requeue it" in log, log[-2000:]

    straight = tmp_path / "straight"
    (tmp_path / "serial").mkdir()
    serial_spec = tmp_path / "serial" / "spec.toml"
    serial_spec.write_text(SPEC)
    result = CliRunner().invoke(cli, ["run", str(serial_spec), "--out", str(straight)])
    assert result.exit_code == 0, result.output
    for run in RUNS:
        ours = json.loads((out / "arms" / run / "result.json").read_text())
        alone = json.loads((straight / "arms" / run / "result.json").read_text())
        assert ours["final_val_loss"] == alone["final_val_loss"], run
        assert ours["checksums"] == alone["checksums"], run
    rows = [json.loads(line) for line in (target / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "loss" in r] == list(range(1, STEPS + 1))
