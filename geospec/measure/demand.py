"""Measured demand: how much the loss rises when one layer's FFN keeps only a fraction of its
neurons (the others cut, by an importance ordering), every layer and fraction in turn.

For layer l and keep fraction f, layer l alone keeps its ``round(f x W_l)`` most important
neurons (a multiple of the model's rounding multiple) and the mean next-token loss on fixed
validation batches is measured; the demand is its increase over the uncut model's loss. Pairs of
layers cut together at one fraction check additivity against the sum of their single cuts, as
the diagnose stage does for its perturbations.

A cut of layer l changes nothing before layer l, so it is measured from layer l on with the
suffix machinery of :mod:`geospec.measure.suffix`: the layers before l return the residual stream
y_{l-1} that the uncut model gives (walked one layer at a time), layer l runs with its cut FFN,
and the layers after it and the head run as in a full pass. :func:`demand_full_passes` computes
the same numbers with one full forward pass per cut: the reference the tests hold the suffix to,
and what :func:`measure_demand` falls back to (saying why) on a model that fails
:func:`~geospec.measure.suffix.suffix_problem`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

import torch
from torch import nn

from geospec.kinds import ActivationStats, Importance
from geospec.measure.cut import (
    CutError,
    ffn_cut,
    ffn_layout,
    ffn_width,
    kept_neurons,
    kept_width,
    neuron_order,
    neuron_weights,
)
from geospec.measure.probe import FFNSite
from geospec.measure.sensitivity import (
    Batch,
    LossFn,
    PairEffect,
    mean_loss,
    next_token_loss,
    r_squared,
)
from geospec.measure.suffix import SuffixRunner, suffix_problem


@dataclass(frozen=True)
class Demand:
    """Loss increases of single-layer cuts and of pairs of cuts, over the uncut ``base``."""

    base: float
    """Mean next-token loss of the uncut model on the batches."""
    keep: tuple[float, ...]
    """The keep fractions, in the order of each layer's ``increase``."""
    widths: tuple[int, ...]
    """Each layer's full FFN width."""
    kept: tuple[tuple[int, ...], ...]
    """kept[l][k]: the neurons layer l keeps at fraction keep[k]."""
    increase: tuple[tuple[float, ...], ...]
    """increase[l][k]: the loss increase when layer l alone keeps kept[l][k] neurons."""
    pair_keep: float
    """The fraction both layers of a pair keep."""
    pairs: tuple[PairEffect, ...]
    """Each pair's joint increase against the sum of its single increases at ``pair_keep``."""
    fallback: str | None = None
    """Why full forward passes were used (None: from the cut layer on)."""

    @property
    def additivity_r2(self) -> float | None:
        """R^2 of joint = sum of singles over the pairs (None with fewer than 2 pairs)."""
        return r_squared([p.joint for p in self.pairs], [p.singles for p in self.pairs])

    @property
    def additivity_slope(self) -> float | None:
        """The least-squares slope of joint on sum of singles through the origin (1: additive)."""
        sx = sum(p.singles * p.singles for p in self.pairs)
        if not self.pairs or sx == 0:
            return None
        return sum(p.singles * p.joint for p in self.pairs) / sx


@dataclass(frozen=True)
class CutPlan:
    """What to cut: per layer, the neuron ordering (most important first) and the neuron count at
    each keep fraction; the layer pairs cut together, each layer of a pair at ``pair_keep``."""

    orders: tuple[tuple[int, ...], ...]
    keep: tuple[float, ...]
    counts: tuple[tuple[int, ...], ...]
    """counts[l][k]: how many neurons layer l keeps at fraction keep[k]."""
    pairs: tuple[tuple[int, int], ...]
    pair_keep: float

    @classmethod
    def of(
        cls,
        orders: Sequence[Sequence[int]],
        keep: Sequence[float],
        multiple: int,
        pairs: Sequence[tuple[int, int]] = (),
        pair_keep: float | None = None,
    ) -> CutPlan:
        """Counts ``round(f x W_l)`` to multiples of ``multiple`` (:func:`kept_width`);
        ``pair_keep`` (default: the first fraction) must be one of ``keep``."""
        pair_keep = keep[0] if pair_keep is None else pair_keep
        if pair_keep not in keep:
            raise ValueError(f"pair_keep {pair_keep} is not one of the keep fractions {keep}")
        counts = tuple(tuple(kept_width(len(order), f, multiple) for f in keep) for order in orders)
        return cls(
            tuple(tuple(order) for order in orders),
            tuple(keep),
            counts,
            tuple((int(i), int(j)) for i, j in pairs),
            pair_keep,
        )

    def kept(self, layer: int, count: int) -> list[int]:
        """The ``count`` most important neurons of ``layer``, in index order."""
        return kept_neurons(self.orders[layer], count)

    def pair_cuts(self, pair: tuple[int, int]) -> dict[int, int]:
        """Both layers of ``pair`` at ``pair_keep``."""
        k = self.keep.index(self.pair_keep)
        return {layer: self.counts[layer][k] for layer in pair}


@contextmanager
def _cut(sites: Sequence[FFNSite], plan: CutPlan, cuts: dict[int, int]) -> Iterator[None]:
    """Inside the block, layer l keeps its ``cuts[l]`` most important neurons."""
    with ExitStack() as stack:
        for layer, count in cuts.items():
            stack.enter_context(ffn_cut(sites[layer].ffn, plan.kept(layer, count)))
        yield


