"""When a training run stops before its last step: a scheduler's signal, or its launcher gone.

SIGTERM or SIGUSR1 (a scheduler's warning before preemption or the time limit) only marks the run
to stop at the end of its current step; the trainer then checkpoints that step and raises
:class:`geospec.errors.Preempted`. Under torchrun a process also stops, at the next log step, when
its launcher is gone: torchrun starts its workers in sessions of their own, so a launcher killed
outright (SIGKILL, the out-of-memory killer) would leave them training on unwatched, holding the
run's claim. Every rank learns whether any rank has a reason to stop, so all stop at one step.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator
from typing import Any

import torch

from geospec.engine import distributed
from geospec.engine.distributed import DistContext

__all__ = ["StopSignal", "Stopping", "stop_signals"]


class StopSignal:
    """Why this process stops early: the signal it received (None: none yet), or, under
    torchrun, that its launcher is gone."""

    signum: int | None = None
    orphaned: bool = False

    @property
    def received(self) -> bool:
        return self.signum is not None or self.orphaned

    @property
    def signal_name(self) -> str | None:
        return signal.Signals(self.signum).name if self.signum is not None else None

    @property
    def name(self) -> str:
        if self.signal_name is not None:
            return self.signal_name
        if self.orphaned:
            return "the exit of its launcher"
        return "a stop another process received"


@contextlib.contextmanager
def stop_signals() -> Iterator[StopSignal]:
    """While training: SIGTERM and SIGUSR1 only mark the run to stop after its current step (the
    previous handlers come back afterwards). Outside the main thread signals stay as they are."""
    stop = StopSignal()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return

    def mark(signum: int, frame: Any) -> None:
        stop.signum = signum

    previous = {s: signal.signal(s, mark) for s in (signal.SIGTERM, signal.SIGUSR1)}
    try:
        yield stop
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


class Stopping:
    """Whether a run stops after a step: its signal, and under torchrun its launcher and the
    other ranks, asked only at the steps where the loop syncs anyway (``every``: the log
    interval), so a step that logs nothing waits for no other process."""

    def __init__(self, ctx: DistContext, device: torch.device, every: int) -> None:
        self.ctx, self.device, self.every = ctx, device, every
        # under torchrun, the launcher (the elastic agent): a parent that changes has exited
        self.launcher = os.getppid()

    def requested(self, stop: StopSignal, step: int) -> bool:
        """Whether the run stops after ``step`` (every rank gets the same answer)."""
        if not self.ctx.enabled:
            return stop.received
        if step % self.every:
            return False
        stop.orphaned = os.getppid() != self.launcher
        flag = torch.tensor(float(stop.received), device=self.device)
        return bool(distributed.all_reduce_sum(flag, self.ctx).item() > 0)
