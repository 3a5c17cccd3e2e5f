"""scripts/search_regret_families.py: regrets against the searched arm, by hand-computed means."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).parent.parent / "scripts" / "search_regret_families.py"


def _arm(losses: dict[str, list[float]], **extra: object) -> dict[str, object]:
    return {
        "loss": {c: {str(s): v for s, v in enumerate(values)} for c, values in losses.items()},
        **extra,
    }


def test_regret_is_the_seed_mean_above_the_searched_arm(tmp_path: Path) -> None:
    search = {
        "0": {"fitness": [0.5] * 12, "stopped": {"by": "patience", "generation": 12}},
        "1": {"fitness": [0.5] * 30},  # recorded before patience existed: ran to its cap
    }
    budget = {
        "keep": 0.5,
        "arms": {
            "searched": _arm({"a": [1.0, 2.0], "b": [3.0, 3.0]}, search=search),
            "uniform": _arm({"a": [2.0, 2.0], "b": [4.0, 5.0]}),  # +0.5 on a, +1.5 on b
            "protect": _arm({"a": [1.0, 1.0], "b": [3.0, 3.0]}),  # -0.5 on a, 0 on b
        },
    }
    path = tmp_path / "prune.json"
    path.write_text(json.dumps({"budgets": [budget]}))
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--roles", "u,p", f"X={path}@searched:uniform,protect"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    row = out.strip().splitlines()[-1]
    assert row == "| X | 0.5 | +1.000 / +1.500 | -0.250 / +0.000 | 12 (patience), 30 (cap) |"


def test_a_malformed_study_names_the_fix(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--roles", "u,p", f"X={tmp_path}/none.json@s:only-one"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode != 0 and "one arm per role (2)" in done.stderr
