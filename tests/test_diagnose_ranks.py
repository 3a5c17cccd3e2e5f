"""Probe and diagnose spread over torchrun's ranks: two gloo processes each run their share of the
probed windows and of the perturbations (layer x scaled / removed, and the pairs), then gather
them. Every value must be exactly the value one process computes (each batch of windows and each
perturbation is computed alone, on the same inputs in the same order: nothing may differ, not
even by rounding). The one-process values are computed in rank 0's own process after the ranks
finish, so both see the same thread settings."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import traceback
from pathlib import Path
from typing import Any

import hf_models
import numpy as np
import pytest
import tomlkit
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from geospec.engine.distributed import DistContext, share_jobs, spread_over_ranks
from geospec.engine.model import GPT, GPTConfig
from geospec.errors import GeospecError
from geospec.measure.probe import find_ffn_sites, probe_clouds, sample_tokens
from geospec.measure.sensitivity import additivity, layer_sensitivity, logits_of
from geospec.measure.suffix import perturb_layers
from geospec.testing import minimal_spec

pytestmark = pytest.mark.torch

VOCAB, SEQ, WIDTH, EPS = 64, 12, 32, 0.5
PAIRS = [(0, 1), (0, 3), (1, 2), (2, 4)]


def model() -> GPT:
    torch.manual_seed(0)
    config = GPTConfig(
        vocab_size=VOCAB,
        n_layers=5,
        d_model=WIDTH,
        n_heads=4,
        seq_len=SEQ,
        ffn_widths=[48, 80, 24, 64, 32],
    )
    return GPT(config).eval()


def batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Three batches of unequal size (the last one short), as the diagnose stage's can be."""
    tokens = torch.randint(0, VOCAB, (7, SEQ + 1), generator=torch.Generator().manual_seed(1))
    return [(tokens[i : i + 3, :-1], tokens[i : i + 3, 1:]) for i in range(0, 7, 3)]


def numbers(single: Any, pairs: Any) -> list[float | None]:
    """Every number the diagnose stage stores: base, both sensitivities, the pairs' changes."""
    return [
        single.base,
        *single.scale,
        *single.remove,
        *(value for p in pairs.pairs for value in (p.joint, p.singles, p.interaction)),
        pairs.r2,
    ]


def measured(ctx: DistContext | None) -> dict[str, Any]:
    """What the diagnose and probe stages compute, with ``ctx`` (None: one process)."""
    net = model()
    sites = find_ffn_sites(net, WIDTH, lambda: logits_of(net, batches()[0][0][:1]))
    suffix = perturb_layers(net, sites, batches(), EPS, PAIRS, dist=ctx)
    assert suffix.fallback is None  # geospec's model runs from the perturbed layer on
    single = layer_sensitivity(net, sites, batches(), EPS, dist=ctx)  # the full-pass fallback
    full = additivity(net, sites, batches(), single, PAIRS, dist=ctx)
    tokens = np.random.default_rng(2).integers(0, VOCAB, 40 * SEQ)
    sample = sample_tokens(tokens, SEQ, 60, seed=3, sequences=11)
    clouds = probe_clouds(net, tokens, sample, SEQ, WIDTH, batch_size=2, dist=ctx)
    return {
        "suffix": numbers(suffix.sensitivity, suffix.additivity),
        "full": numbers(single, full),
        "clouds": clouds,
    }


