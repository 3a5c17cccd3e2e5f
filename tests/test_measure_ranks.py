"""Measurement spread over torchrun's ranks: two gloo processes each measure their share of the
(layer, geometry) tasks and gather them; every rank ends with exactly the values one process
measures (each task is measured alone, so nothing may differ, not even by rounding)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from geospec.measure.work import measure_profiles

pytestmark = [pytest.mark.torch, pytest.mark.slow]

PAIRS = ["shift/raw", "shift/spherical", "topology/raw"]

SCRIPT = """
import json, sys
import torch
from geospec.engine.distributed import context, process_group
from geospec.measure.work import measure_profiles

# Joined and left as geospec's commands do (process_group): a rank that exits with the group still
# up can abort while its peer still talks to it ("terminate called without an active exception").
with process_group():
    ctx = context()
    clouds = torch.load(sys.argv[1])
    values = measure_profiles(clouds, {pairs!r}, workers=1, progress=False, dist=ctx)
    with open(f"{{sys.argv[2]}}/rank-{{ctx.rank}}.json", "w") as handle:
        json.dump(values, handle)
"""


def clouds(layers: int = 5, tokens: int = 48, width: int = 16) -> list[tuple[torch.Tensor, ...]]:
    generator = torch.Generator().manual_seed(0)
    out = []
    for layer in range(layers):
        x = torch.randn(tokens, width, generator=generator)
        y = x + (layer + 1) * 0.1 * torch.randn(tokens, width, generator=generator)
        out.append((x, y))
    return out


def test_two_ranks_measure_exactly_what_one_process_measures(tmp_path: Path) -> None:
    layers = clouds()
    torch.save(layers, tmp_path / "clouds.pt")
    script = tmp_path / "measure.py"
    script.write_text(SCRIPT.format(pairs=PAIRS))
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node"]
    command += ["2", str(script), str(tmp_path / "clouds.pt"), str(tmp_path)]
    environment = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    one = measure_profiles(layers, PAIRS, workers=1, progress=False)
    for rank in (0, 1):
        assert json.loads((tmp_path / f"rank-{rank}.json").read_text()) == one
