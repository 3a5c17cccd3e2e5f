"""The calibration loss of a pruned model at widths near a base, for a search allocation
(``greedy``): each change of one layer's width recomputes only the layers from it on.

The base pruning is applied as zeroed activations (:func:`geospec.measure.cut.zeroed_neurons`:
what a cut computes exactly, without rebuilding modules); a change narrows one layer further by
zeroing more of its neurons on top. Per calibration batch the base model is walked one layer at a
time (:class:`geospec.measure.suffix.SuffixRunner`), and a change at layer l runs from layer l on,
from the base model's output of layer l - 1: the prefix is never computed again. A model whose
layers share state other than the residual stream fails
:func:`~geospec.measure.suffix.suffix_problem` and gets full forward passes instead (the same
numbers, slower).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager

import numpy as np
import torch
from torch import nn

from geospec.measure.cut import zeroed_neurons
from geospec.measure.probe import FFNSite
from geospec.measure.sensitivity import Batch, next_token_loss
from geospec.measure.suffix import SuffixRunner, suffix_problem


def calibration_batches(
    tokens: np.ndarray,
    starts: np.ndarray,
    seq_len: int,
    batch_size: int,
    device: torch.device,
    bos: int | None = None,
) -> list[Batch]:
    """The calibration windows at ``starts`` as next-token batches: each window of ``seq_len``
    tokens predicts its last ``seq_len - 1`` from the ones before (with ``bos``, read after it,
    all ``seq_len``)."""
    from geospec.engine.batches import with_bos

    ids = torch.as_tensor(np.stack([tokens[s : s + seq_len].astype(np.int64) for s in starts]))
    inputs = with_bos(ids[:, :-1], bos) if bos is not None else ids[:, :-1]
    targets = ids if bos is not None else ids[:, 1:]
    return [
        (x.to(device), y.to(device))
        for x, y in zip(inputs.split(batch_size), targets.split(batch_size), strict=True)
    ]


class SuffixCutLosses:
    """:class:`geospec.kinds.CutLosses` of ``model`` on ``batches``, the neurons of layer l cut
    in the order ``orders[l]`` (best first)."""

    def __init__(
        self,
        model: nn.Module,
        sites: Sequence[FFNSite],
        orders: Sequence[Sequence[int]],
        batches: Sequence[Batch],
    ) -> None:
        self.model, self.sites, self.orders, self.batches = model, sites, orders, batches
        self.runner = SuffixRunner(model, sites, next_token_loss)
        with torch.no_grad():
            self.fallback = suffix_problem(self.runner, batches[0])
        """Why full forward passes are used (None: from the changed layer on)."""
        self.count = sum(targets.numel() for _, targets in batches)

    @contextmanager
    def _cut(self, layer: int, width: int) -> Iterator[None]:
        with zeroed_neurons(self.sites[layer].ffn, list(self.orders[layer][width:])):
            yield

    def __call__(self, widths: Sequence[int], changes: Sequence[tuple[int, int]]) -> list[float]:
        for layer, width in changes:
            if not 0 < width < widths[layer]:
                raise ValueError(f"layer {layer}: a change to {width} narrows no base {widths}")
        totals = [0.0] * len(changes)
        at: dict[int, list[int]] = {}  # layer -> indices of its changes
        for index, (layer, _) in enumerate(changes):
            at.setdefault(layer, []).append(index)
        last = max(at, default=-1)
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad(), ExitStack() as base:
                for layer, width in enumerate(widths):
                    base.enter_context(self._cut(layer, width))
                for batch in self.batches:
                    self._batch(batch, changes, at, last, totals)
        finally:
            self.model.train(was_training)
        return [total / self.count for total in totals]

    def _batch(
        self,
        batch: Batch,
        changes: Sequence[tuple[int, int]],
        at: dict[int, list[int]],
        last: int,
        totals: list[float],
    ) -> None:
        if self.fallback is not None:
            for index, (layer, width) in enumerate(changes):
                with self._cut(layer, width):
                    totals[index] += float(next_token_loss(self.model, *batch))
            return
        state = None  # the base model's output of the layer before
        for layer in range(last + 1):
            for index in at.get(layer, []):
                with self._cut(layer, changes[index][1]):
                    value, _ = self.runner.run(batch, layer - 1, state)
                assert value is not None
                totals[index] += value
            if layer < last:
                _, walked = self.runner.run(batch, layer - 1, state, keep=(layer,), stop=layer)
                state = walked[layer][1]
