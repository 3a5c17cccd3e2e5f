"""A training run's state, cadence and identity: what a checkpoint saves is what a resumed run
needs (a run stopped between checkpoints resumes to the uninterrupted run, loss for loss and byte
for byte), the trainer state keeps the keys earlier versions wrote and read, the steps that log,
evaluate and checkpoint are the ones the spec's intervals say, and the fingerprint and run keys
come from TrainSpec's field markers exactly as the hand-kept lists of earlier versions made them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import pytest
import torch
from rich.console import Console

from geospec.engine.cadence import Cadence
from geospec.engine.checkpoint import read_checkpoint, tensor_digest
from geospec.engine.distributed import DistContext
from geospec.engine.identity import fingerprint, weights_digest
from geospec.engine.model import GPT, GPTConfig, config_from_spec
from geospec.engine.token_data import TokenData, prepare_data
from geospec.engine.train import train_model
from geospec.engine.train_state import TrainState
from geospec.pipeline.context import RunContext
from geospec.pipeline.keys import BOOKKEEPING, arm_run_key, data_key, section
from geospec.pipeline.training import TrainingJob, train_into
from geospec.spec.sections import (
    ADDED_LATER,
    FINGERPRINT,
    DataSpec,
    Fingerprinted,
    ModelSpec,
    TrainSpec,
    marked,
)
from geospec.storage.digests import digest

pytestmark = pytest.mark.torch

MODEL = ModelSpec(n_layers=2, d_model=32, n_heads=2, ffn_width=64, seq_len=32, multiple_of=8)
DATA = DataSpec(
    source="bundled:austen", tokenizer={"kind": "bpe", "vocab_size": 300}, max_documents=100
)
#: Two micro-batches a step; a checkpoint every 7 steps, a row every 3, an evaluation every 10:
#: the three fall on different steps.
TRAIN = TrainSpec(
    steps=30, batch_size=4, micro_batch_size=2, lr=3e-3, warmup=3, eval_interval=10,
    eval_tokens=1024, checkpoint_interval=7, log_interval=3, threads=1,
)  # fmt: skip
WIDTHS = [48, 80]


@pytest.fixture(autouse=True)
def _restore_threads() -> Any:
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> TokenData:
    directory = tmp_path_factory.mktemp("tokens")
    return prepare_data(DATA, directory, spec_dir=directory)


def model_config(data: TokenData) -> GPTConfig:
    return config_from_spec(MODEL, WIDTHS, data.vocab_size)


class Killed(Exception):
    """The process running the training ended (as a kill would end it)."""


class KillAt:
    """An observer that ends training right after step ``step`` logged its loss: the steps since
    the last checkpoint are lost, as with a kill."""

    def __init__(self, step: int) -> None:
        self.step = step

    def start(self, fingerprint: dict[str, Any], step: int) -> None:
        pass

    def log(self, row: dict[str, Any]) -> None:
        if row["step"] == self.step and "loss" in row:
            raise Killed

    def end(self, result: dict[str, Any] | None) -> None:
        pass


def logged(out: Path) -> list[dict[str, Any]]:
    """metrics.jsonl's rows without their speed (the only value that depends on the clock)."""
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in row.items() if k != "tokens_per_s"} for row in rows]


def test_a_run_stopped_between_checkpoints_resumes_to_the_uninterrupted_run(
    data: TokenData, tmp_path: Path
) -> None:
    config = model_config(data)
    straight = train_model(TRAIN, config, data, tmp_path / "straight", 0, progress=False)
    out = tmp_path / "resumed"
    with pytest.raises(Killed):
        train_model(TRAIN, config, data, out, 0, progress=False, observer=KillAt(18))
    found = read_checkpoint(out)
    assert found is not None and found[1]["step"] == 14  # the last multiple of 7 before 18
    assert max(row["step"] for row in logged(out)) == 18  # rows the resume must drop
    resumed = train_model(TRAIN, config, data, out, 0, progress=False)

    assert resumed.final_val_loss == straight.final_val_loss
    assert logged(out) == logged(tmp_path / "straight")  # every loss, rate and validation loss
    assert (out / "model.safetensors").read_bytes() == (
        tmp_path / "straight" / "model.safetensors"
    ).read_bytes()
    ours, theirs = (read_checkpoint(d) for d in (out, tmp_path / "straight"))
    assert ours is not None and theirs is not None
    a, b = ours[1], theirs[1]
    assert tensor_digest(a["optimizer"]) == tensor_digest(b["optimizer"])
    assert tensor_digest(a["rng"]) == tensor_digest(b["rng"])
    plain = ("step", "sequences", "fingerprint", "last_val", "world_size", "executions")
    assert {k: a[k] for k in plain} == {k: b[k] for k in plain}
    assert (a["step"], a["sequences"], a["last_val"][0]) == (30, 30 * 4, 30)


