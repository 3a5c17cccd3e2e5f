"""Data parallelism under ``torchrun``: process group, model wrapping, collectives.

Outside torchrun (no ``WORLD_SIZE`` in the environment, or 1) everything here is a no-op, so the
training code is the same for one process and for many. The process group uses NCCL when CUDA is
available and gloo otherwise (CPU tests run 2 processes with gloo).
"""

from __future__ import annotations

import contextlib
import inspect
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch import nn

from geospec.errors import GeospecError

T = TypeVar("T")


@dataclass(frozen=True)
class DistContext:
    """This process's place among the torchrun processes (rank 0 of 1 without torchrun)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def context() -> DistContext:
    """Rank and world size from torchrun's environment variables."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return DistContext()
    return DistContext(
        rank=int(os.environ.get("RANK", "0")),
        world_size=world,
        local_rank=int(os.environ.get("LOCAL_RANK", "0")),
    )


def init_distributed() -> DistContext:
    """Join the process group when launched by torchrun (idempotent)."""
    ctx = context()
    if ctx.enabled and not dist.is_initialized():
        if torch.cuda.is_available():
            torch.cuda.set_device(ctx.local_rank)
            dist.init_process_group("nccl", device_id=torch.device("cuda", ctx.local_rank))
        else:
            dist.init_process_group("gloo")
        end_with_launcher()
    return ctx


_watching = False
#: Seconds a process whose trainer stopped for a lost launcher has to exit by itself.
LEAVING_GRACE = 30.0


def end_with_launcher(interval: float = 1.0) -> None:
    """Under torchrun: end this process when its launcher (the elastic agent, its parent) exits.

    torchrun starts its workers in sessions of their own, so a launcher killed outright (SIGKILL,
    the out-of-memory killer) leaves them running: they would probe or measure on for hours, for
    nobody, then wait for each other in a barrier that outlasts any stage (:data:`STAGE_TIMEOUT`),
    each holding its GPU. A daemon thread polls the parent every
    ``interval`` seconds; once it has changed, it sends this process SIGTERM, whose default action
    ends it at once, even inside a collective (every artifact is written atomically: the next run
    redoes only the stage that was cut short). While a model trains, the trainer's own SIGTERM
    handler is in place and the trainer notices the lost launcher itself, at its next log
    interval: it checkpoints and stops with that reason. The thread leaves it to do so, and gives
    the process :data:`LEAVING_GRACE` seconds after that to say why and exit by itself.
    """
    global _watching
    if _watching:
        return
    _watching = True
    launcher = os.getppid()

    def training() -> bool:  # the trainer's handler is in place (see geospec.engine.train)
        return signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, None)

    def watch() -> None:
        while os.getppid() == launcher:
            time.sleep(interval)
        if training():
            while training():
                time.sleep(interval)
            time.sleep(LEAVING_GRACE)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="geospec-launcher-watch", daemon=True).start()


@contextlib.contextmanager
def process_group() -> Iterator[tuple[int, int]]:
    """``(rank, world_size)`` with the process group joined; left again on exit if joined here."""
    owned = not dist.is_initialized()
    ctx = init_distributed()
    try:
        yield ctx.rank, ctx.world_size
        if owned and ctx.enabled:
            # Leave together: a rank that tears its group down while a peer still sends to it
            # can abort at exit ("terminate called without an active exception").
            dist.barrier()
    finally:
        if owned and dist.is_initialized():
            dist.destroy_process_group()


def barrier(ctx: DistContext) -> None:
    if ctx.enabled:
        dist.barrier()


#: How long the other ranks wait for a stage that runs on rank 0 alone (demand, prune: a
#: 24-layer model's cuts can take hours), and for each other's shares of probe, measure and
#: diagnose, which can end hours apart. ``GEOSPEC_STAGE_TIMEOUT_HOURS`` changes it.
STAGE_TIMEOUT = timedelta(hours=float(os.environ.get("GEOSPEC_STAGE_TIMEOUT_HOURS", "48")))
_waiting: tuple[Any, Any] | None = None  # (the default group it belongs to, the gloo group)


def wait_for_main(ctx: DistContext) -> None:
    """A barrier that waits up to :data:`STAGE_TIMEOUT` while rank 0 works alone.

    The default group's barrier would time out after its collective timeout (10 minutes under
    NCCL, whose watchdog then kills the job). This one runs on a gloo group of its own, created
    once per process group with the long timeout: the waiting ranks sit in a CPU barrier with no
    NCCL operation pending.
    """
    if ctx.enabled:
        dist.barrier(group=_stage_group())


def gather_stage_objects(value: Any, ctx: DistContext) -> list[Any]:
    """``value`` from every rank, in rank order, through the same gloo group as
    :func:`wait_for_main`: for the shares of a long stage (a measurement), which the ranks end
    minutes or hours apart, longer than the default group's collective timeout."""
    if not ctx.enabled:
        return [value]
    out: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(out, value, group=_stage_group())
    return out


def share_jobs(count: int, world_size: int, costs: Sequence[float] | None = None) -> list[int]:
    """The rank that does each of ``count`` jobs: round robin, or (with ``costs``, one per job)
    the costliest first, each to the rank with the least work so far (the lowest rank on a tie):
    the same answer on every rank."""
    if costs is None:
        return [job % world_size for job in range(count)]
    owners = [0] * count
    load = [0.0] * world_size
    for job in sorted(range(count), key=lambda job: -costs[job]):  # stable: ties in job order
        rank = min(range(world_size), key=lambda rank: load[rank])
        owners[job] = rank
        load[rank] += costs[job]
    return owners


