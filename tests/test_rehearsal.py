"""The dry run of a spec's shapes (``geospec rehearse``, ``geospec run --dry-run``): every arm
built at full size and stepped here; parameters against the closed-form count, memory at least
the training state that must be resident, GPU cost against docs/engine.md's table."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import tomlkit
from click.testing import CliRunner

from geospec.cli import cli
from geospec.engine.rehearsal import STATE_BYTES_PER_PARAM, dry_run_vocab, gpu_cost
from geospec.shapes.model_size import Shape, count_params
from geospec.solve.widths import compute_widths
from geospec.spec.loading import load_spec
from geospec.testing import minimal_spec

pytestmark = [pytest.mark.torch, pytest.mark.filterwarnings("ignore::DeprecationWarning")]

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    ("name", "mfu", "hours"),
    [("121m", 0.30, 1.75), ("256m", 0.35, 6.1), ("440m", 0.35, 19.1)],
)
def test_gpu_hours_are_those_of_the_cost_table(name: str, mfu: float, hours: float) -> None:
    """docs/engine.md: 6 x N x tokens at the MFU given, of 989 TFLOP/s, per run."""
    spec = load_spec(ROOT / "specs" / f"{name}.toml")
    widths = [spec.model.ffn_width] * spec.model.n_layers
    params = count_params(Shape.of(spec.model, vocab_size=dry_run_vocab(spec)), widths)
    steps = -(-(spec.train.tokens or 0) // (spec.train.batch_size * spec.model.seq_len))
    tokens = steps * spec.train.batch_size * spec.model.seq_len
    _, estimated = gpu_cost(params, tokens, mfu, 989.0)
    assert estimated == pytest.approx(hours, abs=0.05)


def check_rows(spec_path: Path, rows: list[dict[str, Any]]) -> None:
    spec = load_spec(spec_path)
    vocab = dry_run_vocab(spec)
    pending = compute_widths(spec.model, spec.arms, {}).pending
    assert [row["arm"] for row in rows] == [arm.name for arm in spec.arms]
    budget = spec.model.n_layers * spec.model.ffn_width
    for row in rows:
        assert sum(row["widths"]) == budget and len(row["widths"]) == spec.model.n_layers
        assert row["stand_in"] == (row["arm"] in pending)
        assert row["params"] == count_params(Shape.of(spec.model, vocab_size=vocab), row["widths"])
        # weights, gradients and AdamW's two moments are resident at once after a step
        assert row["peak_memory"] >= STATE_BYTES_PER_PARAM * row["params"]
        assert row["step_seconds"] > 0
        assert row["gpu_state_bytes"] == STATE_BYTES_PER_PARAM * row["params"]


def rehearsed(spec: Path, *options: str) -> dict[str, Any]:
    result = CliRunner().invoke(cli, ["rehearse", str(spec), "--json", *options])
    assert result.exit_code == 0, result.output
    figures: dict[str, Any] = json.loads(result.output[result.output.index("{") :])
    return figures


def small_spec(directory: Path) -> Path:
    """A small model with an arm of fixed widths and one that needs a measured profile."""
    spec = minimal_spec(
        out=str(directory / "run"), measure=[{"geometry": "raw", "statistic": "shift"}]
    )
    spec["arms"] = [
        {"name": "uniform", "schedule": {"kind": "uniform"}},
        {"name": "shift", "schedule": {"kind": "geometric", "profile": "shift/raw"}},
    ]
    path = directory / "spec.toml"
    path.write_text(tomlkit.dumps(spec))
    return path


def test_every_arm_is_built_and_stepped(tmp_path: Path) -> None:
    spec = small_spec(tmp_path)
    figures = rehearsed(spec, "--steps", "1", "--context", "8", "--mfu", "0.5")
    check_rows(spec, figures["arms"])
    assert [row["stand_in"] for row in figures["arms"]] == [False, True]
    assert figures["assumed"]["mfu"] == 0.5
    hours = sum(row["gpu_hours"] for row in figures["arms"]) * len(load_spec(spec).train.seeds)
    assert figures["gpu_hours"] == pytest.approx(hours)


@pytest.mark.slow
def test_the_121m_spec_at_full_size() -> None:
    """124,475,904 parameters per arm (the spec's comment), 2 GB of training state and more."""
    spec = ROOT / "specs" / "121m.toml"
    check_rows(spec, rehearsed(spec, "--steps", "1", "--context", "8")["arms"])


def test_run_dry_run_writes_nothing(tmp_path: Path) -> None:
    path = small_spec(tmp_path)
    result = CliRunner().invoke(cli, ["run", str(path), "--dry-run"])
    assert result.exit_code == 0, result.output
    assert "dry run of test" in result.output and "GPU-hours of training" in result.output
    assert "35% MFU of 989 TFLOP/s" in result.output and "(stand-in)" in result.output
    assert not (tmp_path / "run").exists()
    result = CliRunner().invoke(cli, ["rehearse", str(path), "--mfu", "35"])
    assert result.exit_code == 2 and "--mfu 35.0: give a fraction" in result.output