#: The trainer state's keys, as every earlier version wrote them (and ``checksums``, which
#: :func:`geospec.engine.checkpoint.write_checkpoint` adds).
CHECKPOINT_KEYS = {
    "step", "sequences", "fingerprint", "optimizer", "rng", "train_seconds", "wall_seconds",
    "last_val", "world_size", "executions",
}  # fmt: skip


def test_the_trainer_state_keeps_the_keys_of_earlier_versions_and_reads_back() -> None:
    state = TrainState(
        step=12, train_seconds=3.5, wall_seconds=4.25, last_val=(10, 5.5),
        executions=[{"device": "cpu", "threads": 1}],
    )  # fmt: skip
    rng = [{"cpu": torch.get_rng_state()}]
    written = state.to_checkpoint(
        fingerprint={"seed": 1}, batch_size=8, world_size=1, optimizer={"state": {}}, rng=rng
    )
    assert set(written) == CHECKPOINT_KEYS
    assert written["sequences"] == 12 * 8
    assert TrainState.from_checkpoint(written) == state
    assert TrainState.fingerprint_of(written) == {"seed": 1}
    assert TrainState.optimizer_and_rng(written) == ({"state": {}}, rng)
    # a checkpoint of a geospec before it recorded the settings a run computed under
    older = {k: v for k, v in written.items() if k != "executions"}
    assert TrainState.from_checkpoint(older).executions == []
    assert TrainState.from_checkpoint({**written, "last_val": None}).last_val is None


def test_a_run_resumes_from_a_trainer_state_written_as_earlier_versions_wrote_it(
    data: TokenData, tmp_path: Path
) -> None:
    """The checkpoint rewritten without ``executions`` and ``checksums`` (geospec before it
    recorded either) resumes to the same weights."""
    config = model_config(data)
    train = TRAIN.with_steps(20)
    straight = train_model(train, config, data, tmp_path / "straight", 0, progress=False)
    out = tmp_path / "old"
    with pytest.raises(Killed):
        train_model(train, config, data, out, 0, progress=False, observer=KillAt(9))
    state_file = out / "trainer_state.pt"
    stored = torch.load(state_file, weights_only=True)
    older = {k: v for k, v in stored.items() if k not in ("executions", "checksums")}
    torch.save(older, state_file)
    resumed = train_model(train, config, data, out, 0, progress=False)
    assert resumed.final_val_loss == straight.final_val_loss
    assert (out / "model.safetensors").read_bytes() == (
        tmp_path / "straight" / "model.safetensors"
    ).read_bytes()


def test_the_cadence_logs_evaluates_and_checkpoints_at_the_spec_intervals() -> None:
    cadence = Cadence.of(TRAIN)  # log 3, evaluate 10, checkpoint 7, of 30 steps
    due = {step: cadence.due(step, 30) for step in range(1, 31)}
    assert [s for s, d in due.items() if d.evaluate] == [10, 20, 30]
    assert [s for s, d in due.items() if d.checkpoint] == [7, 14, 21, 28, 30]
    # a row wherever anything happens: the multiples of 3, and 7, 10, 14, 20, 28
    logs = sorted({*range(3, 31, 3), 7, 10, 14, 20, 28})
    assert [s for s, d in due.items() if d.log] == logs
    stopped = cadence.due(5, 30, stopping=True)  # a stop checkpoints the step it is at
    assert stopped.checkpoint and stopped.log and not stopped.evaluate
    at_end_only = Cadence(log=100, evaluate=0, checkpoint=100)
    assert [s for s in range(1, 31) if at_end_only.due(s, 30).evaluate] == [30]
    assert [s for s in range(1, 31) if at_end_only.due(s, 30).log] == [30]


