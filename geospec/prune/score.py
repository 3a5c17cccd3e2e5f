"""What a calibration sample yields, once per seed: its windows of the training text
(:func:`calibration_windows`), every layer's neuron scores and ordering under each importance a
prune's arms use (:func:`neuron_scores`), and what the cut, the repair and the searches read from
the same pass (docs/prune.md, "What happens")."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence, Sized
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    import numpy as np
    import torch
    from torch import nn

    from geospec.kinds import ActivationStats, BlockLinears, Importance
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


def calibration_windows(tokens: np.ndarray, seq_len: int, windows: int, seed: int) -> np.ndarray:
    """Start offsets of ``windows`` non-overlapping windows of ``seq_len`` tokens drawn from
    ``tokens`` with ``seed`` (calibration sample ``seed``)."""
    import numpy as np

    from geospec.errors import UsageError

    available = len(tokens) // seq_len
    if windows > available:
        raise UsageError(
            f"prune.calibration.windows {windows} exceeds the {available} training windows of "
            f"{seq_len} tokens; lower it or use more data"
        )
    drawn = np.random.default_rng(seed).choice(available, size=windows, replace=False)
    return np.sort(drawn) * seq_len


def neuron_scores(
    model: nn.Module,
    sites: Sequence[FFNSite],
    importance: Importance,
    tokens: np.ndarray,
    starts: np.ndarray,
    seq_len: int,
    batch_size: int,
    stats: Sequence[ActivationStats] | None = None,
    bos: int | None = None,
    moments: Sequence[Moments] | None = None,
    advance: Callable[[], None] | None = None,
) -> tuple[list[list[float]], list[list[int]]]:
    """Every layer's neuron scores by ``importance`` and the orderings they give (``advance``
    called after each layer's: OBS takes a minute a layer on a 4,864-wide FFN). An importance
    that needs activations gets ``stats`` (from
    :func:`geospec.measure.calibration.calibration_stats`), or, when they are not given, the
    statistics of a calibration pass over the windows at ``starts``; ``stats`` given to an
    importance that needs none are not shown to it. One that needs second moments gets
    ``moments`` (:func:`geospec.prune.repair.calibration_moments`), or those of a pass over the
    same windows."""
    from geospec.measure.calibration import calibration_stats
    from geospec.measure.cut import checked_scores, neuron_weights, order_of

    layers: list[ActivationStats | None] = [None] * len(sites)
    needs = importance.needs_activations or importance.needs_second_moments
    if needs:
        if stats is None:
            stats = calibration_stats(model, sites, tokens, starts, seq_len, batch_size, bos)
        if len(stats) != len(sites):
            raise ValueError(f"statistics of {len(stats)} layers for {len(sites)} FFNs")
        layers = list(stats)
    seconds: list[torch.Tensor | None] = [None] * len(sites)
    if importance.needs_second_moments:
        if moments is None:
            from geospec.prune.repair import calibration_moments, window_batches

            device = next(model.parameters()).device
            batches = window_batches(tokens, starts, seq_len, batch_size, device, bos)
            moments = calibration_moments(model, sites, batches)
        seconds = [m.second for m in moments]
    views = [
        neuron_weights(site.ffn, layer, stats=layers[layer], second_moment=seconds[layer])
        for layer, site in enumerate(sites)
    ]
    checked = []
    for view in views:  # each plugin call once
        checked.append(checked_scores(importance, view))
        if advance is not None:
            advance()
    return [s.tolist() for s in checked], [order_of(s) for s in checked]


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
