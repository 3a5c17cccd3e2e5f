"""A finished unit's model is written again (an export asked for after the unit was computed,
What to ship's files of the recommended model) from the unit's own records: its
``cut.safetensors`` (every layer's neuron order, a mean compensation's means) and its
``repair.safetensors``, without scoring its calibration sample again (OBS takes minutes a seed
on Qwen). The model so written equals the one written while the unit was computed; a unit
recorded before ``cut.safetensors`` existed is scored again and gets one."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file
from test_prune import invoke, prune_spec

import geospec.prune.calibration
from geospec.prune.cut import load_cut
from geospec.rundir.layout import CUT_FILE

pytestmark = [pytest.mark.torch, pytest.mark.usefixtures("one_torch_thread")]

ARMS = [
    {"name": "uniform", "schedule": {"kind": "uniform"}},
    {"name": "flap-mean", "schedule": {"kind": "flap"}, "repair": "mean"},
    {"name": "obs-lstsq", "schedule": {"kind": "uniform"}, "importance": {"kind": "obs"},
     "repair": "lstsq"},
]  # fmt: skip
NAMES = [arm["name"] for arm in ARMS]


def spec_in(directory: Path, export: bool) -> Path:
    return prune_spec(directory, arms=ARMS, keep=0.5, export=export,
                      calibration={"windows": 8, "seeds": [0]},
                      select={"windows": 4, "runtime": False})  # fmt: skip


def unit(directory: Path, arm: str) -> Path:
    return directory / "run" / "prune" / "keep-0.5" / arm / "seed-0"


def weights(model_dir: Path) -> dict[str, torch.Tensor]:
    found: dict[str, torch.Tensor] = {}
    for path in sorted(model_dir.glob("*.safetensors")):
        found.update(load_file(path))
    return found


def counted(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Every calibration sample scored from here on (the real scoring, counted)."""
    calls: list[int] = []
    real: Callable[..., Any] = geospec.prune.calibration.calibrated

    def scoring(*args: Any, **kwargs: Any) -> Any:
        calls.append(args[6])  # the seed
        return real(*args, **kwargs)

    monkeypatch.setattr(geospec.prune.calibration, "calibrated", scoring)
    return calls


@pytest.fixture(scope="module")
def from_scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every unit's model written while the unit is computed."""
    directory = tmp_path_factory.mktemp("scratch")
    invoke("prune", str(spec_in(directory, export=True)))
    return directory


def test_each_unit_records_its_orders_and_a_mean_arm_its_means(from_scratch: Path) -> None:
    for arm in NAMES:
        key = json.loads((unit(from_scratch, arm) / "result.json").read_text())["key"]
        cut, problem = load_cut(unit(from_scratch, arm) / CUT_FILE, key, [64, 64, 64])
        assert problem is None and cut is not None
        assert all(sorted(order) == list(range(64)) for order in cut.orders)
        assert (cut.means is not None) == (arm == "flap-mean")
        assert cut.refits is None  # the re-fits are repair.safetensors
    assert load_cut(unit(from_scratch, "uniform") / CUT_FILE, "another", [64] * 3)[0] is None


def test_a_later_export_writes_the_same_models_without_scoring_again(
    from_scratch: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Computed without exports, then exported (every unit by prune.export, one by --export):
    the calibration sample is not scored again and every model equals the one written while
    its unit was computed, weight for weight."""
    spec = spec_in(tmp_path, export=False)
    invoke("prune", str(spec))
    assert not any((unit(tmp_path, arm) / "model").exists() for arm in NAMES)
    calls = counted(monkeypatch)
    invoke("prune", str(spec), "--export", "obs-lstsq@0.5", "--to", str(tmp_path / "obs"))
    invoke("prune", str(spec), "--set", "prune.export=true")
    assert calls == []
    for arm in NAMES:
        expected = weights(unit(from_scratch, arm) / "model")
        found = weights(unit(tmp_path, arm) / "model")
        assert found.keys() == expected.keys()
        for name, tensor in expected.items():
            assert torch.equal(found[name], tensor), (arm, name)
    obs = weights(tmp_path / "obs")
    assert all(
        torch.equal(obs[n], t)
        for n, t in weights(unit(from_scratch, "obs-lstsq") / "model").items()
    )


def test_what_to_ship_measures_again_without_scoring_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What to ship writes the recommended model into a scratch directory to measure its files:
    from the unit's records, to the same bytes, with no calibration sample scored."""
    spec = spec_in(tmp_path, export=False)
    invoke("prune", str(spec))
    shipped = tmp_path / "run" / "prune" / "keep-0.5" / "shipped.json"
    before = json.loads(shipped.read_text())
    shipped.unlink()
    calls = counted(monkeypatch)
    output = invoke("prune", str(spec))
    assert "measuring what the recommended" in output and calls == []
    assert json.loads(shipped.read_text()) == before


def test_a_unit_recorded_before_its_orders_were_is_scored_again_to_the_same_model(
    from_scratch: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run directory from before cut.safetensors: its units' models are written by scoring
    the calibration sample again (once per seed), the same models, and the records written."""
    spec = spec_in(tmp_path, export=False)
    invoke("prune", str(spec))
    for arm in NAMES:
        (unit(tmp_path, arm) / CUT_FILE).unlink()
    calls = counted(monkeypatch)
    invoke("prune", str(spec), "--set", "prune.export=true")
    assert calls == [0]
    for arm in NAMES:
        assert (unit(tmp_path, arm) / CUT_FILE).is_file()
        expected = weights(unit(from_scratch, arm) / "model")
        found = weights(unit(tmp_path, arm) / "model")
        assert all(torch.equal(found[name], tensor) for name, tensor in expected.items())
