"""Forward passes in a compute dtype (:mod:`geospec.hardware` resolves it): torch's autocast
over the model's own weights, so matrix products run in bfloat16 (or float16 on a GPU) while the
weights, the residual stream's additions, the norms and the losses stay in the weights' dtype."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch


@contextmanager
def computing(dtype: str, device: torch.device | str) -> Iterator[None]:
    """Inside the block, forward passes on ``device`` compute in ``dtype``: autocast to it when
    it is narrower than float32, and autocast explicitly off for float32 (so a block nested in
    a bfloat16 one, a stage's own measurement inside the prune, computes in float32)."""
    kind = torch.device(device).type
    narrow = dtype != "float32"
    with torch.autocast(kind, dtype=getattr(torch, dtype) if narrow else None, enabled=narrow):
        yield


def set_threads(threads: int) -> None:
    """torch's intra-op threads for this process (every forward pass and matrix product)."""
    torch.set_num_threads(threads)


def model_computing(model: torch.nn.Module, requested: str, field: str) -> Any:
    """:func:`computing` in the dtype ``requested`` resolves to for ``model`` (its device, and
    the dtype its weights were loaded in: :func:`geospec.hardware.resolve_compute_dtype`)."""
    from geospec.hardware import resolve_compute_dtype

    weight = next(model.parameters())
    weights = str(weight.dtype).removeprefix("torch.")
    dtype, _ = resolve_compute_dtype(requested, weight.device.type, weights, field)
    return computing(dtype, weight.device)
