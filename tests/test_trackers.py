"""Experiment trackers (``[train] trackers``): what a tracker logs is what ``metrics.jsonl`` and
``result.json`` hold, read back through each library's own reader; a resumed run continues the
same tracker run; a failing tracker warns once and never stops training; trackers change no run
key.

The TensorBoard, W&B and MLflow tests (marked ``trackers``) need their extras (``nox -s trackers``
installs them) and are skipped without them; the others run in the default suite.
"""

from __future__ import annotations

import json
import math
import struct
import sys
import zlib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, ClassVar, Literal

import pytest
from click.testing import CliRunner, Result
from small_spec import toml_value, write_small_spec

from geospec import hookimpl
from geospec.cli import cli
from geospec.kinds import TrackedRun, Tracker
from geospec.pipeline.keys import arm_run_key
from geospec.pipeline.stages.reference import Reference
from geospec.pipeline.tracking import tracker_run_id
from geospec.plugin import PluginParams, Register
from geospec.spec.loading import load_spec
from geospec.testing import registered

pytestmark = pytest.mark.torch

NAME = "tracker-test"
STEPS = 12
#: The [train] settings of this file's study (tests/small_spec.py has the rest).
TRAIN = {
    "steps": STEPS, "eval_interval": 4, "checkpoint_interval": 4, "log_interval": 1
}  # fmt: skip

RESULT_FIELDS = (
    "final_val_loss", "steps", "tokens", "wall_seconds", "train_seconds", "tokens_per_second",
    "params", "seed",
)  # fmt: skip


# -- third-party trackers: one that records, one that breaks, one that interrupts training ------


class RecorderParams(PluginParams):
    kind: Literal["recorder"] = "recorder"


class Recorder(Tracker):
    """Records every call, in order, in ``Recorder.calls``."""

    Params = RecorderParams
    calls: ClassVar[list[tuple[str, Any]]] = []

    def start(self, run: TrackedRun) -> None:
        self.calls.append(("start", run))

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        self.calls.append(("log", (step, dict(metrics))))

    def end(self, result: Mapping[str, Any] | None) -> None:
        self.calls.append(("end", None if result is None else dict(result)))


class BreaksParams(PluginParams):
    kind: Literal["breaks"] = "breaks"
    where: Literal["start", "log", "end"] = "log"


class Breaks(Tracker):
    """Fails like a tracker whose server went away, in the method its params name."""

    Params = BreaksParams
    params: BreaksParams

    def _maybe_fail(self, method: str) -> None:
        if self.params.where == method:
            raise ConnectionError(f"connection refused while {method}")

    def start(self, run: TrackedRun) -> None:
        self._maybe_fail("start")

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        self._maybe_fail("log")

    def end(self, result: Mapping[str, Any] | None) -> None:
        self._maybe_fail("end")


class InterruptParams(PluginParams):
    kind: Literal["interrupt"] = "interrupt"
    step: int


class Interrupt(Tracker):
    """Stops training like Ctrl-C once ``step`` is logged (after the trackers before it saw it)."""

    Params = InterruptParams
    params: InterruptParams

    def start(self, run: TrackedRun) -> None:
        pass

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        if step == self.params.step:
            raise KeyboardInterrupt

    def end(self, result: Mapping[str, Any] | None) -> None:
        pass


class TestTrackers:
    @hookimpl
    def geospec_register_trackers(self, register: Register) -> None:
        register(Recorder)
        register(Breaks)
        register(Interrupt)


@pytest.fixture(autouse=True)
def test_trackers() -> Iterator[None]:
    Recorder.calls.clear()
    with registered(TestTrackers(), name="test-trackers"):
        yield


# -- helpers ------------------------------------------------------------------------------------


def write_spec(directory: Path, *trackers: str, file: str = "spec.toml") -> Path:
    """The study's spec with ``trackers`` (each a TOML value: ``'"wandb"'``, an inline table)."""
    watched = [toml_value(tracker) for tracker in trackers]
    return write_small_spec(directory, NAME, TRAIN | {"trackers": watched}, file=file)