def demand_full_passes(
    model: nn.Module,
    sites: Sequence[FFNSite],
    batches: Sequence[Batch],
    plan: CutPlan,
    loss: LossFn = next_token_loss,
    progress: Callable[[int], None] | None = None,
) -> Demand:
    """The demand with one full forward pass over ``batches`` per cut (the reference)."""

    def loss_with(cuts: dict[int, int]) -> float:
        with _cut(sites, plan, cuts):
            value = mean_loss(model, batches, loss=loss)
        if progress is not None:
            progress(len(batches))
        return value

    base = mean_loss(model, batches, loss=loss)
    increase = [
        [loss_with({layer: count}) - base for count in plan.counts[layer]]
        for layer in range(len(sites))
    ]
    joint = [loss_with(plan.pair_cuts(pair)) - base for pair in plan.pairs]
    return _demand(base, sites, plan, increase, joint, None)


def measure_demand(
    model: nn.Module,
    sites: Sequence[FFNSite],
    batches: Sequence[Batch],
    plan: CutPlan,
    loss: LossFn = next_token_loss,
    progress: Callable[[int], None] | None = None,
) -> Demand:
    """The demand of every layer at every fraction and of the pairs, each cut measured from its
    first cut layer on (full forward passes where the model fails the suffix check).
    ``progress`` counts one cut (or one step of the walk) of one batch as 1:
    ``len(batches) * (layers x (fractions + 1) + pairs)`` in all."""
    runner = SuffixRunner(model, sites, loss)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            problem = "no batches"
            if batches:
                inputs, targets = batches[0]
                problem = suffix_problem(runner, (inputs[:1], targets[:1])) or ""
            if problem:
                per_pass = None if progress is None else progress
                reference = demand_full_passes(model, sites, batches, plan, loss, per_pass)
                return _demand(
                    reference.base,
                    sites,
                    plan,
                    reference.increase,
                    [p.joint for p in reference.pairs],
                    problem,
                )
            return _from_the_cut_on(runner, batches, plan, progress)
    finally:
        model.train(was_training)


def _from_the_cut_on(
    runner: SuffixRunner,
    batches: Sequence[Batch],
    plan: CutPlan,
    progress: Callable[[int], None] | None,
) -> Demand:
    sites = runner.sites
    layers = len(sites)
    starting: dict[int, list[int]] = {}  # first layer of a pair -> indices of its pairs
    for index, (i, _) in enumerate(plan.pairs):
        starting.setdefault(i, []).append(index)
    base, count = 0.0, 0
    totals = [[0.0] * len(plan.counts[layer]) for layer in range(layers)]
    joint = [0.0] * len(plan.pairs)

    def loss_from(
        batch: Batch, layer: int, state: torch.Tensor | None, cuts: dict[int, int]
    ) -> float:
        """The batch's loss with ``cuts`` in place, layers before ``layer`` given by ``state``."""
        with _cut(sites, plan, cuts):
            value, _ = runner.run(batch, layer - 1, state)
        assert value is not None
        if progress is not None:
            progress(1)
        return value

    for batch in batches:
        count += batch[1].numel()
        state: torch.Tensor | None = None  # y_{l-1} of the uncut model (None before layer 0)
        for layer in range(layers):
            for k, neurons in enumerate(plan.counts[layer]):
                totals[layer][k] += loss_from(batch, layer, state, {layer: neurons})
            for index in starting.get(layer, []):
                joint[index] += loss_from(batch, layer, state, plan.pair_cuts(plan.pairs[index]))
            last = layer == layers - 1
            value, walked = runner.run(
                batch, layer - 1, state, keep=(layer,), stop=None if last else layer
            )
            if progress is not None:
                progress(1)
            if last:
                assert value is not None
                base += value
            state = walked[layer][1]
    mean = base / count
    increase = [[t / count - mean for t in row] for row in totals]
    return _demand(mean, sites, plan, increase, [t / count - mean for t in joint], None)


def _demand(
    base: float,
    sites: Sequence[FFNSite],
    plan: CutPlan,
    increase: Sequence[Sequence[float]],
    joint: Sequence[float],
    fallback: str | None,
) -> Demand:
    k = plan.keep.index(plan.pair_keep)
    pairs = tuple(
        PairEffect((i, j), value, increase[i][k] + increase[j][k])
        for (i, j), value in zip(plan.pairs, joint, strict=True)
    )
    return Demand(
        base=base,
        keep=plan.keep,
        widths=tuple(ffn_width(site.ffn) for site in sites),
        kept=plan.counts,
        increase=tuple(tuple(row) for row in increase),
        pair_keep=plan.pair_keep,
        pairs=pairs,
        fallback=fallback,
    )


def neuron_orders(
    sites: Sequence[FFNSite],
    importance: Importance,
    calibration: Callable[[], list[ActivationStats]],
) -> list[list[int]]:
    """Every layer's neuron ordering by ``importance``, most important first; a score that reads
    activations gets each layer's statistics from ``calibration`` (called only then, after the
    FFN layout is known to be one geospec can cut)."""
    try:
        ffn_layout(sites[0].ffn)
    except CutError as error:
        raise CutError(
            f"the FFN of {type(sites[0].layer).__name__} (the module the probe maps as its FFN): "
            f"{error}"
        ) from None
    stats: Sequence[ActivationStats | None] = (
        calibration() if importance.needs_activations else [None] * len(sites)
    )
    return [
        neuron_order(importance, neuron_weights(site.ffn, layer, stats=stats[layer]))
        for layer, site in enumerate(sites)
    ]
