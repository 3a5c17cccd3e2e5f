"""Builtin experiment trackers: TensorBoard, Weights & Biases, MLflow (each an optional extra).

Each training run gets its own instance (on rank 0): ``start`` opens the tracker's run (named
``<arm>/seed-<k>``, grouped by the spec's name, its config the arm's widths, the run key and the
trainer's fingerprint), ``log`` receives every ``metrics.jsonl`` row under the same names, ``end``
the run's result (logged as ``result/<name>``). A resumed run continues the same tracker run.
The libraries are imported in ``start``: a missing one is one warning from the core, and training
goes on.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from geospec import hookimpl
from geospec.errors import UsageError
from geospec.kinds import TrackedRun, Tracker
from geospec.plugin import PluginParams, Register

#: The prefix of the final result's values (``result/final_val_loss``, ...).
RESULT_PREFIX = "result/"


def _missing(package: str, extra: str) -> UsageError:
    return UsageError(f"needs the {package} package: pip install 'geospec[{extra}]'")


def _result_metrics(result: Mapping[str, Any]) -> dict[str, float]:
    return {
        RESULT_PREFIX + name: float(value)
        for name, value in result.items()
        if isinstance(value, int | float) and not isinstance(value, bool)
    }


class TensorBoardParams(PluginParams):
    kind: Literal["tensorboard"] = "tensorboard"
    log_dir: str | None = None
    """Where event files go: <log_dir>/<spec name>/<arm>/seed-<k> (default log_dir: the run
    directory's tensorboard/). `tensorboard --logdir` on it shows every run."""


class TensorBoard(Tracker):
    """Event files for TensorBoard (the config as a text summary, scalars by step). A resumed run
    writes to the same directory; what the interrupted session logged after its checkpoint is
    purged from view (TensorBoard's purge step), so each step shows the value training kept."""

    Params = TensorBoardParams
    params: TensorBoardParams

    def start(self, run: TrackedRun) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as error:
            raise _missing("tensorboard", "tensorboard") from error
        root = Path(self.params.log_dir).expanduser() if self.params.log_dir else None
        path = (root or run.run_dir / "tensorboard") / run.group / run.name
        self.writer = SummaryWriter(str(path), purge_step=run.step + 1, flush_secs=30)
        text = json.dumps(dict(run.config), indent=2, sort_keys=True)
        self.writer.add_text("config", f"```json\n{text}\n```", run.step)

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        for name, value in metrics.items():
            self.writer.add_scalar(name, value, step)

    def end(self, result: Mapping[str, Any] | None) -> None:
        if result is not None:
            for name, value in _result_metrics(result).items():
                self.writer.add_scalar(name, value, int(result["steps"]))
        self.writer.close()


class WandbParams(PluginParams):
    kind: Literal["wandb"] = "wandb"
    mode: Literal["online", "offline"] = "online"
    """online: stream to the W&B server (needs `wandb login` or WANDB_API_KEY); offline: write
    the run under dir only (upload later with `wandb sync`)."""
    project: str = Field("geospec", min_length=1, max_length=128)
    entity: str | None = None
    """The W&B team or user (default: the logged-in user's default entity)."""
    dir: str | None = None
    """Where wandb keeps its local files (a wandb/ folder in it; default: the run directory)."""


class Wandb(Tracker):
    """A Weights & Biases run per training run: id from the run key (``resume = "allow"``), group
    the spec's name, the metrics against a ``step`` axis of their own (so a resumed run's steps
    are never dropped as out of order), the result in the run's summary."""

    Params = WandbParams
    params: WandbParams

    def start(self, run: TrackedRun) -> None:
        try:
            import wandb
        except ImportError as error:
            raise _missing("wandb", "wandb") from error
        directory = Path(self.params.dir).expanduser() if self.params.dir else run.run_dir
        directory.mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(
            project=self.params.project,
            entity=self.params.entity,
            group=run.group,
            name=run.name,
            id=run.id,
            resume="allow",
            config=dict(run.config),
            dir=str(directory),
            mode=self.params.mode,
            reinit="create_new",  # one run per training run, several in one process
            # geospec's own output stays as it is; no login prompt holds training up
            settings=wandb.Settings(console="off", silent=True, login_timeout=10),
        )
        self.run.define_metric("step")
        self.run.define_metric("*", step_metric="step")

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        self.run.log({"step": step, **metrics})

    def end(self, result: Mapping[str, Any] | None) -> None:
        if result is not None:
            self.run.summary.update(_result_metrics(result))
        self.run.finish(exit_code=0 if result is not None else 1)


class MlflowParams(PluginParams):
    kind: Literal["mlflow"] = "mlflow"
    tracking_uri: str | None = None
    """Any MLflow tracking URI: http(s)://server, databricks, file:///path, sqlite:///file.db
    (default: MLFLOW_TRACKING_URI, else MLflow's own default)."""
    experiment: str | None = None
    """The MLflow experiment (default: the spec's name)."""


class Mlflow(Tracker):
    """An MLflow run per training run, in the experiment named after the spec; the run is found
    again on resume by its ``geospec.run_id`` tag (MLflow chooses run ids itself). The config goes
    into params (widths and the fingerprint as JSON)."""

    Params = MlflowParams
    params: MlflowParams

    def start(self, run: TrackedRun) -> None:
        try:
            from mlflow.entities import Param
            from mlflow.tracking import MlflowClient
        except ImportError as error:
            raise _missing("mlflow-skinny", "mlflow") from error
        client = MlflowClient(tracking_uri=self.params.tracking_uri)
        name = self.params.experiment or run.group
        experiment = client.get_experiment_by_name(name)
        experiment_id = (
            experiment.experiment_id if experiment is not None else client.create_experiment(name)
        )
        found = client.search_runs(
            [experiment_id], filter_string=f"tags.`geospec.run_id` = '{run.id}'", max_results=1
        )
        if found:
            run_id = found[0].info.run_id
            client.update_run(run_id, status="RUNNING")
        else:
            tags = {"geospec.run_id": run.id, "geospec.group": run.group}
            run_id = client.create_run(experiment_id, run_name=run.name, tags=tags).info.run_id
        params = [
            Param(key, value if isinstance(value, str) else json.dumps(value, sort_keys=True))
            for key, value in run.config.items()
        ]
        client.log_batch(run_id, params=params)  # the same values again on resume: allowed
        self.client, self.run_id = client, run_id

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        self._metrics(metrics, step)

    def end(self, result: Mapping[str, Any] | None) -> None:
        if result is not None:
            self._metrics(_result_metrics(result), int(result["steps"]))
        self.client.set_terminated(self.run_id, "FINISHED" if result is not None else "KILLED")

    def _metrics(self, metrics: Mapping[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        rows = [Metric(name, value, now, step) for name, value in metrics.items()]
        self.client.log_batch(self.run_id, metrics=rows)


@hookimpl
def geospec_register_trackers(register: Register) -> None:
    register(TensorBoard)
    register(Wandb)
    register(Mlflow)
