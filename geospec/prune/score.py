"""What a calibration sample yields, once per seed: every layer's neuron scores and ordering
under each importance a prune's arms use, and what the cut, the repair and the searches read from
the same pass (docs/prune.md, "What happens")."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence, Sized
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    import numpy as np
    import torch
    from torch import nn

    from geospec.kinds import BlockLinears, Importance
    from geospec.measure.probe import FFNSite
    from geospec.measure.sensitivity import Batch
    from geospec.prune.repair import Moments
    from geospec.spec.sections import PruneSpec


class Scored(NamedTuple):
    """One calibration sample's work: every layer's neuron scores and ordering under each
    importance the arms use (by :func:`importance_key`), with compensation its signed mean
    activations, with an ``owl`` arm every decoder layer's linear inputs, and with a search or
    a sweep its windows as loss batches."""

    scores: dict[str, list[list[float]]]
    orders: dict[str, list[list[int]]]
    means: list[torch.Tensor] | None
    blocks: list[BlockLinears] | None
    batches: list[Batch] | None
    moments: list[Moments] | None = None
    """With a score that reads them (``obs``), every layer's second moments on the windows."""


def calibrated(
    model: nn.Module,
    sites: Sequence[FFNSite],
    importances: Mapping[str, Importance],
    train_tokens: np.ndarray,
    seq_len: int,
    prune: PruneSpec,
    seed: int,
    *,
    compensate: bool,
    blocks: bool,
    batches: bool,
    bos: int | None = None,
    say: Callable[[str], None] | None = None,
) -> Scored:
    """Calibration sample ``seed``'s work (:class:`Scored`): one calibration pass records what
    the arms need, and each importance scores the neurons from it."""
    from geospec.measure.calibration import calibrate
    from geospec.plugin_base import kind_of
    from geospec.prune.apply import calibration_windows, neuron_scores
    from geospec.prune.search import calibration_batches

    calibration = prune.calibration
    starts = calibration_windows(train_tokens, seq_len, calibration.windows, seed)
    seconds = any(i.needs_second_moments for i in importances.values())
    needs = compensate or seconds or any(i.needs_activations for i in importances.values())
    found = calibrate(
        model, sites, train_tokens, starts, seq_len, calibration.batch_size, stats=needs,
        blocks=blocks, bos=bos,
    )  # fmt: skip
    device = next(model.parameters()).device
    moments = None
    if seconds:
        from geospec.prune.repair import calibration_moments, window_batches

        inputs = window_batches(train_tokens, starts, seq_len, calibration.batch_size, device, bos)
        advance = progress_lines(say, f"calibration sample {seed}: moments", inputs)
        moments = calibration_moments(model, sites, inputs, advance=advance)
    scores, orders = {}, {}
    for key, importance in importances.items():
        scoring = f"calibration sample {seed}: {kind_of(importance)} scores"
        scores[key], orders[key] = neuron_scores(
            model, sites, importance, train_tokens, starts, seq_len, calibration.batch_size,
            stats=found.stats, bos=bos, moments=moments,
            advance=progress_lines(say, scoring, sites),
        )  # fmt: skip
    means = [s.mean for s in found.stats] if compensate and found.stats is not None else None
    windows = (
        calibration_batches(train_tokens, starts, seq_len, calibration.batch_size, device, bos)
        if batches
        else None
    )
    return Scored(scores, orders, means, found.blocks, windows, moments)


def progress_lines(
    say: Callable[[str], None] | None, what: str, work: Sized
) -> Callable[[], None] | None:
    """A step's progress lines (``what: done/total, eta`` every 10 s) where it has a ``say``:
    the scores and moments of a wide model take minutes."""
    from geospec.engine.progress import LogProgress

    if say is None:
        return None
    return LogProgress(say, f"prune: {what}", len(work), interval=10).advance


def importance_key(table: Any) -> str:
    """The importance table (a plugin's params) as the scores' cache key: its JSON form."""
    return json.dumps(table.model_dump(mode="json"), sort_keys=True)
