"""``--set dotted.key=value``: spec values changed on the command line, validated exactly like
the file (torch-free: the core session runs it)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import tomlkit
from click.testing import CliRunner

from geospec.cli import cli
from geospec.errors import SpecError
from geospec.spec.loading import load_spec
from geospec.testing import minimal_spec


@pytest.fixture
def spec_file(tmp_path: Path) -> Path:
    arms = [
        {"name": "uniform", "schedule": {"kind": "uniform"}},
        {"name": "cosine", "schedule": {"kind": "cosine", "start": 1.5, "end": 0.5}},
    ]
    path = tmp_path / "spec.toml"
    path.write_text(tomlkit.dumps(minimal_spec(arms=arms)))
    return path


def test_overrides_set_values_of_every_type(spec_file: Path) -> None:
    spec = load_spec(
        spec_file,
        [
            "train.lr=1e-4",
            "train.seeds=[0, 1, 2]",
            "arms[1].schedule.start=1.2",
            "name=renamed",  # not TOML: a bare word is a string
            'out="runs/elsewhere"',
            "diagnose.enabled=true",  # a table the file does not have
            'arms[0].schedule={ kind = "linear", start = 1.1, end = 0.9 }',
        ],
    )
    assert spec.train.lr == 1e-4 and spec.train.seeds == [0, 1, 2]
    assert spec.arms[1].schedule.start == 1.2  # type: ignore[attr-defined]
    assert spec.arms[0].schedule.kind == "linear"
    assert spec.name == "renamed" and spec.out == "runs/elsewhere" and spec.diagnose.enabled
    assert load_spec(spec_file).train.lr != 1e-4  # the file is untouched


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("train.lrr=1e-3", "train.lrr: unknown key; did you mean 'lr'?"),
        ("train.lr=-1", "train.lr"),
        ("arms[1].schedule.start=big", "arms[1].schedule.start"),
        ("arms[5].name=x", "--set arms[5].name: index [5] is beyond the list (it has 2 entries)"),
        ("noequals", "--set 'noequals': give dotted.key=value"),
        ("train..lr=1", "--set train..lr: '' is not a key"),
        ("name.first=x", "'first' is set inside a str, not a table"),
    ],
)
def test_a_bad_override_names_its_key(spec_file: Path, override: str, message: str) -> None:
    with pytest.raises(SpecError) as error:
        load_spec(spec_file, [override])
    assert message in str(error.value)


def test_the_cli_takes_repeated_overrides_and_exits_2_on_a_bad_one(spec_file: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(
        cli, ["widths", str(spec_file), "--json", "--set", "model.ffn_width=128", "--set",
              "arms[1].schedule.start=1.25"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    widths = json.loads(result.output)["arms"]
    assert sum(widths["uniform"]["widths"]) == 4 * 128 and widths["cosine"]["widths"][0] > 128
    bad = runner.invoke(cli, ["validate", str(spec_file), "--set", "train.stepz=5"])
    assert bad.exit_code == 2 and "train.stepz: unknown key" in bad.output
    assert "Traceback" not in bad.output
    for command in ("run", "validate", "widths", "train", "diagnose", "demand", "prune", "eval"):
        help_text = runner.invoke(cli, [command, "--help"]).output
        assert "--set KEY=VALUE" in help_text, command


@pytest.mark.torch
def test_spec_resolved_toml_records_the_overrides(tmp_path: Path) -> None:
    """What a run was run with is on record: the resolved spec holds the overridden values."""
    pytest.importorskip("torch")
    from small_spec import write_small_spec

    spec = write_small_spec(tmp_path, "overrides", {"steps": 2}, out=str(tmp_path / "run"))
    result = CliRunner().invoke(
        cli,
        ["run", str(spec), "--until", "reference", "--set", "reference.train_steps=3",
         "--set", "train.lr=2e-3"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    resolved = tomlkit.parse((tmp_path / "run" / "spec.resolved.toml").read_text())
    assert resolved["reference"]["train_steps"] == 3 and resolved["train"]["lr"] == 2e-3


def test_validate_json_prints_the_fully_resolved_spec(tmp_path: Path) -> None:
    from geospec.spec.sections import TrainSpec

    arms = [
        {"name": "uniform", "schedule": {"kind": "uniform"}},
        {"name": "g", "schedule": {"kind": "geometric", "profile": "shift/spherical"}},
    ]
    spec = minimal_spec(arms=arms)
    del spec["measure"]  # "all": every registered pair
    path = tmp_path / "spec.toml"
    path.write_text(tomlkit.dumps(spec))
    result = CliRunner().invoke(cli, ["validate", str(path), "--json", "--set", "train.steps=7"])
    assert result.exit_code == 0, result.output
    resolved = json.loads(result.output)
    assert resolved["train"]["steps"] == 7
    assert resolved["train"]["lr"] == TrainSpec.model_fields["lr"].default  # defaults filled in
    solver = resolved["arms"][1]["schedule"]["solver"]
    assert solver == {"kind": "power_law", "min_ratio": 0.25, "max_ratio": 2.0, "a": 1.0}
    pairs = {(m["statistic"]["kind"], m["geometry"]["kind"]) for m in resolved["measure"]}
    assert len(pairs) == 9 and ("shift", "spherical") in pairs
