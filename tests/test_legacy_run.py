"""A run directory made by an earlier geospec is reused, not retrained: run keys are stable.

tests/fixtures/legacy-run/run was made by ``geospec run legacy.toml`` at commit 6bdb48f (before the
package was laid out by pipeline stage); optimizer states, lock files and the token cache were
removed to keep it small (a finished run reads none of them).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from geospec.cli import cli

pytestmark = pytest.mark.torch

FIXTURE = Path(__file__).parent / "fixtures" / "legacy-run"


def test_run_directory_of_an_earlier_version_is_up_to_date(tmp_path: Path) -> None:
    shutil.copytree(FIXTURE, tmp_path / "legacy")
    run_dir = tmp_path / "legacy" / "run"
    before = json.loads((run_dir / "results.json").read_text())
    stages_before = (run_dir / "stages.json").read_text()
    result = CliRunner().invoke(
        cli, ["run", str(tmp_path / "legacy" / "legacy.toml"), "--out", str(run_dir)]
    )
    assert result.exit_code == 0, result.output
    assert "nothing to do" in result.output
    assert (run_dir / "stages.json").read_text() == stages_before
    assert json.loads((run_dir / "results.json").read_text()) == before
    assert not (run_dir / "data").exists()  # nothing needed the tokens: nothing was retrained
