"""The report rebuilt from a run directory's artifacts (written here by hand)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from geospec.cli import cli
from geospec.engine.model_size import Shape, count_params
from geospec.report.write import write_report

LOSSES = {
    "uniform": {0: 4.80, 1: 4.83, 2: 4.79},
    "taper": {0: 4.78, 1: 4.80, 2: 4.80},
}
WIDTHS = {"uniform": [64, 64, 64, 64], "taper": [96, 80, 48, 32]}
CONFIG = {
    "vocab_size": 300,
    "n_layers": 4,
    "d_model": 32,
    "n_heads": 4,
    "seq_len": 16,
    "activation": "gelu",
    "norm": "layernorm",
    "positions": "learned",
    "rope_theta": 1e4,
    "bias": True,
    "tie_embeddings": True,
    "dropout": 0.0,
}


def make_run(run_dir: Path) -> None:
    run_dir.mkdir()
    (run_dir / "run.json").write_text(
        json.dumps(
            {
                "name": "synthetic",
                "baseline": "uniform",
                "confidence": 0.95,
                "bootstrap": 1000,
                "arms": [{"name": a, "schedule": {"kind": a}} for a in LOSSES],
                "seeds": [0, 1, 2],
            }
        )
    )
    (run_dir / "widths.json").write_text(
        json.dumps(
            {"arms": {a: {"widths": w, "ffn_params": 0} for a, w in WIDTHS.items()}, "pending": []}
        )
    )
    (run_dir / "profiles.json").write_text(
        json.dumps(
            {"profiles": {"topology/hyperbolic": [4.0, 3.0, 2.0, 1.0], "gw/raw": [1, 2, 3, 4]}}
        )
    )
    for arm, losses in LOSSES.items():
        for seed, loss in losses.items():
            out = run_dir / "arms" / arm / f"seed-{seed}"
            out.mkdir(parents=True)
            (out / "result.json").write_text(json.dumps({"final_val_loss": loss}))
            (out / "config.json").write_text(json.dumps({**CONFIG, "ffn_widths": WIDTHS[arm]}))
            rows = [{"step": s, "val_loss": loss + 1 / s} for s in (10, 20, 30)]
            # a line cut short by a crash must not break the report
            (out / "metrics.jsonl").write_text(
                "\n".join(json.dumps(r) for r in rows) + '\n{"step": 4'
            )


def test_results_match_per_seed_metrics(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    make_run(run_dir)
    results = write_report(run_dir)
    on_disk = json.loads((run_dir / "results.json").read_text())
    assert on_disk == json.loads(json.dumps(results))
    taper = results["arms"]["taper"]
    values = list(LOSSES["taper"].values())
    assert taper["val_loss"]["mean"] == pytest.approx(np.mean(values))
    assert taper["val_loss"]["sd"] == pytest.approx(np.std(values, ddof=1))
    diffs = [LOSSES["taper"][s] - LOSSES["uniform"][s] for s in range(3)]
    assert taper["vs_uniform"]["mean"] == pytest.approx(np.mean(diffs))
    low, high = taper["vs_uniform"]["ci95"]
    assert low < np.mean(diffs) < high
    assert taper["vs_uniform"]["improved"] == 2 and taper["vs_uniform"]["n"] == 3
    assert results["arms"]["uniform"]["vs_uniform"] is None
    shape = Shape(4, 32, 4, 300, 16)
    assert taper["params"] == count_params(shape, WIDTHS["taper"])
    assert results["equal_params"] is True
    for name in ("profiles.png", "widths.png", "val_loss.png", "differences.png"):
        assert (run_dir / "plots" / name).stat().st_size > 1000
    report = (run_dir / "report.md").read_text()
    assert "| taper |" in report and "plots/val_loss.png" in report


def test_checks_read_every_runs_fingerprint(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    make_run(run_dir)
    assert set(write_report(run_dir)["checks"].values()) == {None}  # no run recorded one

    def fingerprint(arm: str, seed: int) -> dict[str, object]:
        return {
            "config": {**CONFIG, "ffn_widths": WIDTHS[arm]},
            "data": "abc",
            "seed": seed,
            "steps": 100,
            "batch_size": 8,
            "optimizer": [3e-3, 0.1, 5, 0.1, [0.9, 0.95], 1e-8, 1.0],
            "eval_tokens": None,
        }

    def record(arm: str, directory_seed: int, **changes: object) -> None:
        path = run_dir / "arms" / arm / f"seed-{directory_seed}" / "result.json"
        loss = LOSSES[arm][directory_seed]
        stamp = {**fingerprint(arm, directory_seed), **changes}
        path.write_text(json.dumps({"final_val_loss": loss, "fingerprint": stamp}))

    for arm in LOSSES:
        for seed in range(3):
            record(arm, seed)
    checks = write_report(run_dir)["checks"]
    assert checks == dict.fromkeys(checks, True)  # widths may differ: they are the experiment
    assert "✗" not in (run_dir / "report.md").read_text()

    record("taper", 1, eval_tokens=4096)  # validated on other tokens
    record("taper", 2, seed=0)  # seed-2 directory trained with seed 0: not paired
    record("uniform", 0, steps=99)
    checks = write_report(run_dir)["checks"]
    assert checks == {
        "same_data_and_validation": False,
        "same_training": False,
        "same_shape_apart_from_widths": True,
        "seeds_paired": False,
    }
    assert (run_dir / "report.md").read_text().count("not so") == 3


def test_report_command(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    make_run(run_dir)
    result = CliRunner().invoke(cli, ["report", str(run_dir), "--no-plots"])
    assert result.exit_code == 0, result.output
    assert "taper" in result.output


def test_report_on_a_directory_that_is_not_a_run(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["report", str(tmp_path)])
    assert result.exit_code == 2
    assert "not a geospec run directory" in result.output
