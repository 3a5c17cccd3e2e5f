"""Launchers (the ``[launch]`` section): wherever the arm-seed runs are trained, each is trained
once and gives exactly the result of the serial run; a failed run is reported with its error."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, ClassVar, Literal

import pytest
from click.testing import CliRunner
from small_spec import small_spec

from geospec import hookimpl
from geospec.cli import cli
from geospec.errors import OutOfSpace, UsageError
from geospec.kinds import Launch, Launcher, RunOutcome
from geospec.pipeline.run_dir import read_failure, record_failure
from geospec.plugin import PluginParams, Register
from geospec.rundir.layout import FAILURE_FILE
from geospec.storage.locks import claim_path
from geospec.testing import registered

pytestmark = pytest.mark.torch

#: The [train] settings of this file's study (tests/small_spec.py has the rest).
TRAIN = {"steps": 10, "seeds": [0, 1], "checkpoint_interval": 5}

RUNS = ["uniform/seed-0", "uniform/seed-1", "cosine/seed-0", "cosine/seed-1"]


def write(directory: Path, launch: str = "", **train: Any) -> Path:
    """The study's spec in ``directory`` with ``launch`` (a [launch] table, as TOML text) and
    ``train`` changing its [train] settings."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "spec.toml"
    path.write_text(f"{small_spec('launch-test', TRAIN | train)}\n{launch}\n")
    return path


def run(spec: Path, out: Path) -> str:
    result = CliRunner().invoke(cli, ["run", str(spec), "--out", str(out)])
    assert result.exit_code == 0, result.output
    return result.output


def results(out: Path) -> dict[str, dict[str, object]]:
    return {name: json.loads((out / "arms" / name / "result.json").read_text()) for name in RUNS}


