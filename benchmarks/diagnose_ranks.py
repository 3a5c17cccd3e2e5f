"""Benchmark: the probe's windows and the diagnose stage's perturbations spread over torchrun ranks
against one process.

Builds a small Llama-architecture model with random weights (the same in every process, from
the seed) and, in this process with one thread, probes the clouds of ``--probe-windows`` windows
(:func:`geospec.measure.probe.probe_clouds`) and runs the diagnose stage's perturbations (every
FFN scaled by 1 - eps and removed, and ``--pairs`` layer pairs:
:func:`geospec.measure.suffix.perturb_layers`); then runs this file again under ``torchrun
--nproc_per_node N`` (gloo, one thread per rank), where each rank does its share and the shares
are gathered. Ends with one summary line per stage:

    probe     ranks: 2  one_s: 8.0  ranks_s: 4.3  speedup: 1.86  identical: True
    diagnose  ranks: 2  one_s: 30.1  ranks_s: 16.0  speedup: 1.88  identical: True

``ranks_s`` is the slowest rank's time for the stage (torchrun's start and the model's
construction are not counted); ``identical`` compares every cloud and every number (base loss,
sensitivities, pair changes) of the ranks with the one process's, exactly. The speedup
approaches N when the node has N free cores (or N GPUs) and the work divides evenly: every rank
also walks the unperturbed stack once per batch, which the perturbations start from.
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
from typing import Any

import numpy as np
import torch
from diagnose import smollm2_like  # benchmarks/diagnose.py (this folder is on sys.path)

from geospec.engine.distributed import DistContext
from geospec.measure.probe import find_ffn_sites, probe_clouds, sample_tokens
from geospec.measure.sensitivity import logits_of, sample_pairs
from geospec.measure.suffix import perturb_layers


def arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--ffn", type=int, default=688)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--windows", type=int, default=4, help="diagnose's loss windows")
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--pairs", type=int, default=16)
    parser.add_argument("--probe-windows", type=int, default=48)
    parser.add_argument("--probe-tokens", type=int, default=1024)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None, help="(set for the ranks)")
    return parser.parse_args(argv)


def stages(args: argparse.Namespace, ctx: DistContext | None) -> dict[str, Any]:
    """The probe and the perturbations, each timed: ``{stage: (seconds, values)}``."""
    net = smollm2_like(args)  # diagnose.py's model, at this benchmark's smaller shape
    tokens = np.random.default_rng(1).integers(0, args.vocab, 2 * args.probe_windows * args.seq_len)
    sample = sample_tokens(tokens, args.seq_len, args.probe_tokens, 2, args.probe_windows)
    started = time.perf_counter()
    clouds = probe_clouds(net, tokens, sample, args.seq_len, args.d_model, batch_size=4, dist=ctx)
    probe_s = time.perf_counter() - started
    ids = torch.as_tensor(tokens[: args.windows * (args.seq_len + 1)]).view(args.windows, -1)
    batches = [
        (ids[i : i + args.batch_size, :-1], ids[i : i + args.batch_size, 1:])
        for i in range(0, args.windows, args.batch_size)
    ]
    sites = find_ffn_sites(net, args.d_model, lambda: logits_of(net, batches[0][0][:1]))
    pairs = sample_pairs(len(sites), args.pairs, 0)
    started = time.perf_counter()
    found = perturb_layers(net, sites, batches, 0.1, pairs, dist=ctx)
    diagnose_s = time.perf_counter() - started
    numbers = [
        found.sensitivity.base,
        *found.sensitivity.scale,
        *found.sensitivity.remove,
        *(p.joint for p in found.additivity.pairs),
    ]
    return {"probe": (probe_s, clouds), "diagnose": (diagnose_s, numbers)}


def rank_main(args: argparse.Namespace) -> None:
    from geospec.engine.distributed import init_distributed

    torch.set_num_threads(1)
    ctx = init_distributed()
    done = stages(args, ctx)
    assert args.out is not None
    times = {name: seconds for name, (seconds, _) in done.items()}
    (args.out / f"times-{ctx.rank}.json").write_text(json.dumps(times))
    if ctx.is_main:
        torch.save({name: values for name, (_, values) in done.items()}, args.out / "ranks.pt")


def main() -> None:
    args = arguments()
    if args.out is not None:  # this file, started by torchrun below
        rank_main(args)
        return
    torch.set_num_threads(1)
    one = stages(args, None)
    with tempfile.TemporaryDirectory(prefix="geospec-diagnose-ranks-") as folder:
        work = Path(folder)
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
        command += ["--nproc_per_node", str(args.ranks), __file__, *sys.argv[1:]]
        command += ["--out", str(work)]
        environment = {**os.environ, "OMP_NUM_THREADS": "1"}
        subprocess.run(command, env=environment, check=True, capture_output=True)
        ranks = torch.load(work / "ranks.pt")
        times = [json.loads((work / f"times-{r}.json").read_text()) for r in range(args.ranks)]
    for name, (one_s, values) in one.items():
        ranks_s = max(t[name] for t in times)
        if name == "probe":
            identical = len(values) == len(ranks[name]) and all(
                torch.equal(x, rx) and torch.equal(y, ry)
                for (x, y), (rx, ry) in zip(values, ranks[name], strict=True)
            )
        else:
            identical = values == ranks[name]
        print(
            f"{name:<9} ranks: {args.ranks}  one_s: {one_s:.1f}  ranks_s: {ranks_s:.1f}  "
            f"speedup: {one_s / ranks_s:.2f}  identical: {identical}"
        )


if __name__ == "__main__":
    main()
