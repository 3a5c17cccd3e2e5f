"""Under torchrun, the ranks that wait for a stage rank 0 runs alone outlast the collective
timeout (2 real gloo processes with a deliberately short one)."""

from __future__ import annotations

import json
import os
import time
import traceback
from datetime import timedelta
from pathlib import Path

import pytest
import torch.distributed as dist
import torch.multiprocessing as mp

from geospec.engine.distributed import DistContext, wait_for_main

pytestmark = pytest.mark.torch

TIMEOUT = 1.0  # seconds: the default group's collective timeout in this test
STAGE = 3 * TIMEOUT  # how long rank 0 works alone


def _worker(rank: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=timedelta(seconds=TIMEOUT))
    ctx = DistContext(rank=rank, world_size=2, local_rank=rank)
    report: dict[str, object] = {}
    started = time.monotonic()
    if rank == 0:
        time.sleep(STAGE)  # a long stage on rank 0 (probe, measure)
    try:
        wait_for_main(ctx)
        report["waited"] = time.monotonic() - started
    except Exception:
        report["wait_error"] = traceback.format_exc()
    # the premise: the default group's own barrier does not survive such a stage
    if rank == 0:
        time.sleep(2 * TIMEOUT)
    else:
        try:
            dist.barrier()
            report["plain_barrier"] = "returned"
        except Exception as error:
            report["plain_barrier"] = f"failed: {type(error).__name__}"
    Path(out, f"rank{rank}.json").write_text(json.dumps(report))
    dist.destroy_process_group()


def test_waiting_ranks_outlast_the_collective_timeout(tmp_path: Path) -> None:
    port = 29500 + os.getpid() % 1000
    mp.spawn(_worker, args=(port, str(tmp_path)), nprocs=2)
    waiting = json.loads((tmp_path / "rank1.json").read_text())
    main = json.loads((tmp_path / "rank0.json").read_text())
    assert "wait_error" not in waiting, waiting["wait_error"]
    assert "wait_error" not in main, main["wait_error"]
    assert waiting["waited"] >= STAGE - 0.5  # rank 1 really waited past the timeout
    assert waiting["plain_barrier"].startswith("failed")