def _worker(rank: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    ctx = DistContext(rank=rank, world_size=2, local_rank=rank)
    report: dict[str, Any] = {}
    try:
        spread = measured(ctx)
        report["suffix"], report["full"] = spread["suffix"], spread["full"]
        report["clouds_here"] = len(spread["clouds"])

        def fails_on_rank_1(mine: list[int]) -> list[int]:
            if rank == 1:
                raise GeospecError("layer 3: rank 1's share failed")
            return mine

        try:
            spread_over_ranks(4, fails_on_rank_1, ctx)
        except GeospecError as error:
            report["failure"] = str(error)
        dist.barrier()
        if rank == 0:
            torch.save(spread["clouds"], Path(out) / "ranks.pt")
            one = measured(None)
            report["one_suffix"], report["one_full"] = one["suffix"], one["full"]
            torch.save(one["clouds"], Path(out) / "one.pt")
    except Exception:
        report["error"] = traceback.format_exc()
    Path(out, f"rank{rank}.json").write_text(json.dumps(report))
    dist.barrier()
    dist.destroy_process_group()


def test_two_ranks_probe_and_perturb_exactly_as_one_process(tmp_path: Path) -> None:
    port = 29500 + (os.getpid() + 7) % 1000
    mp.spawn(_worker, args=(port, str(tmp_path)), nprocs=2)
    main, other = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    assert "error" not in main, main["error"]
    assert "error" not in other, other["error"]
    for path in ("suffix", "full"):
        assert main[path] == main[f"one_{path}"]
        assert other[path] == main[f"one_{path}"]
    assert main["suffix"][1:6] != main["suffix"][6:11]  # scaled and removed are not confused
    one, ranks = torch.load(tmp_path / "one.pt"), torch.load(tmp_path / "ranks.pt")
    assert len(ranks) == len(one) == 5
    for (x, y), (rx, ry) in zip(one, ranks, strict=True):
        assert torch.equal(x, rx) and torch.equal(y, ry)
    assert main["clouds_here"] == 5 and other["clouds_here"] == 0  # only rank 0 holds them
    # a failure in one rank's share is raised on both, so neither waits for the other
    assert main["failure"] == other["failure"] == "layer 3: rank 1's share failed"


def test_jobs_are_shared_by_cost_and_every_job_has_one_rank() -> None:
    costs = [5.0, 4.0, 4.0, 3.0, 1.0, 1.0, 1.0, 1.0]
    owners = share_jobs(len(costs), 3, costs)
    loads = [sum(c for c, o in zip(costs, owners, strict=True) if o == rank) for rank in range(3)]
    assert set(owners) == {0, 1, 2}
    # longest-first to the least loaded: no rank ends more than the largest job above another
    assert max(loads) - min(loads) <= max(costs)
    assert sum(loads) == sum(costs)
    assert share_jobs(5, 2) == [0, 1, 0, 1, 0]  # round robin without costs


def test_one_process_computes_every_job_in_order() -> None:
    assert spread_over_ranks(4, lambda mine: [job * 10 for job in mine], None) == [0, 10, 20, 30]


def pretrained_spec(tmp_path: Path, out: Path) -> Path:
    """A tiny Llama checkpoint on disk with a word-level tokenizer, probed at the ffn site (so
    diagnose probes the residual stream again): the same reference for one process and two."""
    model = tmp_path / "model"
    hf_models.save_with_words(hf_models.llama(intermediate_size=48), model)
    rng = np.random.default_rng(0)
    lines = [json.dumps({"text": " ".join(f"w{j}" for j in rng.integers(0, 95, 60))})]
    (tmp_path / "docs.jsonl").write_text("\n".join(lines * 200))
    spec = minimal_spec(
        out=str(out),
        data={"files": ["docs.jsonl"], "tokenizer": {"kind": "pretrained", "path": str(model)}},
        reference={"checkpoint": str(model)},
        probe={"tokens": 64, "site": "ffn", "batch_size": 2},
        measure=[{"geometry": "raw", "statistic": "shift"}],
        diagnose={"windows": 4, "batch_size": 1, "pairs": 2},
        probe_only=True,
    )
    spec["model"] = {"seq_len": spec["model"]["seq_len"], "multiple_of": 16}
    path = tmp_path / f"{out.name}.toml"
    path.write_text(tomlkit.dumps(spec))
    return path


@pytest.mark.slow
def test_torchrun_diagnose_writes_what_one_process_writes(tmp_path: Path) -> None:
    """`geospec diagnose` under torchrun with 2 gloo processes: the probed clouds (their content
    hashes in meta.json) and every number of diagnostics.json equal one process's."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    one, two = (
        pretrained_spec(tmp_path, tmp_path / "one"),
        pretrained_spec(tmp_path, tmp_path / "two"),
    )
    geospec = ["-m", "geospec", "diagnose"]
    done = subprocess.run(
        [sys.executable, *geospec, str(one)], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node"]
    done = subprocess.run(
        [*torchrun, "2", *geospec, str(two)], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    meta = [
        json.loads((tmp_path / run / "clouds" / "meta.json").read_text()) for run in ("one", "two")
    ]
    assert meta[0]["digests"] == meta[1]["digests"] and len(meta[0]["digests"]) == 3
    found = [
        json.loads((tmp_path / run / "diagnostics.json").read_text()) for run in ("one", "two")
    ]
    for part in ("profiles", "loss", "layers", "additivity", "correlations"):
        assert found[0][part] == found[1][part], part
