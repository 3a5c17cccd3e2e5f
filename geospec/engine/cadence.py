"""When a training run logs, evaluates and checkpoints: one small value read from the spec.

Every step that does any of the three is a sync point (the loss is reduced across processes and
read on the host), so a step that does none runs on without waiting for the device. The last step
does all three; a stop requested after a step (:mod:`geospec.engine.stopping`) checkpoints it.
"""

from __future__ import annotations

from dataclasses import dataclass

from geospec.spec.sections import TrainSpec

__all__ = ["Cadence", "Due"]


@dataclass(frozen=True)
class Due:
    """What a step does after its update."""

    log: bool
    evaluate: bool
    checkpoint: bool


@dataclass(frozen=True)
class Cadence:
    """Every how many steps a run logs, evaluates (0: only at its last step) and checkpoints."""

    log: int
    evaluate: int
    checkpoint: int

    @classmethod
    def of(cls, train: TrainSpec) -> Cadence:
        return cls(train.log_interval, train.eval_interval, train.checkpoint_interval)

    def due(self, step: int, total: int, stopping: bool = False) -> Due:
        """What step ``step`` (1-based: the steps done) of ``total`` does; ``stopping``: the run
        stops after it."""
        last = step == total
        evaluate = last or bool(self.evaluate and step % self.evaluate == 0)
        checkpoint = last or stopping or step % self.checkpoint == 0
        log = evaluate or checkpoint or step % self.log == 0  # a row wherever the loop syncs
        return Due(log, evaluate, checkpoint)