def test_the_fingerprint_holds_the_marked_settings_as_earlier_versions_wrote_them(
    data: TokenData,
) -> None:
    train = TRAIN.model_copy(update={"betas": (0.8, 0.9), "weight_decay": 0.05})
    config = model_config(data)
    found = fingerprint(train, config, data, 3, 30)
    # the fingerprint earlier versions built by hand, entry by entry and in this order
    assert list(found.items()) == [
        ("config", config.to_dict()),
        ("data", data.key),
        ("tokens", data.digests),
        ("seed", 3),
        ("steps", 30),
        ("batch_size", 4),
        ("optimizer", [3e-3, 0.1, 3, 0.05, [0.8, 0.9], 1e-8, 1.0]),
        ("eval_tokens", 1024),
    ]
    bookkeeping = {"threads": 2, "log_interval": 1, "checkpoint_interval": 5}
    assert fingerprint(train.model_copy(update=bookkeeping), config, data, 3, 30) == found
    initial = GPT(config).state_dict()
    tuned = fingerprint(train, config, data, 3, 30, initial)
    assert list(tuned) == [*found, "initial"] and tuned["initial"] == weights_digest(initial)


def test_run_keys_see_the_bookkeeping_fields_at_their_defaults() -> None:
    assert set(BOOKKEEPING) == {"threads", "checkpoint_interval", "log_interval", "trackers"}
    assert not set(BOOKKEEPING) & set(marked(TrainSpec, Fingerprinted))
    # the key as earlier versions computed it, from their hand-kept list
    defaults = {"threads": None, "checkpoint_interval": 100, "log_interval": 10, "trackers": ()}
    settings = section(TRAIN.model_copy(update=defaults))
    settings.pop("seeds")
    by_hand = digest("train", section(MODEL), data_key(DATA), settings, WIDTHS, 0)
    assert arm_run_key(MODEL, DATA, TRAIN, WIDTHS, 0) == by_hand
    changed = TRAIN.model_copy(update={"threads": 2, "log_interval": 1, "checkpoint_interval": 5})
    assert arm_run_key(MODEL, DATA, changed, WIDTHS, 0) == by_hand
    assert arm_run_key(MODEL, DATA, TRAIN.model_copy(update={"lr": 1e-3}), WIDTHS, 0) != by_hand


def test_with_steps_replaces_the_budget() -> None:
    by_tokens = TRAIN.model_copy(update={"steps": None, "tokens": 10_000})
    assert by_tokens.with_steps(None) is by_tokens
    assert (by_tokens.with_steps(6).steps, by_tokens.with_steps(6).tokens) == (6, None)


def test_train_into_takes_one_job_and_the_form_of_earlier_versions_still_works(
    data: TokenData, tmp_path: Path
) -> None:
    run = RunContext(tmp_path, tmp_path, Console(quiet=True), DistContext(), "cpu")
    job = TrainingJob(tmp_path / "job", "k", WIDTHS, MODEL, TRAIN.with_steps(6), data, 0)
    result = train_into(run, job, progress=False)
    assert result is not None and result.steps == 6
    assert (tmp_path / "job" / "run_key.json").exists()
    with pytest.warns(DeprecationWarning, match="TrainingJob"):
        old = train_into(
            run, tmp_path / "old", "k", WIDTHS, model=MODEL, train=TRAIN, data=data, seed=0,
            steps=6, progress=False,
        )  # fmt: skip
    assert old is not None and old.final_val_loss == result.final_val_loss
    recorded = [
        json.loads((tmp_path / name / "result.json").read_text())["fingerprint"]
        for name in ("job", "old")
    ]
    assert recorded[0] == recorded[1]
    # a finished run of the same key is returned, not trained again
    assert train_into(run, job, progress=False) == result


class LaterTrain(TrainSpec):
    """A train section that gained a fingerprinted option after runs were recorded."""

    label_smoothing: Annotated[float, ADDED_LATER, FINGERPRINT] = 0.0


def test_a_fingerprinted_option_added_later_leaves_fingerprints_alone_at_its_default(
    data: TokenData,
) -> None:
    config = model_config(data)
    before = fingerprint(TRAIN, config, data, 0, 30)
    later = LaterTrain(**TRAIN.model_dump())
    assert fingerprint(later, config, data, 0, 30) == before
    changed = fingerprint(later.model_copy(update={"label_smoothing": 0.1}), config, data, 0, 30)
    assert changed == {**before, "label_smoothing": 0.1}
