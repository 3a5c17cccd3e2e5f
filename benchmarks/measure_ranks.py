"""Benchmark: the measure stage's work spread over torchrun ranks against one process.

Measures the same clouds (per layer, n tokens in d dimensions, y = x plus a layer-dependent
update) with ``measure_profiles(..., workers=1)`` in this process, then under ``torchrun
--nproc_per_node N`` (gloo; each rank measures its share of the (layer, geometry) tasks with one
worker, then the shares are gathered), and ends with the summary line

    ranks: 2  one_s: 41.0  ranks_s: 22.3  speedup: 1.84  identical: True

``identical`` compares every value of every rank with the one process's, exactly. The speedup
counts torchrun's start (a few seconds) against the ranks; it approaches N when the tasks are
many and equal in size and the node has N free cores.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from geospec.measure.work import measure_profiles

PAIRS = ["topology/raw", "gw/spherical", "shift/hyperbolic"]

RANK_SCRIPT = """
import json, sys, time
import torch
from geospec.engine.distributed import init_distributed
from geospec.measure.work import measure_profiles

ctx = init_distributed()
clouds = torch.load(sys.argv[1])
values = measure_profiles(clouds, json.loads(sys.argv[3]), workers=1, progress=False, dist=ctx)
with open(f"{sys.argv[2]}/rank-{ctx.rank}.json", "w") as handle:
    json.dump(values, handle)
"""


def make_clouds(layers: int, n: int, d: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(0)
    clouds = []
    for layer in range(layers):
        x = torch.randn(n, 8, generator=generator) @ torch.randn(8, d, generator=generator)
        x += 0.05 * torch.randn(n, d, generator=generator) + 1.0
        update = torch.tanh(x @ torch.randn(d, d, generator=generator) / d**0.5)
        clouds.append((x, x + (0.2 + 0.1 * layer) * update))
    return clouds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--n", type=int, default=384)
    parser.add_argument("--d", type=int, default=64)
    args = parser.parse_args()
    clouds = make_clouds(args.layers, args.n, args.d)
    with tempfile.TemporaryDirectory(prefix="geospec-measure-ranks-") as folder:
        work = Path(folder)
        torch.save(clouds, work / "clouds.pt")
        (work / "rank.py").write_text(RANK_SCRIPT)
        started = time.perf_counter()
        one = measure_profiles(clouds, PAIRS, workers=1, progress=False)
        one_s = time.perf_counter() - started
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
        command += ["--nproc_per_node", str(args.ranks), str(work / "rank.py")]
        command += [str(work / "clouds.pt"), str(work), json.dumps(PAIRS)]
        environment = {**os.environ, "OMP_NUM_THREADS": "1"}
        started = time.perf_counter()
        subprocess.run(command, env=environment, check=True, capture_output=True)
        ranks_s = time.perf_counter() - started
        identical = all(
            json.loads((work / f"rank-{rank}.json").read_text()) == one
            for rank in range(args.ranks)
        )
    print(
        f"ranks: {args.ranks}  one_s: {one_s:.1f}  ranks_s: {ranks_s:.1f}  "
        f"speedup: {one_s / ranks_s:.2f}  identical: {identical}"
    )


if __name__ == "__main__":
    main()
