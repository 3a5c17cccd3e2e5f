"""The ``slurm`` launcher: the arm-seed runs as one Slurm job array, through submitit.

``geospec run`` does the stages before training in its own process (on a cluster: start it where
the reference can be trained, see docs/cluster.md), then submits every run still to train as one
job array (one task per run: ``gpus_per_run`` GPUs on each of ``nodes_per_run`` nodes, one
process per GPU joined in one DDP group, as torchrun would) and a small job that starts when the
whole array has ended (``afterany``) and runs ``geospec run SPEC --out RUN_DIR`` again to build
the report. ``geospec run`` returns after submitting and says the job ids and how to watch them.
A later ``geospec run`` submits nothing while jobs of the run directory are still queued, and
submits again only what is neither trained nor queued (a failed run, once fixed).

Preemption: Slurm's warning before the time limit (``--signal=USR1@warning_s``) and
``scancel --signal USR1`` stop the run after its current step with a checkpoint
(:class:`geospec.errors.Preempted`, exit status 75); the run is then requeued through submitit's
checkpointing protocol (:meth:`TrainJob.checkpoint` returns the same call as a
``DelayedSubmission``) and resumes from the checkpoint to the result an uninterrupted run has.
SIGTERM (``scancel``; Slurm preempting a job, which it requeues itself when configured to) also
checkpoints, but the job is not requeued: ``scancel`` stops a run.

``cluster = "local"`` runs the same jobs through submitit's local executor, as processes on this
machine; ``geospec run`` then waits for them and builds the report itself (as with ``wait``).
submitit is the optional extra ``geospec[slurm]``, imported only when jobs are submitted.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from geospec import hookimpl
from geospec.errors import REQUEUE_EXIT_CODE, GeospecError, Preempted, UsageError, last_line
from geospec.kinds import Launch, Launcher, RunOutcome, RunTrainer, TrainingRun
from geospec.plugin import PluginParams, Register

#: Set in the job that finishes the pipeline after the array: it must report, never submit.
FINISHING = "GEOSPEC_SLURM_FINISHING"

#: sbatch options the launcher sets itself (from its own parameters, or for every job).
MANAGED = {
    "partition", "account", "time", "nodes", "ntasks-per-node", "gpus-per-node", "cpus-per-task",
    "array", "dependency", "output", "error", "job-name", "signal", "wckey",
}  # fmt: skip

#: Extra sbatch options (by prefix) that size a run and stay off the one-CPU report job.
RUN_ONLY = ("gpu", "gres", "mem", "exclusive", "cpus", "ntasks", "tres")


class SlurmParams(PluginParams):
    kind: Literal["slurm"] = "slurm"
    cluster: Literal["slurm", "local"] = "slurm"
    """``slurm``: sbatch; ``local``: submitit's local executor (jobs as processes on this
    machine; ``geospec run`` waits for them)."""
    partition: str | None = None
    """Slurm partition of the runs (default: the cluster's default partition)."""
    account: str | None = None
    """Slurm account charged for the runs."""
    minutes: int = Field(24 * 60, ge=1, le=366 * 24 * 60)
    """Time limit of each run's job, in minutes; a run that reaches it is checkpointed and
    requeued, and resumes."""
    gpus_per_run: int = Field(0, ge=0, le=64)
    """GPUs on each node of a run (0: CPU). Several GPUs: one process per GPU, one DDP group."""
    nodes_per_run: int = Field(1, ge=1, le=4096)
    """Nodes of each run (with ``gpus_per_run`` GPUs each)."""
    cpus_per_task: int = Field(1, ge=1, le=1024)
    """CPUs of each process (torch's CPU threads; a spec's ``train.threads`` still wins)."""
    parallel: int = Field(256, ge=1, le=100_000)
    """At most this many runs of the array at once (sbatch ``--array=...%N``)."""
    warning_s: int = Field(120, ge=10, le=3600)
    """Seconds before the time limit at which Slurm asks a run to checkpoint (USR1)."""
    setup: list[str] = Field(default_factory=list)
    """Shell lines each job runs before geospec (``module load cuda``, activating a venv)."""
    sbatch: dict[str, str | int | bool] = Field(default_factory=dict)
    """Further sbatch options, without the dashes: ``{ qos = "high", constraint = "a100",
    mem = "64G", exclusive = true }``."""
    report_minutes: int = Field(60, ge=1, le=366 * 24 * 60)
    """Time limit of the report job (one CPU; with ``[eval]`` it evaluates the runs too)."""
    wait: bool = False
    """Wait in ``geospec run`` until every run has ended, then build the report here (no
    report job)."""

    @field_validator("sbatch")
    @classmethod
    def _known_shape(cls, options: dict[str, str | int | bool]) -> dict[str, str | int | bool]:
        for name in options:
            if not re.fullmatch(r"[a-z][a-z0-9-]*", name):
                raise ValueError(
                    f"{name!r} is not an sbatch option name: write it without dashes in "
                    'lower case, as in sbatch = { qos = "high" }'
                )
            if name in MANAGED:
                raise ValueError(
                    f"{name!r} is set by the launcher: use its own parameter instead "
                    "(partition, account, minutes, nodes_per_run, gpus_per_run, cpus_per_task)"
                    if name in ("partition", "account", "time", "nodes", "gpus-per-node",
                                "cpus-per-task")
                    else f"{name!r} is set by the launcher for every job; leave it out"
                )  # fmt: skip
        return options

    @model_validator(mode="after")
    def _local_is_one_node(self) -> SlurmParams:
        if self.cluster == "local" and self.nodes_per_run > 1:
            raise ValueError(
                f'nodes_per_run = {self.nodes_per_run} needs cluster = "slurm": the local '
                "executor has one node"
            )
        return self


class Slurm(Launcher):
    """The arm-seed runs as one Slurm job array, the report as a job after it (see the module
    docstring). Job files and logs go to ``launch/slurm/`` in the run directory."""

    Params = SlurmParams
    params: SlurmParams

    def launch(self, launch: Launch) -> list[RunOutcome]:
        finishing = os.environ.get(FINISHING) == "1"
        known: dict[TrainingRun, RunOutcome] = {}
        todo: list[TrainingRun] = []
        for run in launch.runs:
            recorded = launch.recorded(run)
            if recorded is not None and (recorded.state == "done" or finishing):
                known[run] = recorded
            elif finishing:
                known[run] = RunOutcome(
                    run,
                    "failed",
                    f"its job ended without a result (logs in {self._folder(launch)})",
                )
            else:
                todo.append(run)
        if todo:
            for outcome in self._submit(launch, todo):
                known[outcome.run] = outcome
        return [known[run] for run in launch.runs if run in known]

    def _folder(self, launch: Launch) -> Path:
        return launch.run_dir / "launch" / "slurm"

    def _name(self, launch: Launch) -> str:
        """The job name: the run directory's, so a later ``geospec run`` finds its jobs."""
        return _job_name(launch.run_dir)

    def job_script(self, run_dir: Path, runs: int) -> str | None:
        """The sbatch script of the job array of ``runs`` runs, as submitit writes it for
        :meth:`_submit` (the array executor's parameters plus ``map_count``, its command), for
        ``cluster = "slurm"``; nothing is submitted."""
        if self.params.cluster != "slurm":
            return None
        submitit = _import_submitit()

        class Rendering(submitit.SlurmExecutor):  # type: ignore[name-defined]
            """submitit's Slurm executor where srun may be missing: it renders, never submits."""

            @classmethod
            def affinity(cls) -> int:
                return 1

        folder = run_dir / "launch" / "slurm"
        executor = self._executor(submitit, folder, _job_name(run_dir), Rendering)
        executor.parameters["map_count"] = runs  # what submitit's map_array sets for an array
        script: str = executor._make_submission_file_text(executor._submitit_command_str, "0")
        return script

    def _submit(self, launch: Launch, runs: list[TrainingRun]) -> list[RunOutcome]:
        params = self.params
        name = self._name(launch)
        if params.cluster == "slurm":
            queued = _queued_jobs(name)
            if queued:
                jobs = ", ".join(queued)
                launch.say(
                    f"train: jobs of this run directory are still queued or running ({jobs}); "
                    f"nothing submitted. Watch them: geospec status {launch.run_dir}; squeue "
                    f"--name {name}"
                )
                return [RunOutcome(run, "submitted", f"in job {jobs}") for run in runs]
        submitit = _import_submitit()
        executor = self._executor(submitit, self._folder(launch), name)
        threads = params.cpus_per_task
        job = TrainJob(launch.trainer, threads)
        try:
            with _outside_this_job():
                jobs = executor.map_array(job, runs)
        except Exception as error:  # sbatch refused: its own message says why
            raise UsageError(f"launch: sbatch refused the runs: {last_line(error)}") from None
        ids = [str(j.job_id) for j in jobs]
        if params.cluster == "local" or params.wait:
            launch.say(
                f"train: {len(runs)} run(s) in jobs {', '.join(ids)} (logs in "
                f"{self._folder(launch)}); waiting for them"
            )
            return [_outcome(run, j, launch) for run, j in zip(runs, jobs, strict=True)]
        array = ids[0].split("_")[0]
        report = self._report_job(submitit, launch, name, array)
        launch.say(
            f"train: {len(runs)} run(s) submitted as job array {array} "
            f"({', '.join(f'{r.name} = {i}' for r, i in zip(runs, ids, strict=True))}); the "
            f"report follows in job {report} when they have ended.\n"
            f"  watch: geospec status {launch.run_dir}   squeue -j {array},{report}\n"
            f"  logs: {self._folder(launch)}"
        )
        return [RunOutcome(r, "submitted", f"job {i}") for r, i in zip(runs, ids, strict=True)]

    def _executor(self, submitit: Any, folder: Path, name: str, slurm_executor: Any = None) -> Any:
        params = self.params
        tasks = max(1, params.gpus_per_run)
        if params.cluster == "local":
            executor = submitit.LocalExecutor(folder=folder)
            executor.update_parameters(
                timeout_min=params.minutes,
                tasks_per_node=tasks,
                gpus_per_node=params.gpus_per_run,
                signal_delay_s=params.warning_s,
                setup=params.setup,
            )
            return executor
        executor = (slurm_executor or submitit.SlurmExecutor)(folder=folder)
        extra: dict[str, Any] = {"signal": f"USR1@{params.warning_s}", **_options(params)}
        executor.update_parameters(
            job_name=name,
            partition=params.partition,
            account=params.account,
            time=params.minutes,
            nodes=params.nodes_per_run,
            ntasks_per_node=tasks,
            gpus_per_node=params.gpus_per_run or None,
            cpus_per_task=params.cpus_per_task,
            array_parallelism=params.parallel,
            signal_delay_s=params.warning_s,
            setup=params.setup,
            additional_parameters=extra,
        )
        return executor

    def _report_job(self, submitit: Any, launch: Launch, name: str, array: str) -> str:
        """The job that runs the pipeline again once every task of ``array`` has ended."""
        if launch.spec is None:
            raise UsageError("launch: the slurm launcher needs the spec file (geospec run SPEC)")
        params = self.params
        executor = submitit.SlurmExecutor(folder=self._folder(launch))
        extra = {k: v for k, v in _options(params).items() if not k.startswith(RUN_ONLY)}
        executor.update_parameters(
            job_name=f"{name}-report",
            partition=params.partition,
            account=params.account,
            time=params.report_minutes,
            nodes=1,
            ntasks_per_node=1,
            cpus_per_task=1,
            dependency=f"afterany:{array}",
            setup=params.setup,
            additional_parameters=extra,
        )
        command = [sys.executable, "-m", "geospec", "run", str(launch.spec)]
        command += ["--out", str(launch.run_dir.resolve())]
        for override in launch.overrides:  # the spec as this run loaded it
            command += ["--set", override]
        with _outside_this_job():
            job = executor.submit(FinishPipeline(command))
        return str(job.job_id)


@contextlib.contextmanager
def _outside_this_job() -> Iterator[None]:
    """Submitting from inside a job (``geospec run`` in an allocation): the job's own variables
    (SLURM_*, SRUN_*, torchrun's) would leak into the new jobs' settings, so they are hidden
    meanwhile, as ``submitit.helpers.clean_env`` does; SLURM_CONF (which cluster) and the user's
    SBATCH_* defaults stay."""
    hidden = {
        name: os.environ.pop(name)
        for name in list(os.environ)
        if (name.startswith(("SLURM_", "SLURMD_", "SRUN_")) and name != "SLURM_CONF")
        or name in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK")
    }
    try:
        yield
    finally:
        os.environ.update(hidden)


def _options(params: SlurmParams) -> dict[str, str | int | bool]:
    """The extra sbatch options as flags: ``true`` is the bare flag, ``false`` leaves it out."""
    return {name: value for name, value in params.sbatch.items() if value is not False}


def _job_name(run_dir: Path) -> str:
    return f"geospec-{run_dir.resolve().name}-{_short_hash(run_dir)}"


def _short_hash(path: Path) -> str:
    import hashlib

    return hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:8]


