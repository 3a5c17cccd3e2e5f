"""Distillation from a teacher model: the loss a pruned model heals with when it learns the
unpruned model's next-token distributions instead of (or as well as) the text's next tokens.

Minitron (Sreenivas et al., 2024, "LLM Pruning and Distillation in Practice") heals pruned models
with the KL divergence from the unpruned teacher's logits alone; Hinton et al.'s form keeps a
share of the cross-entropy on the data. Both are one :class:`Teacher`: the loss of a step is

    (1 - weight) x CE(student, next tokens) + weight x T^2 x KL(softmax(t / T) || softmax(s / T))

per token, averaged over the batch's tokens (t, s: the teacher's and the student's logits, T the
temperature; T^2 keeps the gradient's scale as T changes). The teacher runs without gradients, in
eval mode, on the same input ids as the student.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["Teacher", "kl_per_token"]


def kl_per_token(
    student: torch.Tensor, teacher: torch.Tensor, temperature: float = 1.0
) -> torch.Tensor:
    """The mean over tokens of T^2 x KL(softmax(teacher / T) || softmax(student / T)); logits of
    shape (..., vocab), computed in float32."""
    t = float(temperature)
    student_log = F.log_softmax(student.float().flatten(0, -2) / t, dim=-1)
    teacher_log = F.log_softmax(teacher.float().flatten(0, -2) / t, dim=-1)
    # batchmean over the flattened (tokens, vocab): the sum over the vocabulary, mean over tokens
    kl = F.kl_div(student_log, teacher_log, log_target=True, reduction="batchmean")
    return kl * (t * t)


@dataclass(frozen=True)
class Teacher:
    """The model a run distils from and how much of the loss its KL term is."""

    model: nn.Module
    """Maps input ids (B, T) to ``(logits, _)``, as :class:`geospec.engine.model.GPT` does."""
    digest: str
    """Its weights' content hash (:func:`geospec.engine.identity.weights_digest`): part of the
    student run's fingerprint, so a directory never resumes under another teacher."""
    weight: float = 1.0
    """The KL term's share of the loss, in (0, 1]; the cross-entropy on the data has the rest."""
    temperature: float = 1.0

    def __post_init__(self) -> None:
        if not 0.0 < self.weight <= 1.0:
            raise ValueError(f"distillation weight must be in (0, 1], got {self.weight}")
        if self.temperature <= 0.0:
            raise ValueError(f"distillation temperature must be positive, got {self.temperature}")

    def identity(self) -> dict[str, Any]:
        """What of the teacher makes a run the experiment it is (its fingerprint entry)."""
        return {"weights": self.digest, "weight": self.weight, "temperature": self.temperature}

    def to(self, device: torch.device) -> Teacher:
        """The teacher on ``device``, in eval mode, its parameters frozen."""
        self.model.to(device).eval()
        for parameter in self.model.parameters():
            parameter.requires_grad_(False)
        return self

    def loss(
        self, inputs: torch.Tensor, student_logits: torch.Tensor, cross_entropy: torch.Tensor
    ) -> torch.Tensor:
        """The step's loss of a student that computed ``student_logits`` and ``cross_entropy``
        on ``inputs``."""
        with torch.no_grad():
            teacher_logits, _ = self.model(inputs)
        kl = kl_per_token(student_logits, teacher_logits, self.temperature)
        if self.weight == 1.0:
            return kl
        return (1.0 - self.weight) * cross_entropy + self.weight * kl
