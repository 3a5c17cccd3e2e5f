"""The pruning allocations from neuron scores of the model being pruned: FLAP's global threshold
over standardised scores (flap), OWL's outlier ratios of every linear map of a block (owl) or
of the neuron scores alone (owl_neuron)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

from pydantic import Field

from geospec.errors import UsageError
from geospec.kinds import (
    BlockLinears,
    ModelDims,
    ScoreAllocation,
    round_to_budget,
)
from geospec.plugin import (
    PluginParams,
)


class NeuronScoreParams(PluginParams):
    """What the pruning allocations share (they read neuron scores, not profiles)."""


class Flap(ScoreAllocation):
    """FLAP's allocation (An et al., 2024) restricted to FFNs (attention heads are not pruned):
    every layer's neuron scores are standardised within the layer (minus its mean, over its
    sample standard deviation), one global threshold over all the model's FFN neurons removes
    the ``N - dims.budget`` worst standardised ones (N: all neurons), and a layer's width is its
    number of neurons strictly above that threshold (:meth:`counts`), rounded to multiples with
    the exact budget (each layer at least one multiple and at most ``dims.max_width``).

    This is FLAP's own rule for FFN channels (CASIA-IVA-Lab/FLAP, ``lib/prune.py``: the
    standardisation ``(x - mean) / std`` over each layer's channels, line 368, ``torch.std``
    unbiased; the ``AL-MM`` threshold, lines 383-385, ``sorted_mlp[-remove]`` with the mask
    ``metric > threshold``, which prunes FFN channels under one threshold and heads under
    another; with no head pruned, that is FLAP's allocation of the FFNs). Where it differs:
    FLAP keeps exact counts, geospec rounds to ``model.multiple_of``; and with nothing to
    remove (keep 1) every neuron is kept (FLAP's ``sorted[-0]`` would index the best). The
    scores are the arm's importance: FLAP's own metric is ``fluctuation`` (WIFV), and FLAP also
    compensates the removed channels with a bias, ``compensate = "mean"``; FLAP as its paper
    runs it is the arm ``{ schedule = { kind = "flap" }, importance = { kind = "fluctuation"
    }, compensate = "mean" }``.
    """

    class Params(NeuronScoreParams):
        kind: Literal["flap"] = "flap"

    def counts(self, scores: Sequence[Sequence[float]], budget: int) -> list[int]:
        """FLAP's kept count per layer before rounding: the neurons whose standardised score is
        strictly above the best of the ``N - budget`` removed ones (a tie at the threshold
        removes every neuron of the tie, as FLAP's ``>`` does)."""
        standardised = [_standardised(layer) for layer in scores]
        pooled = sorted((z for layer in standardised for z in layer), reverse=True)
        if budget > len(pooled):
            raise UsageError(
                f"flap: the budget {budget} exceeds the {len(pooled)} neurons there are"
            )
        removed = len(pooled) - budget
        if removed == 0:
            return [len(layer) for layer in scores]
        threshold = pooled[-removed]
        return [sum(1 for z in layer if z > threshold) for layer in standardised]

    def widths_from_scores(self, dims: ModelDims, scores: Sequence[Sequence[float]]) -> list[int]:
        counts = [float(c) for c in self.counts(scores, dims.budget)]
        # a tie at the threshold can keep fewer than the budget: rounding fixes the sum
        return _rounded(dims, counts, scores)


class OwlParams(NeuronScoreParams):
    """OWL's two hyperparameters."""

    m: float = Field(5.0, gt=0.0, le=1000.0)
    """A score above m x the layer's mean score is an outlier (OWL's M)."""
    lam: float = Field(0.08, ge=0.0, le=0.5)
    """Keep ratios spread over the overall keep ratio +- lam (OWL's lambda)."""


class Owl(ScoreAllocation):
    """OWL's allocation (Yin et al., 2024) applied to FFN widths. A layer's outlier ratio D_l is
    the share of the per-weight Wanda scores |W_ij| x ‖X_j‖₂ of every linear map of decoder
    layer l (attention q/k/v/o and the MLP's gate/up/down; GPT-2's c_attn, c_proj, c_fc,
    mlp.c_proj) above ``m`` times their mean, all the block's weights pooled; the keep ratios
    are the ratios mapped linearly onto [0, 2 ``lam``] and shifted to mean the overall keep
    ratio; a layer's width is its keep ratio x its pretrained width, rounded to multiples with
    the exact budget (at least one multiple, at most ``dims.max_width``).

    OWL's code (luuyin/OWL, ``lib/prune_all.py``, ``prune_wanda_outlier``): the scores of every
    ``nn.Linear`` of the layer concatenated, lines 915-943; D_l = the share above
    ``mean x Hyper_m`` (``check_outlier_mean``, lines 139-154, in percent, a scale the
    normalisation removes); ``(D - min) / (max - min) x 2 Lamda``, minus its mean, plus the
    target density, lines 962-966. Where it differs: OWL sets each layer's unstructured sparsity
    (a layer sparsity at or below 0 becomes 0.01, lines 1054-1058); here the ratio sets the
    FFN's width, capped at the pretrained width with the surplus rounded onto the other layers
    so the budget stays exact, and which neurons go is the arm's importance (``wanda_sp`` is
    Wanda's structured score). Equal outlier ratios give uniform widths (OWL divides by zero).
    OWL's defaults: ``lam`` 0.08 with ``m`` 5 in its README's unstructured recipes
    (``main.py``'s own default ``m`` is 3). The ratios come from ``[prune]``'s calibration
    (:class:`~geospec.kinds.BlockLinears`, :attr:`reads_block_linears`); ``owl_neuron`` counts
    outliers among the neuron scores instead.
    """

    reads_block_linears = True

    class Params(OwlParams):
        kind: Literal["owl"] = "owl"

    params: Params

    def outlier_ratios(self, blocks: Sequence[BlockLinears]) -> list[float]:
        """D_l: the share of layer l's per-weight Wanda scores above m x their mean."""
        ratios = []
        for block in blocks:
            scores = [linear.wanda_scores() for linear in block.linears]
            if not scores:
                raise UsageError(f"owl: decoder layer {block.layer} has no linear map")
            count = sum(s.numel() for s in scores)
            threshold = self.params.m * float(sum(s.sum() for s in scores)) / count
            outliers = sum(int((s > threshold).sum()) for s in scores)
            ratios.append(outliers / count)
        return ratios

    def keep_ratios(self, blocks: Sequence[BlockLinears], keep: float) -> list[float]:
        """OWL's per-layer keep ratios around the overall ``keep``."""
        return _owl_keep_ratios(self.outlier_ratios(blocks), keep, self.params.lam)

    def widths_from_scores(self, dims: ModelDims, scores: Sequence[Sequence[float]]) -> list[int]:
        raise UsageError(
            "'owl' reads every linear map of each decoder layer with its calibration inputs "
            "(OWL's per-weight scores), which geospec prune gives it; 'owl_neuron' allocates "
            "from neuron scores alone"
        )

    def widths_from_blocks(
        self,
        dims: ModelDims,
        scores: Sequence[Sequence[float]],
        blocks: Sequence[BlockLinears],
    ) -> list[int]:
        if len(blocks) != dims.n_layers:
            raise UsageError(f"owl: {len(blocks)} decoder layers measured for {dims.n_layers}")
        total = sum(len(layer) for layer in scores)
        ratios = self.keep_ratios(blocks, dims.budget / total)
        counts = [r * len(layer) for r, layer in zip(ratios, scores, strict=True)]
        return _rounded(dims, counts, scores)


class OwlNeuron(ScoreAllocation):
    """OWL's rule on neuron scores alone (what ``owl`` was before 0.2's faithful one): a layer's
    outlier ratio D_l is the share of its neuron scores (the arm's importance) above ``m`` times
    the layer's mean score, mapped to keep ratios as ``owl`` does. Cheaper (no calibration of
    the attention and MLP inputs), and not OWL: one score per FFN neuron, not per weight of the
    block."""

    class Params(OwlParams):
        kind: Literal["owl_neuron"] = "owl_neuron"

    params: Params

    def outlier_ratios(self, scores: Sequence[Sequence[float]]) -> list[float]:
        """D_l: the share of layer l's scores above m x its mean score."""
        ratios = []
        for layer in scores:
            mean = sum(layer) / len(layer)
            ratios.append(sum(1 for s in layer if s > self.params.m * mean) / len(layer))
        return ratios

    def keep_ratios(self, scores: Sequence[Sequence[float]], keep: float) -> list[float]:
        """OWL's per-layer keep ratios around the overall ``keep``."""
        return _owl_keep_ratios(self.outlier_ratios(scores), keep, self.params.lam)

    def widths_from_scores(self, dims: ModelDims, scores: Sequence[Sequence[float]]) -> list[int]:
        total = sum(len(layer) for layer in scores)
        ratios = self.keep_ratios(scores, dims.budget / total)
        counts = [r * len(layer) for r, layer in zip(ratios, scores, strict=True)]
        return _rounded(dims, counts, scores)


def _owl_keep_ratios(ratios: Sequence[float], keep: float, lam: float) -> list[float]:
    """OWL's map from outlier ratios to keep ratios (``lib/prune_all.py`` lines 962-966):
    min-max onto [0, 2 lam], shifted to mean ``keep``; equal ratios give ``keep`` everywhere."""
    low, high = min(ratios), max(ratios)
    spread = (
        [0.0] * len(ratios) if high == low else [(r - low) / (high - low) * 2 * lam for r in ratios]
    )
    mean = sum(spread) / len(spread)
    return [keep + s - mean for s in spread]


def _standardised(layer: Sequence[float]) -> list[float]:
    """(s - mean) / sd with the sample standard deviation (n - 1, as ``torch.std``)."""
    n = len(layer)
    mean = sum(layer) / n
    sd = math.sqrt(sum((s - mean) ** 2 for s in layer) / (n - 1)) if n > 1 else 0.0
    return [0.0] * n if sd == 0 else [(s - mean) / sd for s in layer]


def _rounded(
    dims: ModelDims, counts: Sequence[float], scores: Sequence[Sequence[float]]
) -> list[int]:
    """Widths near ``counts`` in multiples, summing to the budget, at least one multiple and at
    most the narrowest layer's neuron count (pruning never grows a layer; pretrained models have
    one width)."""
    if len(scores) != dims.n_layers:
        raise UsageError(f"{len(scores)} layers of neuron scores for {dims.n_layers} layers")
    upper = min(len(layer) for layer in scores)
    if dims.max_width is not None:
        upper = min(upper, dims.max_width)
    return round_to_budget(counts, dims.budget, dims.multiple_of, dims.multiple_of, upper, counts)
