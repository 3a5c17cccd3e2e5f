"""One calibration pass of an unpruned model over windows of text, recording what cutting its
FFNs needs: every FFN's hidden-activation statistics (what importance scores that read
activations and bias compensation use) and, for OWL, every decoder layer's linear inputs. The
demand stage's orderings and a prune's scores both calibrate through it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import ExitStack
from typing import NamedTuple

import numpy as np
import torch
from torch import nn

from geospec.kinds import ActivationStats, BlockLinears
from geospec.measure.cut import activation_stats
from geospec.measure.linears import linear_inputs
from geospec.measure.probe import FFNSite
from geospec.measure.sensitivity import logits_of


class Calibration(NamedTuple):
    """What one calibration pass over the unpruned model recorded (None: not asked for)."""

    stats: list[ActivationStats] | None
    """Every FFN's hidden-activation statistics (:func:`calibration_stats`)."""
    blocks: list[BlockLinears] | None
    """Every decoder layer's linear maps with their input RMS (OWL's per-weight scores)."""


def calibrate(
    model: nn.Module,
    sites: Sequence[FFNSite],
    tokens: np.ndarray,
    starts: np.ndarray,
    seq_len: int,
    batch_size: int,
    *,
    stats: bool = True,
    blocks: bool = False,
    bos: int | None = None,
    progress: Callable[[int], None] | None = None,
) -> Calibration:
    """One pass of the unpruned ``model`` over the calibration windows of ``seq_len`` tokens at
    ``starts``, in batches of ``batch_size``, recording what is asked: the FFNs' activation
    statistics (``stats``) and every decoder layer's linear inputs (``blocks``,
    :func:`geospec.measure.linears.linear_inputs`); with ``bos``, each window starts with it
    (:func:`geospec.engine.batches.input_windows`); ``progress`` is told the windows each batch
    read."""
    from geospec.engine.batches import input_windows

    ids = input_windows(tokens, starts, seq_len, bos)
    return calibrate_on(
        model, sites, ids, batch_size, stats=stats, blocks=blocks, progress=progress
    )


def calibrate_on(
    model: nn.Module,
    sites: Sequence[FFNSite],
    ids: torch.Tensor,
    batch_size: int,
    *,
    stats: bool = True,
    blocks: bool = False,
    progress: Callable[[int], None] | None = None,
) -> Calibration:
    """:func:`calibrate` on windows already read (``ids``: windows x tokens, as the model takes
    them)."""
    device = next(model.parameters()).device
    with torch.no_grad(), ExitStack() as stack:
        ffn = stack.enter_context(activation_stats([s.ffn for s in sites])) if stats else None
        block = stack.enter_context(linear_inputs([s.layer for s in sites])) if blocks else None
        for start in range(0, len(ids), batch_size):
            batch = ids[start : start + batch_size]
            logits_of(model, batch.to(device))
            if progress is not None:
                progress(len(batch))
        return Calibration(None if ffn is None else ffn(), None if block is None else block())


def calibration_stats(
    model: nn.Module,
    sites: Sequence[FFNSite],
    tokens: np.ndarray,
    starts: np.ndarray,
    seq_len: int,
    batch_size: int,
    bos: int | None = None,
    progress: Callable[[int], None] | None = None,
) -> list[ActivationStats]:
    """Every layer's hidden-activation statistics (signed mean, mean |a|, mean square per
    neuron, float64 on the CPU) over the calibration windows of ``seq_len`` tokens at
    ``starts``, run through the unpruned ``model`` in batches of ``batch_size``: what importance
    scores that need activations read and what bias compensation puts in place of a cut
    neuron (``[s.mean for s in stats]``). With ``bos`` each window starts with it, as the
    model reads text (its position counts among the tokens, as in FLAP's calibration)."""
    stats = calibrate(
        model, sites, tokens, starts, seq_len, batch_size, bos=bos, progress=progress
    ).stats
    assert stats is not None
    return stats
