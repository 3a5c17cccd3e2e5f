"""Where a training run stands, and its checkpoint's trainer state, written and read side by side.

``trainer_state.pt`` (:mod:`geospec.engine.checkpoint` writes and checks it) is a dict of plain
values and tensors, so ``torch.load(weights_only=True)`` reads it:

- ``step``: optimizer steps done; ``sequences``: the data position (``step * batch_size``);
- ``fingerprint``: the run's identity (:mod:`geospec.engine.identity`) as JSON text;
- ``optimizer``: AdamW's full state dict; ``rng``: each process's RNG states, by rank;
- ``train_seconds``, ``wall_seconds``: time spent so far (steps only; everything);
- ``last_val``: ``[step, loss]`` of the last evaluation, or None;
- ``world_size``: the processes that wrote it;
- ``executions``: JSON text of each setting the run computed under (absent in checkpoints of
  geospec before it recorded them: read as none).

The keys are those of every earlier version, so a run checkpointed by one resumes under another.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = ["TrainState"]


@dataclass
class TrainState:
    """What a run carries from step to step besides its weights, optimizer and RNG: the steps
    done, the time spent, the last validation loss and the settings it computed under."""

    step: int = 0
    train_seconds: float = 0.0
    """Time spent in training steps only."""
    wall_seconds: float = 0.0
    """Time spent in the run's training sessions, evaluation and checkpoints included."""
    last_val: tuple[int, float] | None = None
    """(step, validation loss) of the last evaluation."""
    executions: list[dict[str, Any]] = field(default_factory=list)
    """One per distinct setting (:func:`geospec.engine.identity.execution`) it computed under."""

    def computing(self, setting: dict[str, Any]) -> None:
        """This session trains or evaluates under ``setting``: record it (once)."""
        if setting not in self.executions:
            self.executions.append(setting)

    def to_checkpoint(
        self,
        *,
        fingerprint: dict[str, Any],
        batch_size: int,
        world_size: int,
        optimizer: dict[str, Any],
        rng: list[dict[str, torch.Tensor]],
    ) -> dict[str, Any]:
        """The trainer state of a checkpoint of this step (read back by :meth:`from_checkpoint`)."""
        return {
            "step": self.step,
            "sequences": self.step * batch_size,  # the data position
            "fingerprint": json.dumps(fingerprint),
            "optimizer": optimizer,
            "rng": rng,
            "train_seconds": self.train_seconds,
            "wall_seconds": self.wall_seconds,
            "last_val": list(self.last_val) if self.last_val else None,
            "world_size": world_size,
            "executions": json.dumps(self.executions),  # plain values: weights_only loads
        }

    @classmethod
    def from_checkpoint(cls, checkpoint: dict[str, Any]) -> TrainState:
        """Where the run of a checkpoint's trainer state (:meth:`to_checkpoint`) stands."""
        last = checkpoint["last_val"]
        return cls(
            step=int(checkpoint["step"]),
            train_seconds=float(checkpoint["train_seconds"]),
            wall_seconds=float(checkpoint["wall_seconds"]),
            last_val=(int(last[0]), float(last[1])) if last else None,
            executions=list(json.loads(checkpoint.get("executions", "[]"))),
        )

    @staticmethod
    def fingerprint_of(checkpoint: dict[str, Any]) -> dict[str, Any]:
        """The identity of the run that wrote ``checkpoint``."""
        stored: dict[str, Any] = json.loads(checkpoint["fingerprint"])
        return stored

    @staticmethod
    def optimizer_and_rng(
        checkpoint: dict[str, Any],
    ) -> tuple[dict[str, Any], list[dict[str, torch.Tensor]]]:
        """The optimizer state and the RNG states of every rank that ``checkpoint`` holds."""
        return checkpoint["optimizer"], checkpoint["rng"]