def train(spec: Path, out: Path, expect: int = 0) -> str:
    command = ["train", str(spec), "--arm", "uniform", "--seed", "0", "--out", str(out)]
    result: Result = CliRunner().invoke(cli, command)
    assert result.exit_code == expect, result.output
    return " ".join(result.output.split())


def interrupted_then_resumed(tmp_path: Path, tracker: str) -> Path:
    """``tracker`` watches a run stopped at step 6 (its last checkpoint is step 4: steps 5 and 6
    are trained again on resume) and then resumed to the end."""
    out = tmp_path / "run"
    train(write_spec(tmp_path, tracker, '{ kind = "interrupt", step = 6 }'), out, expect=130)
    assert not (out / "result.json").exists()
    train(write_spec(tmp_path, tracker), out)
    return out


def metrics_series(out: Path) -> dict[str, list[tuple[int, float]]]:
    """metrics.jsonl as metric name -> (step, value) in file order (``tokens`` is in both the
    training and the validation row of a step)."""
    series: dict[str, list[tuple[int, float]]] = {}
    for line in (out / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        for name, value in row.items():
            if name != "step":
                series.setdefault(name, []).append((row["step"], value))
    return series


def metrics_table(out: Path) -> dict[str, dict[int, float]]:
    """metrics.jsonl as metric name -> step -> value."""
    return {name: dict(pairs) for name, pairs in metrics_series(out).items()}


def result_json(out: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((out / "result.json").read_text())
    return data


def run_key(out: Path) -> str:
    key: str = json.loads((out / "run_key.json").read_text())["key"]
    return key


def last_per_step(pairs: list[tuple[int, float]]) -> dict[int, float]:
    """Logged (step, value) pairs in logging order: a step logged again (trained again after a
    resume) keeps its last value, the one training kept."""
    return dict(pairs)


def expected_config(out: Path) -> dict[str, Any]:
    result = result_json(out)
    return {
        "arm": "uniform",
        "seed": 0,
        "widths": result["widths"],
        "run_key": run_key(out),
        "fingerprint": result["fingerprint"],
    }


# -- the core: what a tracker is told -----------------------------------------------------------


def test_a_tracker_is_told_what_metrics_jsonl_and_result_json_hold_and_a_resume_continues_it(
    tmp_path: Path,
) -> None:
    out = interrupted_then_resumed(tmp_path, '{ kind = "recorder" }')
    starts = [value for call, value in Recorder.calls if call == "start"]
    ends = [value for call, value in Recorder.calls if call == "end"]
    assert [call for call, _ in Recorder.calls].count("start") == 2
    first, second = starts
    assert [first.step, second.step] == [0, 4]  # the resume starts from the step-4 checkpoint
    assert first.id == second.id == tracker_run_id(NAME, "uniform/seed-0", run_key(out))
    assert (first.name, first.group) == ("uniform/seed-0", NAME)
    assert first.directory == out
    assert dict(second.config) == expected_config(out)
    assert second.config["widths"] == [64, 64]
    result = result_json(out)
    assert ends == [None, {name: result[name] for name in RESULT_FIELDS}]

    logged: dict[str, list[tuple[int, float]]] = {}
    for call, value in Recorder.calls:
        if call == "log":
            step, metrics = value
            for name, number in metrics.items():
                logged.setdefault(name, []).append((step, number))
    table = metrics_table(out)
    assert set(logged) == set(table) == {"loss", "lr", "tokens", "tokens_per_s", "val_loss"}
    for name, pairs in logged.items():
        assert last_per_step(pairs) == table[name], name
    # steps 5 and 6 were logged by the interrupted session and again after the resume
    assert [step for step, _ in logged["loss"]] == [1, 2, 3, 4, 5, 6, *range(5, STEPS + 1)]


def test_trackers_change_no_run_key_and_adding_one_retrains_nothing(tmp_path: Path) -> None:
    out = tmp_path / "run"
    without = write_spec(tmp_path)
    train(without, out)
    key, result = run_key(out), result_json(out)
    tracked = write_spec(tmp_path, '{ kind = "recorder" }', '"tensorboard"', file="tracked.toml")
    with_trackers, plain = load_spec(tracked), load_spec(without)
    assert with_trackers.train.trackers and not plain.train.trackers
    for spec in (plain, with_trackers):
        assert arm_run_key(spec.model, spec.data, spec.train, [64, 64], 0) == key
    assert Reference.from_spec(with_trackers).key(tmp_path) == Reference.from_spec(plain).key(
        tmp_path
    )
    output = train(tracked, out)
    assert "final validation loss" in output
    assert run_key(out) == key
    assert result_json(out) == result  # the finished run, not trained again (same fingerprint)
    assert Recorder.calls == []  # a finished run has nothing to tell


def test_a_failing_tracker_warns_once_and_training_finishes(tmp_path: Path) -> None:
    out = tmp_path / "run"
    places = ("start", "log", "end")
    breaking = [f'{{ kind = "breaks", where = "{where}" }}' for where in places]
    output = train(write_spec(tmp_path, *breaking, '"recorder"'), out)
    assert output.count("tracker breaks") == 3, output  # once each, not once per row
    for where in places:
        assert (
            f"tracker breaks (uniform/seed-0): connection refused while {where}; training goes "
            "on without it" in output
        )
    assert "final validation loss" in output
    result = result_json(out)
    # the other tracker saw everything
    assert Recorder.calls[-1] == ("end", {name: result[name] for name in RESULT_FIELDS})
    assert sum(call == "log" for call, _ in Recorder.calls) == len(
        (out / "metrics.jsonl").read_text().splitlines()
    )


def test_a_builtin_tracker_whose_package_is_missing_warns_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    packages = ("tensorboard", "torch.utils.tensorboard", "wandb", "mlflow")
    for name in [*packages, *sys.modules]:  # as if none were installed, even if imported before
        if name in packages or name.startswith(tuple(f"{p}." for p in packages)):
            monkeypatch.setitem(sys.modules, name, None)
    out = tmp_path / "run"
    output = train(write_spec(tmp_path, '"tensorboard"', '"wandb"', '"mlflow"'), out)
    for kind in ("tensorboard", "wandb", "mlflow"):
        assert output.count(f"tracker {kind}") == 1, output
        assert f"pip install 'geospec[{kind}]'" in output
    assert (out / "result.json").exists()


def test_geospec_run_names_every_run_and_groups_them_by_the_spec(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, '"recorder"')
    result = CliRunner().invoke(cli, ["run", str(spec), "--out", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    starts = [value for call, value in Recorder.calls if call == "start"]
    # uniform/seed-0 is the reference's copy (reused, not trained): nothing to track
    assert [(run.name, run.group) for run in starts] == [
        ("reference/seed-0", NAME),
        ("cosine/seed-0", NAME),
    ]
    cosine = tmp_path / "run" / "arms" / "cosine" / "seed-0"
    assert starts[1].config["widths"] == result_json(cosine)["widths"]
    assert starts[1].id == tracker_run_id(NAME, "cosine/seed-0", run_key(cosine))


def test_validate_lists_the_trackers(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, '"tensorboard"', '{ kind = "wandb", mode = "offline" }')
    result = CliRunner().invoke(cli, ["validate", str(spec)])
    assert result.exit_code == 0, result.output
    assert "trackers" in result.output
    assert "tensorboard, wandb(mode=offline, project=geospec)" in " ".join(result.output.split())


# -- TensorBoard --------------------------------------------------------------------------------


@pytest.mark.trackers
def test_tensorboard_event_files_hold_metrics_jsonl_and_the_result(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logs = tmp_path / "tb"
    out = interrupted_then_resumed(tmp_path, f'{{ kind = "tensorboard", log_dir = "{logs}" }}')
    events = EventAccumulator(str(logs / NAME / "uniform" / "seed-0"), size_guidance={"scalars": 0})
    events.Reload()
    float32 = lambda x: struct.unpack("f", struct.pack("f", x))[0]  # noqa: E731 - event precision
    for name, pairs in metrics_series(out).items():
        # steps 5 and 6 of the interrupted session are purged: exactly the rows training kept
        scalars = [(s.step, s.value) for s in events.Scalars(name)]
        assert scalars == [(step, float32(value)) for step, value in pairs], name
    result = result_json(out)
    [final] = events.Scalars("result/final_val_loss")
    assert (final.step, final.value) == (STEPS, float32(result["final_val_loss"]))
    texts = events.Tensors("config/text_summary")
    text = texts[-1].tensor_proto.string_val[0].decode()
    assert json.loads(text.removeprefix("```json\n").removesuffix("\n```")) == expected_config(out)


@pytest.mark.slow  # two spawned pool workers start torch: ~30 s on 2 cores
@pytest.mark.trackers
def test_pool_workers_track_their_runs(tmp_path: Path) -> None:
    """Runs trained in pool workers (a pickled trainer in spawned processes) are tracked as in
    this process: one event directory per run, holding that run's metrics.jsonl."""
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logs = tmp_path / "tb"
    spec = write_spec(tmp_path, f'{{ kind = "tensorboard", log_dir = "{logs}" }}')
    text = spec.read_text().replace("threads = 1\n", "threads = 1\nseeds = [0, 1]\n")
    spec.write_text(text + '\n[launch]\nkind = "pool"\nworkers = 2\nthreads = 1\n')
    out = tmp_path / "run"
    result = CliRunner().invoke(cli, ["run", str(spec), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "on 2 pool workers" in result.output
    trained = ["uniform/seed-1", "cosine/seed-0", "cosine/seed-1"]  # uniform/seed-0: reused
    found = sorted(str(p.relative_to(logs / NAME)) for p in (logs / NAME).glob("*/seed-*"))
    assert found == sorted([*trained, "reference/seed-0"])
    for name in trained:
        events = EventAccumulator(str(logs / NAME / name), size_guidance={"scalars": 0})
        events.Reload()
        loss = metrics_series(out / "arms" / name)["loss"]
        assert [(s.step, s.value) for s in events.Scalars("loss")] == [
            (step, struct.unpack("f", struct.pack("f", value))[0]) for step, value in loss
        ], name


# -- Weights & Biases ---------------------------------------------------------------------------


def wandb_records(path: Path) -> Iterator[Any]:
    """The records of a W&B run file (``run-<id>.wandb``), decoded with wandb's own protobuf
    messages. wandb has no Python reader any more (its Go core reads these files); the framing is
    LevelDB's log format with W&B's header, each chunk checked against its CRC-32."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    ident, magic, version = struct.unpack("<4sHB", data[:7])
    assert (ident, magic, version) == (b":W&B", 0xBEE1, 0)
    block, position, pending = 32768, 7, b""
    while position + 7 <= len(data):
        left = block - position % block
        if left < 7:  # a block's tail too short for a chunk header is padding
            position += left
            continue
        checksum, length, kind = struct.unpack("<IHB", data[position : position + 7])
        if (checksum, length, kind) == (0, 0, 0):
            position += left
            continue
        chunk = data[position + 7 : position + 7 + length]
        position += 7 + length
        assert zlib.crc32(chunk, zlib.crc32(bytes([kind]))) == checksum
        pending = chunk if kind in (1, 2) else pending + chunk  # FULL/FIRST start a record
        if kind in (1, 4):  # FULL, LAST end one
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            yield record


@pytest.mark.trackers
def test_wandb_offline_run_holds_metrics_jsonl_and_the_result(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("wandb")
    for name, value in {
        "WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_DISABLE_GIT": "true",
        "WANDB_DISABLE_CODE": "true", "WANDB_CONSOLE": "off", "WANDB_API_KEY": "",
    }.items():  # fmt: skip
        monkeypatch.setenv(name, value)
    wandb_dir = tmp_path / "wb"
    tracker = f'{{ kind = "wandb", mode = "offline", project = "p", dir = "{wandb_dir}" }}'
    out = interrupted_then_resumed(tmp_path, tracker)
    files = sorted((wandb_dir / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(files) == 2  # one per session, the same run id (wandb sync joins them)
    run_id = tracker_run_id(NAME, "uniform/seed-0", run_key(out))
    assert {f.name for f in files} == {f"run-{run_id}.wandb"}
    logged: dict[str, list[tuple[int, float]]] = {}
    summary: dict[str, Any] = {}
    runs = []
    for path in files:  # in time order (the folder names start with the time)
        for record in wandb_records(path):
            kind = record.WhichOneof("record_type")
            if kind == "run":
                runs.append(record.run)
            elif kind == "history":
                row = {
                    item.nested_key[0] if item.nested_key else item.key: json.loads(item.value_json)
                    for item in record.history.item
                }
                for name, value in row.items():
                    if not name.startswith("_") and name != "step":
                        logged.setdefault(name, []).append((row["step"], value))
            elif kind == "summary":
                for item in record.summary.update:
                    key = item.nested_key[0] if item.nested_key else item.key
                    summary[key] = json.loads(item.value_json)
    assert [(r.run_id, r.display_name, r.run_group, r.project) for r in runs] == [
        (run_id, "uniform/seed-0", NAME, "p")
    ] * 2
    config = {u.key: json.loads(u.value_json) for u in runs[-1].config.update if u.key != "_wandb"}
    assert config == expected_config(out)
    table = metrics_table(out)
    assert set(logged) == set(table)
    for name, pairs in logged.items():
        assert last_per_step(pairs) == table[name], name
    assert summary["result/final_val_loss"] == result_json(out)["final_val_loss"]


@pytest.mark.trackers
def test_wandb_online_without_credentials_warns_once_and_training_finishes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("wandb")
    for name in ("WANDB_API_KEY", "WANDB_MODE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc, no wandb settings of the user's
    monkeypatch.setenv("WANDB_SILENT", "true")
    out = tmp_path / "run"
    tracker = f'{{ kind = "wandb", mode = "online", dir = "{tmp_path / "wb"}" }}'
    output = train(write_spec(tmp_path, tracker), out)
    assert output.count("tracker wandb") == 1, output
    assert "training goes on without it" in output
    assert math.isfinite(result_json(out)["final_val_loss"])


# -- MLflow -------------------------------------------------------------------------------------


@pytest.mark.trackers
def test_mlflow_file_store_holds_metrics_jsonl_and_the_result(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 keeps file stores behind this
    store = (tmp_path / "mlruns").as_uri()
    out = interrupted_then_resumed(tmp_path, f'{{ kind = "mlflow", tracking_uri = "{store}" }}')
    client = MlflowClient(tracking_uri=store)
    experiment = client.get_experiment_by_name(NAME)
    assert experiment is not None
    [run] = client.search_runs([experiment.experiment_id])  # the resume continued the same run
    assert run.info.run_name == "uniform/seed-0"
    assert run.info.status == "FINISHED"
    assert run.data.tags["geospec.run_id"] == tracker_run_id(NAME, "uniform/seed-0", run_key(out))
    texts = ("arm", "run_key")  # strings as they are; the rest as JSON
    params = {k: v if k in texts else json.loads(v) for k, v in run.data.params.items()}
    assert params == expected_config(out)
    table = metrics_table(out)
    for name, by_step in table.items():
        history = client.get_metric_history(run.info.run_id, name)
        assert last_per_step([(m.step, m.value) for m in history]) == by_step, name
    [final] = client.get_metric_history(run.info.run_id, "result/final_val_loss")
    assert (final.step, final.value) == (STEPS, result_json(out)["final_val_loss"])


@pytest.mark.trackers
def test_mlflow_at_an_unreachable_server_warns_once_and_training_finishes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("mlflow")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")  # fail at once, not after backoff
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")
    out = tmp_path / "run"
    tracker = '{ kind = "mlflow", tracking_uri = "http://127.0.0.1:9" }'  # nothing listens
    output = train(write_spec(tmp_path, tracker), out)
    assert output.count("tracker mlflow") == 1, output
    assert "training goes on without it" in output
    assert math.isfinite(result_json(out)["final_val_loss"])