@pytest.fixture(scope="module")
def serial(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The study trained by the default (local) launcher."""
    directory = tmp_path_factory.mktemp("serial")
    out = directory / "run"
    run(write(directory), out)
    return out


@pytest.mark.slow  # two worker processes start torch: ~30 s on 2 cores
def test_pool_workers_give_exactly_the_serial_results(serial: Path, tmp_path: Path) -> None:
    launch = '[launch]\nkind = "pool"\nworkers = 2\nthreads = 1'
    out = tmp_path / "run"
    output = run(write(tmp_path, launch), out)
    assert "on 2 pool workers" in output
    pooled, alone = results(out), results(serial)
    for name in RUNS:
        assert pooled[name]["final_val_loss"] == alone[name]["final_val_loss"], name
        assert pooled[name]["checksums"] == alone[name]["checksums"], name  # same weights
    logs = sorted(p.name for p in (out / "launch").iterdir())
    assert logs == ["pool-0.log", "pool-1.log"]
    # both workers trained (the reference is reused for uniform/seed-0, so three runs train)
    assert all("step 10/10" in (out / "launch" / log).read_text() for log in logs)


class ReverseParams(PluginParams):
    kind: Literal["reverse"] = "reverse"


class Reverse(Launcher):
    """A third-party launcher: trains the runs last to first, each through a pickled copy of
    the trainer (what a launcher that ships runs to other processes does)."""

    Params = ReverseParams
    seen: ClassVar[list[str]] = []

    def launch(self, launch: Launch) -> list[RunOutcome]:
        shipped = pickle.loads(pickle.dumps(launch.trainer))
        Reverse.seen = [r.name for r in launch.runs]
        return [shipped(r) for r in reversed(launch.runs)]


class ReversePlugin:
    @hookimpl
    def geospec_register_launchers(self, register: Register) -> None:
        register(Reverse)


def test_a_launcher_plugin_gets_every_run_and_its_order_changes_nothing(
    serial: Path, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    with registered(ReversePlugin(), name="reverse"):
        run(write(tmp_path, '[launch]\nkind = "reverse"'), out)
    assert Reverse.seen == ["uniform/seed-0", "cosine/seed-0", "uniform/seed-1", "cosine/seed-1"]
    ours, alone = results(out), results(serial)
    assert all(ours[n]["final_val_loss"] == alone[n]["final_val_loss"] for n in RUNS)


def damaged_copy(serial: Path, out: Path) -> None:
    """The finished study with uniform/seed-1 to finish again and cosine/seed-0 holding the
    checkpoint of seed 1 (a run of other settings: training it is an error)."""
    shutil.copytree(serial, out)
    (out / "arms" / "uniform" / "seed-1" / "result.json").unlink()
    wrong, right = out / "arms" / "cosine" / "seed-1", out / "arms" / "cosine" / "seed-0"
    (right / "result.json").unlink()
    for name in ("trainer_state.pt", "model.safetensors", "config.json"):
        shutil.copy2(wrong / name, right / name)


@pytest.mark.slow
def test_a_failed_pool_run_is_reported_and_recorded_and_the_others_finish(
    serial: Path, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    damaged_copy(serial, out)
    spec = write(tmp_path, '[launch]\nkind = "pool"\nworkers = 2\nthreads = 1')
    result = CliRunner().invoke(cli, ["run", str(spec), "--out", str(out)])
    # the one failure is the user's to fix (a UsageError in the worker), so the run exits 2 as
    # the same error does under the local launcher, not 1 as a crash would
    assert result.exit_code == 2, result.output
    said = " ".join(result.output.split())  # the console wraps long lines
    assert "1 run(s) failed: cosine/seed-0:" in said
    assert "different settings (seed)" in said
    failure = read_failure(out / "arms" / "cosine" / "seed-0")
    assert failure is not None and "different settings (seed)" in failure["error"]
    assert failure["type"] == "UsageError" and failure["exit_code"] == 2
    assert (out / "arms" / "uniform" / "seed-1" / "result.json").exists()  # the other finished
    assert not (out / "arms" / "uniform" / "seed-1" / FAILURE_FILE).exists()


HOLD = """
import sys, time
from pathlib import Path
from geospec.storage.locks import claim
with claim(Path(sys.argv[1])) as granted:
    print(granted, flush=True)
    time.sleep(600)
"""


def status_of(out: Path) -> dict[str, Any]:
    result = CliRunner().invoke(cli, ["status", str(out), "--json"])
    assert result.exit_code == 0, result.output
    found: dict[str, Any] = json.loads(result.output)
    return found


def by_name(found: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {f"{r['arm']}/seed-{r['seed']}": r for r in found["runs"]}


def test_status_of_a_finished_run(serial: Path) -> None:
    found = status_of(serial)
    # measure = [] and [diagnose] off: nothing reads the clouds, so nothing was probed
    assert {s["name"]: s["state"] for s in found["stages"]} == {
        "reference": "done", "probe": "skipped", "measure": "done", "diagnose": "skipped",
        "demand": "skipped", "solve": "done", "prune": "skipped", "train": "done",
        "eval": "skipped", "report": "done",
    }  # fmt: skip
    runs = by_name(found)
    assert list(runs) == RUNS[:1] + RUNS[2:3] + RUNS[1:2] + RUNS[3:]  # seed-major
    for name, result in results(serial).items():
        assert runs[name]["state"] == "done"
        assert runs[name]["final_loss"] == result["final_val_loss"]
    assert found["counts"] == {
        "done": 4, "running": 0, "stale": 0, "failed": 0, "submitted": 0, "pending": 0
    }  # fmt: skip
    assert found["notes"] == [] and found["seconds_left"] is None  # nothing left to train
    assert all(r["evaluated"] is None and r["job"] is None for r in found["runs"])  # no [eval]
    table = CliRunner().invoke(cli, ["status", str(serial)])
    assert table.exit_code == 0 and "final loss" in table.output
    # each stage's state is in words, not colour alone (CliRunner captures no colour)
    assert "reference ✓" in table.output and "diagnose (skipped)" in table.output


def test_status_of_a_run_in_progress_a_failed_run_and_a_stale_claim(
    serial: Path, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    shutil.copytree(serial, out)
    for name in RUNS[1:]:
        (out / "arms" / name / "result.json").unlink()
    running = out / "arms" / "cosine" / "seed-0"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(running)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "True"
        record_failure(out / "arms" / "uniform" / "seed-1", UsageError("boom\nthe last line"))
        found = status_of(out)
        runs = by_name(found)
        # one run pending, the running one at its last logged step: one finished run's time left
        assert found["seconds_left"] == pytest.approx(runs["uniform/seed-0"]["wall_seconds"])
        assert runs["uniform/seed-0"]["state"] == "done"
        now = runs["cosine/seed-0"]
        assert now["state"] == "running"
        assert now["holder"]["pid"] == holder.pid and now["holder"]["host"] == socket.gethostname()
        last = [json.loads(line) for line in (running / "metrics.jsonl").read_text().splitlines()]
        assert now["step"] == [r for r in last if "loss" in r][-1]["step"]
        assert runs["uniform/seed-1"]["state"] == "failed"
        assert runs["uniform/seed-1"]["error"] == "the last line"
        assert runs["cosine/seed-1"]["state"] == "pending"
    finally:
        holder.send_signal(signal.SIGKILL)  # dies holding the claim: its record stays behind
        holder.wait()
    runs = by_name(status_of(out))
    assert runs["cosine/seed-0"]["state"] == "stale"
    table = CliRunner().invoke(cli, ["status", str(out)])
    assert "its holder died" in " ".join(table.output.split())


class QueueParams(PluginParams):
    kind: Literal["queue"] = "queue"


class Queue(Launcher):
    """A scheduler that queues every run it is given and returns (as the slurm launcher does
    without `wait`); its job ids are the runs' positions."""

    Params = QueueParams

    def launch(self, launch: Launch) -> list[RunOutcome]:
        return [RunOutcome(r, "submitted", f"job 7_{i}") for i, r in enumerate(launch.runs)]


class QueuePlugin:
    @hookimpl
    def geospec_register_launchers(self, register: Register) -> None:
        register(Queue)


def test_status_shows_the_runs_queued_on_a_scheduler_until_they_are_trained(
    serial: Path, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    shutil.copytree(serial, out)
    for name in ("uniform/seed-1", "cosine/seed-1"):
        (out / "arms" / name / "result.json").unlink()
    with registered(QueuePlugin(), name="queue"):
        run(write(tmp_path, '[launch]\nkind = "queue"'), out)
    found = status_of(out)
    runs = by_name(found)
    queued = {n: r["job"] for n, r in runs.items() if r["state"] == "submitted"}
    assert queued == {"uniform/seed-1": "job 7_0", "cosine/seed-1": "job 7_1"}  # seed-major
    assert found["counts"]["submitted"] == 2 and found["counts"]["done"] == 2
    assert all(runs[n]["since"] is not None for n in queued)
    table = " ".join(CliRunner().invoke(cli, ["status", str(out)]).output.split())
    assert "queued: job 7_0" in table and "queued: job 7_1" in table
    record = out / "launch" / "submitted.json"
    record.write_text("{damaged")  # fault injection: said, never a traceback
    found = status_of(out)
    assert found["counts"]["submitted"] == 0 and found["counts"]["pending"] == 2
    [note] = found["notes"]
    assert "launch/submitted.json cannot be read" in note
    assert "note: launch/submitted.json" in CliRunner().invoke(cli, ["status", str(out)]).output
    run(write(tmp_path), out)  # trained here: no run is queued any more
    assert json.loads(record.read_text())["runs"] == {}
    found = status_of(out)
    assert found["counts"]["done"] == 4 and found["notes"] == []


def test_damaged_claim_and_failure_records_are_said_and_the_run_trains_over_them(
    serial: Path, tmp_path: Path
) -> None:
    """Fault injection for the two records this adds to a run directory."""
    out = tmp_path / "run"
    shutil.copytree(serial, out)
    target = out / "arms" / "cosine" / "seed-1"
    (target / "result.json").unlink()
    claim_path(target).write_bytes(b"\x00garbage{")
    record_failure(target, RuntimeError("old"))
    failure = json.loads((target / FAILURE_FILE).read_text())
    (target / FAILURE_FILE).write_text(json.dumps({**failure, "error": "edited"}))
    runs = by_name(status_of(out))
    assert runs["cosine/seed-1"]["state"] == "failed"
    assert "damaged" in runs["cosine/seed-1"]["error"]  # the edit broke its seal
    claim_path(target).write_text("{not json")
    (target / FAILURE_FILE).unlink()
    runs = by_name(status_of(out))
    assert runs["cosine/seed-1"]["state"] == "pending"
    assert runs["cosine/seed-1"]["error"] == "the claim's holder record is unreadable"
    record_failure(target, RuntimeError("old"))
    (target / FAILURE_FILE).write_bytes(b"\xff\xfe")
    run(write(tmp_path), out)  # trains it: the lock's content and the old failure do not matter
    runs = by_name(status_of(out))
    assert runs["cosine/seed-1"]["state"] == "done"
    assert not (target / FAILURE_FILE).exists()
    assert claim_path(target).read_text() == ""  # released: no holder recorded
    ours, alone = results(out), results(serial)
    assert ours["cosine/seed-1"]["final_val_loss"] == alone["cosine/seed-1"]["final_val_loss"]


# The slurm launcher (plugins/slurm.py) through submitit. The default suite runs its jobs with
# submitit's local executor; tests/test_slurm_cluster.py (nox -s slurm) runs them on real Slurm.

SLURM_LOCAL = '[launch]\nkind = "slurm"\ncluster = "local"\ncpus_per_task = 1'


def test_slurm_jobs_through_submitit_give_exactly_the_serial_results(
    serial: Path, tmp_path: Path
) -> None:
    pytest.importorskip("submitit")
    out = tmp_path / "run"
    shutil.copytree(serial, out)
    shutil.rmtree(out / "arms" / "cosine" / "seed-0")  # one job (each starts torch: ~10 s)
    output = run(write(tmp_path, SLURM_LOCAL), out)
    said = " ".join(output.split())
    assert "train: 1 run(s) in jobs" in said and "waiting for them" in said
    assert "report: " in said  # the report is built when the jobs have ended
    ours, alone = results(out), results(serial)
    for name in RUNS:
        assert ours[name]["final_val_loss"] == alone[name]["final_val_loss"], name
        assert ours[name]["checksums"] == alone[name]["checksums"], name  # same weights
    logs = out / "launch" / "slurm"
    trained = [p.read_text() for p in logs.glob("*_log.err")]  # training logs to stderr
    assert len(trained) == 1 and "step 10/10" in trained[0]


def test_the_report_job_submits_nothing_and_reports_unfinished_runs_as_failed(
    serial: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the job after the array runs (geospec run with GEOSPEC_SLURM_FINISHING=1): a run
    whose job failed is reported with its recorded error, a run whose job left no record is
    reported too, and nothing is submitted again."""
    from geospec_plugins.slurm import FINISHING

    out = tmp_path / "run"
    shutil.copytree(serial, out)
    (out / "arms" / "cosine" / "seed-0" / "result.json").unlink()
    record_failure(out / "arms" / "cosine" / "seed-0", RuntimeError("CUDA out of memory\nOOM"))
    shutil.rmtree(out / "arms" / "uniform" / "seed-1")
    monkeypatch.setenv(FINISHING, "1")
    spec = write(tmp_path, '[launch]\nkind = "slurm"\npartition = "nowhere"')
    result = CliRunner().invoke(cli, ["run", str(spec), "--out", str(out)])
    assert result.exit_code == 1, result.output
    said = " ".join(result.output.split())
    assert "train: 2 run(s) failed: cosine/seed-0: OOM; uniform/seed-1: its job ended" in said
    assert f"without a result (logs in {out / 'launch' / 'slurm'})" in said
    assert not (out / "launch").exists()  # nothing was submitted
    assert not (out / "arms" / "uniform" / "seed-1").exists()  # nor trained here


def test_a_job_that_ran_out_of_disk_ends_the_report_job_with_exit_status_2(
    serial: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run whose every failure is the machine's or the input's (a full disk: free space and
    run again) exits 2 like the same error in one process, not 1 like a crash; its recorded
    exit status is what says so."""
    from geospec_plugins.slurm import FINISHING

    out = tmp_path / "run"
    shutil.copytree(serial, out)
    target = out / "arms" / "cosine" / "seed-0"
    (target / "result.json").unlink()
    record_failure(target, OutOfSpace(str(target), "checkpoint.pt", "0 B"))
    monkeypatch.setenv(FINISHING, "1")
    spec = write(tmp_path, '[launch]\nkind = "slurm"\npartition = "nowhere"')
    result = CliRunner().invoke(cli, ["run", str(spec), "--out", str(out)])
    assert result.exit_code == 2, result.output
    assert "out of disk space" in " ".join(result.output.split())
    failure = read_failure(target)
    assert failure is not None and failure["exit_code"] == 2


@pytest.mark.parametrize(
    ("launch", "problem"),
    [
        ('sbatch = { time = "1:00" }', "launch.sbatch: 'time' is set by the launcher: use its"),
        ('sbatch = { "--qos" = "high" }', "launch.sbatch: '--qos' is not an sbatch option name"),
        ('sbatch = { array = "0-3" }', "launch.sbatch: 'array' is set by the launcher for every"),
        ('cluster = "local"\nnodes_per_run = 2', 'nodes_per_run = 2 needs cluster = "slurm"'),
        ("gpus_per_run = -1", "launch.gpus_per_run: Input should be greater than or equal to 0"),
    ],
)
def test_slurm_launcher_parameters_are_checked_like_any_plugin_table(
    tmp_path: Path, launch: str, problem: str
) -> None:
    spec = write(tmp_path, f'[launch]\nkind = "slurm"\n{launch}')
    result = CliRunner().invoke(cli, ["validate", str(spec)])
    assert result.exit_code == 2, result.output
    assert problem in " ".join(result.output.split())


PREEMPTED_STEPS = 200


@pytest.mark.slow  # a job process resumed by submitit and an uninterrupted study: ~40 s
def test_a_preempted_slurm_job_is_requeued_by_submitit_and_ends_with_the_uninterrupted_loss(
    tmp_path: Path,
) -> None:
    pytest.importorskip("submitit")
    from geospec.storage.locks import claim_holder

    def spec(directory: Path, launch: str) -> Path:
        return write(
            directory, launch, seeds=[0], steps=PREEMPTED_STEPS, log_interval=1,
            checkpoint_interval=1000,
        )  # fmt: skip

    straight = tmp_path / "straight"
    run(spec(tmp_path / "a", ""), straight)
    out = tmp_path / "run"
    target = out / "arms" / "cosine" / "seed-0"

    def preempt() -> None:  # SIGUSR1 to the job's process once it trains (its claim says who)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            holder = claim_holder(target)
            metrics = target / "metrics.jsonl"
            rows = metrics.read_text() if holder and metrics.exists() else ""
            if holder and rows.count('"loss"') >= 3:
                os.kill(holder["pid"], signal.SIGUSR1)
                return
            time.sleep(0.01)

    signaller = threading.Thread(target=preempt)
    signaller.start()
    run(spec(tmp_path / "b", SLURM_LOCAL), out)
    signaller.join()
    log = " ".join(p.read_text() for p in (out / "launch" / "slurm").glob("*_log.*"))
    assert "stopped by SIGUSR1" in log and "asking submitit to requeue it" in log
    ours = json.loads((target / "result.json").read_text())
    alone = json.loads((straight / "arms" / "cosine" / "seed-0" / "result.json").read_text())
    assert ours["final_val_loss"] == alone["final_val_loss"]
    assert ours["checksums"] == alone["checksums"]
    rows = [json.loads(line) for line in (target / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "loss" in r] == list(range(1, PREEMPTED_STEPS + 1))


class LaterParams(PluginParams):
    kind: Literal["later"] = "later"


class Later(Launcher):
    """A launcher that only submits: every run is left to a scheduler."""

    Params = LaterParams

    def launch(self, launch: Launch) -> list[RunOutcome]:
        return [RunOutcome(run, "submitted", "job 1") for run in launch.runs]


class LaterPlugin:
    @hookimpl
    def geospec_register_launchers(self, register: Register) -> None:
        register(Later)


def test_a_report_of_submitted_runs_is_built_again_once_they_have_finished(
    serial: Path, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    shutil.copytree(serial, out)
    shutil.rmtree(out / "arms" / "cosine" / "seed-1")
    with registered(LaterPlugin(), name="later"):
        output = run(write(tmp_path, '[launch]\nkind = "later"'), out)
    assert "1 run(s) were handed to a scheduler; the report below leaves them out" in " ".join(
        output.split()
    )
    seeds = json.loads((out / "results.json").read_text())["arms"]["cosine"]["val_loss"]["seeds"]
    assert list(seeds) == ["0"]  # the report of the runs finished so far
    shutil.copytree(serial / "arms" / "cosine" / "seed-1", out / "arms" / "cosine" / "seed-1")
    output = run(write(tmp_path), out)  # the job has finished it: nothing to train, a new report
    assert "every arm and seed is trained (skipped)" in output
    seeds = json.loads((out / "results.json").read_text())["arms"]["cosine"]["val_loss"]["seeds"]
    assert seeds == {"0": results(serial)["cosine/seed-0"]["final_val_loss"],
                     "1": results(serial)["cosine/seed-1"]["final_val_loss"]}  # fmt: skip
    assert "nothing to do" in run(write(tmp_path), out)  # and now it is recorded


@pytest.mark.slow  # two job processes in one DDP group: ~30 s on 2 cores
def test_a_slurm_run_of_several_processes_trains_as_one_ddp_group(
    serial: Path, tmp_path: Path
) -> None:
    """gpus_per_run = 2 on a machine without GPUs: two tasks joined by submitit's torchrun
    variables in one gloo group; the same global batch, so the serial run up to rounding."""
    pytest.importorskip("submitit")
    out = tmp_path / "run"
    shutil.copytree(serial, out)
    shutil.rmtree(out / "arms" / "cosine" / "seed-1")
    run(write(tmp_path, SLURM_LOCAL + "\ngpus_per_run = 2"), out)
    ours, alone = results(out)["cosine/seed-1"], results(serial)["cosine/seed-1"]
    assert abs(float(ours["final_val_loss"]) - float(alone["final_val_loss"])) < 1e-5  # type: ignore[arg-type]
    logs = sorted((out / "launch" / "slurm").glob("*_log.out"))
    assert len(logs) == 2  # one per process
    assert "global_rank=1(2)" in logs[1].read_text()


def test_the_slurm_launcher_without_slurm_says_so_in_one_line(
    serial: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "run"
    shutil.copytree(serial, out)
    shutil.rmtree(out / "arms" / "cosine" / "seed-1")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # no squeue, no sbatch
    spec = write(tmp_path, '[launch]\nkind = "slurm"')
    result = CliRunner().invoke(cli, ["run", str(spec), "--out", str(out)])
    assert result.exit_code == 2, result.output
    assert "launch: squeue is not on PATH: the slurm launcher submits from a machine" in " ".join(
        result.output.split()
    )
    assert not (out / "launch").exists()


def test_the_sbatch_script_of_the_440m_spec_as_docs_cluster_md_sets_it_up(tmp_path: Path) -> None:
    """`geospec rehearse SPEC --job-script` renders, through submitit, the job array the slurm
    launcher submits for specs/440m.toml with docs/cluster.md's [launch] table; no cluster."""
    pytest.importorskip("submitit")
    root = Path(__file__).resolve().parents[1]
    docs = (root / "docs" / "cluster.md").read_text()
    launch = docs.split("cat >> 440m-slurm.toml <<'EOF'\n", 1)[1].split("\nEOF\n", 1)[0]
    spec = (
        (root / "specs" / "440m.toml")
        .read_text()
        .replace('out = "runs/440m"', f'out = "{tmp_path / "runs" / "440m"}"')
    )
    path = tmp_path / "440m-slurm.toml"
    path.write_text(spec + launch + "\n")
    result = CliRunner().invoke(cli, ["rehearse", str(path), "--job-script"])
    assert result.exit_code == 0, result.output
    script = result.output
    flags = {line.split("=", 1)[0]: line.partition("=")[2] for line in script.splitlines()}
    folder = tmp_path / "runs" / "440m" / "launch" / "slurm"
    expected = {
        "#SBATCH --array": "0-24%25",  # 5 arms x 5 seeds, all at once (parallel is 256)
        "#SBATCH --nodes": "1",
        "#SBATCH --gpus-per-node": "8",
        "#SBATCH --ntasks-per-node": "8",  # one process per GPU
        "#SBATCH --cpus-per-task": "8",
        "#SBATCH --time": "720",
        "#SBATCH --partition": "gpu",
        "#SBATCH --account": "my-project",
        "#SBATCH --mem": "0",
        "#SBATCH --signal": "USR1@120",  # the checkpoint warning before the time limit
        "#SBATCH --output": f"{folder}/%A_%a_0_log.out",
    }
    assert {flag: flags.get(flag) for flag in expected} == expected
    assert "#SBATCH --exclusive" in script.splitlines()
    assert flags["#SBATCH --job-name"].startswith("geospec-440m-")
    lines = script.splitlines()
    setup, srun = lines.index("source .venv/bin/activate"), len(lines) - 1
    assert lines[srun].startswith("srun ") and setup < srun
    assert lines[srun].endswith(f"-m submitit.core._submit {folder}")
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)  # valid shell
    assert not (tmp_path / "runs").exists()  # nothing written, nothing submitted


def test_a_launcher_without_a_job_script_says_so(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["rehearse", str(write(tmp_path)), "--job-script"])
    assert result.exit_code == 2
    assert "launch: the 'local' launcher submits no job script" in result.output