def _import_submitit() -> Any:
    try:
        import submitit
    except ImportError:
        raise UsageError(
            "launch: the slurm launcher needs submitit: pip install 'geospec[slurm]'"
        ) from None
    return submitit


def _queued_jobs(name: str) -> list[str]:
    """Ids of this user's jobs called ``name`` that Slurm still holds (pending, running, ...)."""
    try:
        found = subprocess.run(
            ["squeue", "--noheader", "--me", "--name", name, "--format", "%i"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except FileNotFoundError:
        raise UsageError(
            "launch: squeue is not on PATH: the slurm launcher submits from a machine with "
            'Slurm\'s clients (a login node), or runs its jobs here with cluster = "local"'
        ) from None
    except (OSError, subprocess.TimeoutExpired) as error:
        raise UsageError(f"launch: cannot ask Slurm for queued jobs (squeue): {error}") from None
    if found.returncode != 0:
        raise UsageError(f"launch: squeue failed: {last_line(found.stderr)}")
    return found.stdout.split()


def _outcome(run: TrainingRun, job: Any, launch: Launch) -> RunOutcome:
    """A waited-for job's outcome: its own (done, held), or failed with the run's recorded
    error (or the job's last line when the run recorded none)."""
    try:
        outcome: RunOutcome = job.results()[0]  # rank 0's, when a run has several processes
    except Exception as error:
        recorded = launch.recorded(run)
        if recorded is not None and recorded.state == "failed":
            return recorded
        return RunOutcome(
            run,
            "failed",
            f"job {job.job_id} ended before the run finished ({last_line(error)}); run again "
            "to resume it from its last checkpoint",
        )
    launch.say(f"train: {run.name}: {outcome.state} ({outcome.detail or 'no detail'})")
    return outcome


@dataclass
class TrainJob:
    """One array task: trains one run through the train stage's trainer.

    It follows submitit's checkpointing protocol: a run stopped by a signal (Preempted) asks
    submitit to requeue it, and :meth:`checkpoint` gives the call to make again (geospec's own
    checkpoint in the training directory is where it resumes)."""

    trainer: RunTrainer
    threads: int

    def __call__(self, run: TrainingRun) -> RunOutcome:
        import submitit

        environment = submitit.JobEnvironment()
        if environment.num_tasks > 1:  # several GPUs or nodes: torchrun's variables, one group
            submitit.helpers.TorchDistributedEnvironment().export(set_cuda_visible_devices=False)
        try:
            with _noted(signal.SIGUSR1):  # a warning outside training must not kill the job
                return self.trainer(run, self.threads)
        except Preempted as stopped:
            if stopped.signal == "SIGTERM":  # scancel, or Slurm preempting (and requeueing) it
                print(f"{run.name}: {stopped}; not requeued (SIGTERM means stop)", flush=True)
                raise SystemExit(REQUEUE_EXIT_CODE) from None
            print(f"{run.name}: {stopped}; asking submitit to requeue it", flush=True)
            _requeue(submitit)
            raise SystemExit(REQUEUE_EXIT_CODE) from None  # a task that is not rank 0

    def checkpoint(self, run: TrainingRun) -> Any:
        """submitit's checkpointing protocol: the same call again, once requeued."""
        from submitit.helpers import DelayedSubmission

        return DelayedSubmission(self, run)


@contextlib.contextmanager
def _noted(signum: int) -> Iterator[None]:
    """While the run loads or ends (outside training, whose own handler stops it after a step),
    ``signum`` is written to the log instead of ending the process."""

    def note(received: int, frame: Any) -> None:
        print(f"received {signal.Signals(received).name} outside training: ignored", flush=True)

    previous = signal.signal(signum, note)
    try:
        yield
    finally:
        signal.signal(signum, previous)


def _requeue(submitit: Any) -> None:
    """Hand the stopped run to submitit's preemption handler, as if its own signal had come:
    it calls :meth:`TrainJob.checkpoint`, saves the new call, requeues the job and exits."""
    usr = submitit.JobEnvironment._usr_sig()  # the signal submitit's handler is installed for
    handler = signal.getsignal(usr)
    if callable(handler):
        handler(usr, None)


@dataclass
class FinishPipeline:
    """The report job: ``geospec run SPEC --out RUN_DIR`` once the array has ended. The slurm
    launcher in it submits nothing: runs that did not finish are reported as failed."""

    command: list[str]

    def __call__(self) -> None:
        env = {**os.environ, FINISHING: "1"}
        done = subprocess.run(self.command, env=env, check=False)
        if done.returncode != 0:
            raise GeospecError(
                f"{' '.join(self.command)} exited with status {done.returncode} (see this log)"
            )


@hookimpl
def geospec_register_launchers(register: Register) -> None:
    register(Slurm)
