"""``geospec run --arms ... --seeds ...``: a subset of the runs trained, the rest left for later,
and a report that says which runs are missing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from small_spec import write_small_spec

from geospec.cli import cli

pytestmark = pytest.mark.torch


def invoke(*args: str, code: int = 0) -> str:
    result = CliRunner().invoke(cli, list(args))
    assert result.exit_code == code, result.output + repr(result.exception)
    return result.output


def test_a_subset_is_trained_and_the_rest_later(tmp_path: Path) -> None:
    spec = write_small_spec(
        tmp_path, "subset", {"steps": 4, "seeds": [0, 1]}, out=str(tmp_path / "run")
    )
    output = invoke("run", str(spec), "--arms", "cosine", "--seeds", "1")
    arms = tmp_path / "run" / "arms"
    trained = sorted(str(p.parent.relative_to(arms)) for p in arms.glob("*/*/result.json"))
    assert trained == ["cosine/seed-1"]
    assert "not chosen by --arms/--seeds are untrained" in output
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert any(
        "not in these figures: uniform seeds 0, 1; cosine seed 0" in n for n in results["notes"]
    )
    # a plain run trains the rest and the report is whole
    output = invoke("run", str(spec))
    trained = sorted(str(p.parent.relative_to(arms)) for p in arms.glob("*/*/result.json"))
    assert trained == ["cosine/seed-0", "cosine/seed-1", "uniform/seed-0", "uniform/seed-1"]
    assert "arm cosine, seed 1" not in output  # not trained again
    assert "✓ train" in invoke("run", str(spec))


@pytest.mark.parametrize(
    ("option", "message"),
    [
        (["--arms", "cosine,nope"], "--arms: ['nope'] not among the spec's arms"),
        (["--seeds", "0,7"], "--seeds: [7] not in train.seeds"),
        (["--seeds", "one"], "--seeds 'one': give whole numbers"),
    ],
)
def test_a_choice_outside_the_spec_is_one_line(
    tmp_path: Path, option: list[str], message: str
) -> None:
    spec = write_small_spec(tmp_path, "subset", {"steps": 4}, out=str(tmp_path / "run"))
    output = invoke("run", str(spec), *option, code=2)
    assert message in output and "Traceback" not in output
    assert not (tmp_path / "run").exists()  # nothing done before the check
