"""Preemption: a real `geospec train` process sent SIGUSR1 or SIGTERM checkpoints the step it is
at, exits with the requeue status, and the resumed run ends with the uninterrupted run's loss."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from small_spec import small_spec

from geospec.engine.checkpoint import read_checkpoint
from geospec.engine.model import GPTConfig, config_from_spec
from geospec.engine.token_data import TokenData, prepare_data
from geospec.engine.train import train_model
from geospec.errors import REQUEUE_EXIT_CODE, Preempted
from geospec.spec.loading import load_spec
from geospec.spec.sections import TrainSpec

pytestmark = pytest.mark.torch

STEPS = 120
#: The only checkpoint is the signal's (checkpoint_interval is never reached).
SPEC = small_spec(
    "preempt",
    {"steps": STEPS, "checkpoint_interval": 1000, "log_interval": 1},
    arms=("uniform",),
)


def command(spec: Path, out: Path) -> list[str]:
    return [sys.executable, "-m", "geospec", "train", str(spec), "--arm", "uniform",
            "--seed", "0", "--out", str(out)]  # fmt: skip


def env() -> dict[str, str]:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


def logged_steps(out: Path) -> int:
    try:
        lines = (out / "metrics.jsonl").read_text().splitlines()
    except FileNotFoundError:
        return 0
    return sum(1 for line in lines if line.endswith("}") and '"loss"' in line)


@pytest.mark.slow  # two geospec processes and a third training: ~30 s on 2 cores
@pytest.mark.parametrize("signum", [signal.SIGUSR1, signal.SIGTERM])
def test_a_signalled_run_checkpoints_exits_for_requeue_and_resumes_to_the_same_loss(
    signum: signal.Signals, tmp_path: Path
) -> None:
    spec_path = tmp_path / "spec.toml"
    spec_path.write_text(SPEC)
    out = tmp_path / "run"
    process = subprocess.Popen(
        command(spec_path, out), env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    deadline = time.monotonic() + 120
    while logged_steps(out) < 3:  # training has started
        assert process.poll() is None, process.stderr.read().decode() if process.stderr else ""
        assert time.monotonic() < deadline
        time.sleep(0.01)
    process.send_signal(signum)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == REQUEUE_EXIT_CODE, stderr.decode()
    assert f"stopped by {signum.name}" in " ".join(stderr.decode().split())
    found = read_checkpoint(out)
    assert found is not None
    step = int(found[1]["step"])
    assert 3 <= step < STEPS  # the step it was at, not an interval's
    assert not (out / "result.json").exists()

    resumed = subprocess.run(command(spec_path, out), env=env(), capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr
    result = json.loads((out / "result.json").read_text())

    spec = load_spec(spec_path)
    data = prepare_data(spec.data, tmp_path / "data", spec_dir=tmp_path)
    config = config_from_spec(spec.model, [64, 64], data.vocab_size)
    threads = torch.get_num_threads()
    try:
        straight = train_model(spec.train, config, data, tmp_path / "straight", 0, progress=False)
    finally:
        torch.set_num_threads(threads)
    assert result["final_val_loss"] == straight.final_val_loss
    assert (
        result["checksums"]
        == json.loads((tmp_path / "straight" / "result.json").read_text())["checksums"]
    )  # the same weights, bit for bit
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "loss" in r] == list(range(1, STEPS + 1))


def in_process_run(tmp_path: Path) -> tuple[TrainSpec, TokenData, GPTConfig, Path]:
    """The small spec's training, data and a 2-layer model, and the run directory to train in."""
    spec_path = tmp_path / "spec.toml"
    spec_path.write_text(SPEC)
    spec = load_spec(spec_path)
    data = prepare_data(spec.data, tmp_path / "data", spec_dir=tmp_path)
    config = config_from_spec(spec.model, [64, 64], data.vocab_size)
    return spec.train, data, config, tmp_path / "run"


def signal_after_two_steps(out: Path) -> threading.Thread:
    """A thread that sends SIGUSR1 to this process once the run in ``out`` has logged 2 steps."""

    def signal_when_started() -> None:
        while logged_steps(out) < 2:
            time.sleep(0.002)
        os.kill(os.getpid(), signal.SIGUSR1)

    sender = threading.Thread(target=signal_when_started, daemon=True)
    sender.start()
    return sender


def test_a_signal_to_this_process_stops_training_at_its_step_and_the_resume_matches(
    tmp_path: Path,
) -> None:
    """The same in one process (fast): SIGUSR1 sent to this process while it trains."""
    train, data, config, out = in_process_run(tmp_path)
    train = train.model_copy(update={"steps": 40})
    threads = torch.get_num_threads()
    sender = signal_after_two_steps(out)
    try:
        with pytest.raises(Preempted, match="stopped by SIGUSR1") as stopped:
            train_model(train, config, data, out, 0, progress=False)
        sender.join()
        assert stopped.value.exit_code == REQUEUE_EXIT_CODE
        found = read_checkpoint(out)
        assert found is not None and 2 <= int(found[1]["step"]) < 40
        assert signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL  # handlers restored
        resumed = train_model(train, config, data, out, 0, progress=False)
        straight = train_model(train, config, data, tmp_path / "straight", 0, progress=False)
    finally:
        torch.set_num_threads(threads)
    assert resumed.final_val_loss == straight.final_val_loss


def test_result_json_records_each_setting_a_run_computed_under(tmp_path: Path) -> None:
    """A run stopped under 1 CPU thread and resumed under 2 lists both settings, in order, apart
    from its fingerprint; rewriting result.json from the final checkpoint computes nothing and
    adds no setting."""
    train, data, config, out = in_process_run(tmp_path)

    def setting(threads: int) -> dict[str, object]:
        return {
            "device": "cpu", "threads": threads, "processes": 1, "precision": "fp32",
            "compiled": False, "torch": torch.__version__,
        }  # fmt: skip

    before = torch.get_num_threads()
    sender = signal_after_two_steps(out)
    try:
        one = train.model_copy(update={"steps": 40, "threads": 1})
        with pytest.raises(Preempted):
            train_model(one, config, data, out, 0, progress=False)
        sender.join()
        two = one.model_copy(update={"threads": 2})
        train_model(two, config, data, out, 0, progress=False)
        result = json.loads((out / "result.json").read_text())
        assert result["execution"] == [setting(1), setting(2)]
        assert "execution" not in result["fingerprint"]  # the same experiment either way

        (out / "result.json").unlink()  # finished again from its final checkpoint
        train_model(one, config, data, out, 0, progress=False)
        assert json.loads((out / "result.json").read_text())["execution"] == result["execution"]
    finally:
        torch.set_num_threads(before)
