"""Builtin launchers: where the train stage's arm-seed runs are trained.

- ``local``: one run after another in this process (under torchrun, every run with DDP across
  all processes); what geospec always did.
- ``pool``: N worker processes on this machine, each training the next run nobody has taken,
  each pinned to its share of the hardware: ``threads`` CPU threads, or one GPU
  (``CUDA_VISIBLE_DEVICES``) each with ``gpus = true``. Small models gain most: one run per
  core or GPU wastes nothing on communication.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import queue
import signal
import sys
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from geospec import hookimpl
from geospec.errors import UsageError
from geospec.kinds import Launch, Launcher, RunOutcome, RunTrainer, TrainingRun
from geospec.plugin import PluginParams, Register


class Local(Launcher):
    """Every run in this process, one after another (a failure stops the stage at once)."""

    under_torchrun = True

    class Params(PluginParams):
        kind: Literal["local"] = "local"

    def launch(self, launch: Launch) -> list[RunOutcome]:
        return [launch.trainer(run) for run in launch.runs]


class PoolParams(PluginParams):
    kind: Literal["pool"] = "pool"
    workers: int = Field(2, ge=1, le=4096)
    """Worker processes, each training one run at a time."""
    threads: int | None = Field(None, ge=1, le=4096)
    """torch CPU threads per worker (default: this machine's cores divided among the workers)."""
    gpus: bool = False
    """One GPU per worker: worker i sees only the i-th visible GPU (CUDA_VISIBLE_DEVICES)."""


class Pool(Launcher):
    """N worker processes on this machine; each takes the next run nobody has taken. A failed
    run does not stop the others; its error is reported with them at the end. Each worker's
    output goes to ``launch/pool-<i>.log`` in the run directory."""

    Params = PoolParams
    params: PoolParams

    def launch(self, launch: Launch) -> list[RunOutcome]:
        params = self.params
        workers = min(params.workers, len(launch.runs))
        if workers == 0:
            return []
        gpus = _gpu_ids(params.workers) if params.gpus else None
        threads = params.threads or max(1, (os.cpu_count() or 1) // workers)
        logs = launch.run_dir / "launch"
        logs.mkdir(parents=True, exist_ok=True)
        spawn = multiprocessing.get_context("spawn")  # no torch state inherited from the parent
        jobs: Any = spawn.Queue()
        events: Any = spawn.Queue()
        for index in range(len(launch.runs)):
            jobs.put(index)
        for _ in range(workers):
            jobs.put(None)
        processes = []
        for worker in range(workers):
            env = {"OMP_NUM_THREADS": str(threads)}
            if gpus is not None:
                env["CUDA_VISIBLE_DEVICES"] = gpus[worker]
            process = spawn.Process(
                target=_work,
                args=(launch.trainer, launch.runs, jobs, events, env, threads, worker),
                kwargs={"log": logs / f"pool-{worker}.log"},
                name=f"geospec-pool-{worker}",
            )
            process.start()
            processes.append(process)
        launch.say(
            f"train: {len(launch.runs)} run(s) on {workers} pool workers "
            f"({'one GPU' if gpus else f'{threads} CPU thread(s)'} each; logs in {logs})"
        )
        forwarded = _forward_signals([p.pid for p in processes if p.pid is not None])
        try:
            return _collect(launch, processes, events)
        finally:
            _restore(forwarded)
            for process in processes:
                process.join(timeout=60)
                if process.is_alive():  # pragma: no cover - a worker stuck past its last run
                    process.terminate()


def _gpu_ids(workers: int) -> list[str]:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = [d.strip() for d in visible.split(",") if d.strip()] if visible else []
    if not visible:
        ids = [str(i) for i in range(workers)]
    if len(ids) < workers:
        raise UsageError(
            f"launch.workers = {workers} with gpus = true, but only {len(ids)} GPU(s) are "
            "visible (CUDA_VISIBLE_DEVICES); lower launch.workers"
        )
    return ids[:workers]


def _collect(launch: Launch, processes: list[Any], events: Any) -> list[RunOutcome]:
    """Outcomes as the workers report them; a worker that dies fails the run it was on."""
    outcomes: dict[int, RunOutcome] = {}
    running: dict[int, int] = {}  # worker -> index of the run it trains
    while len(outcomes) < len(launch.runs):
        try:
            kind, worker, index, outcome = events.get(timeout=1.0)
        except queue.Empty:
            for worker, process in enumerate(processes):
                if not process.is_alive() and process.exitcode not in (0, None):
                    index = running.pop(worker, None)
                    if index is not None and index not in outcomes:
                        run = launch.runs[index]
                        state: Literal["failed", "preempted"] = (
                            "preempted" if process.exitcode == 75 else "failed"
                        )
                        detail = f"worker {worker} exited with status {process.exitcode}"
                        outcomes[index] = RunOutcome(run, state, detail)
                        launch.say(f"train: {run.name}: [red]{detail}[/]")
            if not any(p.is_alive() for p in processes):
                break  # every worker is gone: what was not handed out stays untrained
            continue
        if kind == "start":
            running[worker] = index
            launch.say(f"train: {launch.runs[index].name} started on worker {worker}")
        else:
            running.pop(worker, None)
            outcomes[index] = outcome
            colour = {"done": "green", "held": "yellow"}.get(outcome.state, "red")
            launch.say(
                f"train: {outcome.run.name}: [{colour}]{outcome.state}[/]"
                + (f" ({outcome.detail})" if outcome.detail else "")
            )
    return [outcomes[i] for i in sorted(outcomes)]


def _work(
    trainer: RunTrainer,
    runs: tuple[TrainingRun, ...],
    jobs: Any,
    events: Any,
    env: dict[str, str],
    threads: int,
    worker: int,
    log: Path,
) -> None:
    """One pool worker: its environment first (before torch starts), then runs until none is
    left. Output goes to its log file."""
    os.environ.update(env)
    handle = open(log, "a", buffering=1)  # noqa: SIM115 - the worker's stdout until it exits
    os.dup2(handle.fileno(), 1)
    os.dup2(handle.fileno(), 2)
    sys.stdout = sys.stderr = handle
    while (index := jobs.get()) is not None:
        run = runs[index]
        events.put(("start", worker, index, None))
        try:
            outcome = trainer(run, threads)
        except Exception as error:  # reported to the parent; the next run goes on
            if getattr(error, "exit_code", None) == 75:  # preempted: checkpointed, stop here
                events.put(("end", worker, index, RunOutcome(run, "preempted", str(error))))
                raise SystemExit(75) from None
            lines = (str(error).strip() or type(error).__name__).splitlines()
            print(f"{run.name} failed: {error!r}", flush=True)
            exit_code = getattr(error, "exit_code", 1)
            outcome = RunOutcome(run, "failed", lines[-1], exit_code)
        events.put(("end", worker, index, outcome))


def _forward_signals(pids: list[int]) -> dict[int, Any]:
    """SIGTERM and SIGUSR1 sent to this process (a scheduler's warning) reach the workers too,
    which checkpoint their runs and stop; the previous handlers come back afterwards."""
    previous: dict[int, Any] = {}

    def forward(signum: int, frame: Any) -> None:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)

    for signum in (signal.SIGTERM, signal.SIGUSR1):
        try:
            previous[signum] = signal.signal(signum, forward)
        except ValueError:  # not the main thread: leave signals alone
            break
    return previous


def _restore(previous: dict[int, Any]) -> None:
    for signum, handler in previous.items():
        signal.signal(signum, handler)


@hookimpl
def geospec_register_launchers(register: Register) -> None:
    register(Local)
    register(Pool)