def spread_over_ranks(
    count: int,
    compute: Callable[[list[int]], list[T]],
    ctx: DistContext | None,
    costs: Sequence[float] | None = None,
    to_main: bool = False,
) -> list[T]:
    """Jobs ``0 .. count - 1`` shared among torchrun's ranks (:func:`share_jobs`): each rank calls
    ``compute(mine)`` once, which returns the results of its jobs in that order, and gets back
    every job's result in job order (with ``to_main``, rank 0 alone does and the other ranks get
    an empty list: for results too large to hold on every rank, such as probed clouds).

    Outside torchrun, ``compute`` gets every job. A job computed alone gives the same value on
    any rank, so the results are the values of one process. A :class:`GeospecError` on any rank
    is raised on every rank (none is left waiting for one that failed). The results travel
    through the gloo group of :func:`gather_stage_objects`, which outlasts shares that end hours
    apart.
    """
    if ctx is None or not ctx.enabled:
        return compute(list(range(count)))
    owners = share_jobs(count, ctx.world_size, costs)
    mine = [job for job in range(count) if owners[job] == ctx.rank]
    results: list[T] = []
    failure: GeospecError | None = None
    try:
        results = compute(mine)
    except GeospecError as error:
        failure = error  # said on every rank below
    failures = [error for error in gather_stage_objects(failure, ctx) if error is not None]
    if failures:
        raise failures[0]
    if to_main:
        shares: list[Any] = [None] * ctx.world_size if ctx.is_main else []
        dist.gather_object(results, shares or None, dst=0, group=_stage_group())
        if not ctx.is_main:
            return []
    else:
        shares = gather_stage_objects(results, ctx)
    ordered: list[T] = [None] * count  # type: ignore[list-item]  # every job is filled below
    for rank, share in enumerate(shares):
        jobs = [job for job in range(count) if owners[job] == rank]
        for job, result in zip(jobs, share, strict=True):
            ordered[job] = result
    return ordered


def _stage_group() -> Any:
    """The gloo group with :data:`STAGE_TIMEOUT`, created once per process group (every rank
    must reach the first call, as with any new group)."""
    global _waiting
    world = dist.group.WORLD
    if _waiting is None or _waiting[0] is not world:
        _waiting = (world, dist.new_group(backend="gloo", timeout=STAGE_TIMEOUT))
    return _waiting[1]


def all_reduce_sum(tensor: torch.Tensor, ctx: DistContext) -> torch.Tensor:
    if ctx.enabled:
        dist.all_reduce(tensor)
    return tensor


def gather_objects(value: Any, ctx: DistContext) -> list[Any]:
    """``value`` from every rank, in rank order (pickled between our own processes only)."""
    if not ctx.enabled:
        return [value]
    out: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(out, value)
    return out


def broadcast_object(value: Any, ctx: DistContext) -> Any:
    """Rank 0's ``value`` on every rank."""
    if not ctx.enabled:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def on_main(compute: Callable[[], T], ctx: DistContext) -> T:
    """``compute()`` on rank 0 only (it may read files only rank 0 has), its value on every rank.

    A :class:`GeospecError` raised on rank 0 is raised on every rank, so no process is left
    waiting in a collective for one that failed.
    """
    outcome: tuple[bool, Any] = (True, None)
    if ctx.is_main:
        try:
            outcome = (True, compute())
        except GeospecError as error:
            if not ctx.enabled:
                raise
            outcome = (False, error)
    ok, value = broadcast_object(outcome, ctx)
    if not ok:
        raise value
    result: T = value
    return result


@contextlib.contextmanager
def claim_on_main(directory: Path, ctx: DistContext) -> Iterator[bool]:
    """Rank 0 claims a training directory (geospec.storage.locks) for as long as the block runs;
    every rank learns whether it got it, so all of them train it or all of them leave it."""
    from geospec.storage.locks import claim

    if not ctx.is_main:
        yield bool(broadcast_object(None, ctx))
        return
    with claim(directory) as granted:
        yield bool(broadcast_object(granted, ctx))


def wrap_model(
    model: nn.Module, ctx: DistContext, mode: str, bf16: bool, device: torch.device
) -> nn.Module:
    """DDP, or FSDP2 (``fully_shard`` per block, then the root); unchanged for one process.

    FSDP2 shards ``model`` in place (its parameters become DTensors) and returns it; DDP returns a
    wrapper around it. Either way ``model`` itself stays the module to checkpoint and evaluate.
    """
    if not ctx.enabled:
        return model
    if mode == "fsdp2":
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        policy = MixedPrecisionPolicy(
            param_dtype=torch.bfloat16 if bf16 else None, reduce_dtype=torch.float32
        )
        for block in getattr(model, "blocks", []):
            fully_shard(block, mp_policy=policy)
        fully_shard(model, mp_policy=policy)
        return model
    from torch.nn.parallel import DistributedDataParallel

    device_ids = [device.index] if device.type == "cuda" else None
    # Buffers (rotary tables) are constants: no need to broadcast them every forward. torch 2.13
    # renamed the switch (broadcast_buffers is deprecated); older releases know only the old name.
    parameters = inspect.signature(DistributedDataParallel.__init__).parameters
    no_sync: dict[str, Any] = (
        {"forward_sync_buffers": False}
        if "forward_sync_buffers" in parameters
        else {"broadcast_buffers": False}
    )
    return DistributedDataParallel(model, device_ids=device_ids, **no_sync)


@contextlib.contextmanager
def gradient_sync(model: nn.Module, enabled: bool) -> Iterator[None]:
    """Skip the gradient all-reduce on micro-batches before the last one of a step."""
    from torch.nn.parallel import DistributedDataParallel

    if isinstance(model, DistributedDataParallel) and not enabled:
        with model.no_sync():
            yield
        return
    setter = getattr(model, "set_requires_gradient_sync", None)  # FSDP2
    if setter is not None:
        setter(enabled)
    yield
