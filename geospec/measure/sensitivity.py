"""Layer sensitivity and local additivity of the loss under perturbations of FFN sub-layers.

A perturbation multiplies the output of one or more FFN sub-layers by a factor s: with x the
residual stream entering the FFN's pre-norm and y the decoder layer's output, the layer returns
x + s (y - x) instead of y. Since y - x is exactly the FFN sub-layer's contribution to the residual
stream (a post-FFN norm included, as in Gemma), this is the same as scaling the sub-layer's output,
on any architecture :func:`geospec.measure.probe.find_ffn_sites` maps, without touching the weights.
s = 1 - eps shrinks the contribution a little (local); s = 0 removes it. The perturbed layer
returns x itself when s = 0, so a layer whose FFN outputs zeros has sensitivity exactly 0.

The loss is measured on a fixed list of batches, without gradients, and accumulated in float64;
every perturbation sees the same batches in the same order, so differences are not sampling noise.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import combinations
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from geospec.engine.distributed import DistContext, spread_over_ranks
from geospec.errors import UsageError
from geospec.measure.probe import FFNSite, find_ffn_sites

if TYPE_CHECKING:
    from geospec.engine.token_data import TokenData

Batch = tuple[torch.Tensor, torch.Tensor]
#: ``loss(model, inputs, targets)`` -> the summed loss of the batch (a scalar tensor); the mean is
#: the sum over all batches divided by the number of target elements.
LossFn = Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]


def logits_of(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """Next-token logits of geospec's model or a Hugging Face causal LM (no KV cache)."""
    config = getattr(model, "config", None)
    if config is not None and hasattr(config, "use_cache"):
        logits: torch.Tensor = model(input_ids=ids, use_cache=False).logits
        return logits
    out = model(ids)
    return out[0] if isinstance(out, tuple) else out


def next_token_loss(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Summed next-token cross-entropy: per token in float32, summed in float64 (loss changes
    of 1e-5 must not drown in the rounding of a float32 sum)."""
    logits = logits_of(model, inputs)
    per_token = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), reduction="none")
    return per_token.double().sum()


def scored_text(tokens: np.ndarray, eot: int | None) -> np.ndarray:
    """The validation tokens whose next-token losses are scored: without the end-of-text token
    packed after the last document (``eot``; None when documents are packed without it), which
    separates that document from nothing and is no text the model should predict."""
    if eot is not None and len(tokens) and int(tokens[-1]) == eot:
        return tokens[:-1]
    return tokens


def loss_batches(
    tokens: np.ndarray,
    seq_len: int,
    windows: int,
    batch_size: int,
    device: torch.device,
    bos: int | None = None,
) -> list[Batch]:
    """The first ``windows`` validation windows (inputs, next-token targets), in batches; with
    ``bos``, each window's inputs start with it (:func:`geospec.engine.batches.window_tensors`)."""
    from geospec.engine.batches import validation_windows, window_tensors

    chosen = validation_windows(len(tokens), seq_len, windows * seq_len)
    batches = []
    for start in range(0, len(chosen), batch_size):
        x, y = window_tensors(tokens, chosen[start : start + batch_size], seq_len, bos)
        batches.append((x.to(device), y.to(device)))
    return batches


def drawn_loss_batches(
    tokens: np.ndarray,
    seq_len: int,
    windows: int,
    batch_size: int,
    device: torch.device,
    seed: int,
    bos: int | None = None,
) -> list[Batch]:
    """``windows`` windows (inputs, next-token targets) drawn without overlap with ``seed``, in
    the order of the text, in batches: a seeded draw where :func:`loss_batches` takes the first
    ones (prune.allocation_seeds' seed k measures its losses on its own windows); ``bos`` as
    :func:`loss_batches` takes it."""
    from geospec.engine.batches import window_count, window_tensors

    available = window_count(len(tokens), seq_len)
    if available == 0:
        raise UsageError(
            f"{len(tokens)} tokens are fewer than model.seq_len + 1 = {seq_len + 1}; use more data"
        )
    rng = np.random.default_rng(seed)
    chosen = np.sort(rng.choice(available, size=min(windows, available), replace=False))
    batches = []
    for start in range(0, len(chosen), batch_size):
        x, y = window_tensors(tokens, chosen[start : start + batch_size], seq_len, bos)
        batches.append((x.to(device), y.to(device)))
    return batches


@dataclass(frozen=True)
class LossSetup:
    """A model with its FFN sites and the batches its losses are measured on."""

    model: nn.Module
    width: int
    """The residual-stream width."""
    data: TokenData
    batches: list[Batch]
    sites: list[FFNSite]

    @property
    def windows(self) -> int:
        return sum(len(x) for x, _ in self.batches)


def loss_setup(
    model: nn.Module,
    width: int,
    data: TokenData,
    tokens: np.ndarray,
    seq_len: int,
    windows: int,
    batch_size: int,
    *,
    end_of_text: bool,
    seed: int | None = None,
) -> LossSetup:
    """``model`` with its FFN sites and ``windows`` windows of ``tokens`` (a split of ``data``)
    in batches: the first ones (:func:`loss_batches`), or drawn with ``seed``
    (:func:`drawn_loss_batches`); without the end-of-text token that closes the split where
    ``end_of_text`` packed one after every document (:func:`scored_text`)."""
    device = next(model.parameters()).device
    text = scored_text(tokens, data.eot_id if end_of_text else None)
    if seed is None:
        batches = loss_batches(text, seq_len, windows, batch_size, device, data.bos_id)
    else:
        batches = drawn_loss_batches(text, seq_len, windows, batch_size, device, seed, data.bos_id)
    sites = find_ffn_sites(model, width, lambda: logits_of(model, batches[0][0][:1]))
    return LossSetup(model, width, data, batches, sites)


def perturbed(x: torch.Tensor, y: torch.Tensor, scale: float) -> torch.Tensor:
    """A decoder layer's output with its FFN sub-layer's contribution y - x scaled: x + scale
    (y - x), and x itself for scale 0 (x enters the FFN's pre-norm, y leaves the layer)."""
    return x if scale == 0 else x + scale * (y - x)


@contextmanager
def scaled_sublayers(sites: Sequence[FFNSite], scales: Mapping[int, float]) -> Iterator[None]:
    """Inside the block, layer l's FFN sub-layer output is multiplied by ``scales[l]``."""
    handles = []
    for layer, scale in scales.items():
        site = sites[layer]
        entering: list[torch.Tensor] = []

        # Forward pre-hooks must return None: a returned value would replace the norm's input.
        def remember(module: nn.Module, args: tuple[Any, ...], store: list[Any] = entering) -> None:
            store[:] = [args[0]]

        def rescale(
            module: nn.Module,
            args: tuple[Any, ...],
            out: Any,
            store: list[Any] = entering,
            scale: float = scale,
        ) -> Any:
            y = out[0] if isinstance(out, tuple) else out
            new = perturbed(store[0], y, scale)
            return (new, *out[1:]) if isinstance(out, tuple) else new

        handles.append(site.pre_norm.register_forward_pre_hook(remember))
        handles.append(site.layer.register_forward_hook(rescale))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def mean_loss(
    model: nn.Module,
    batches: Sequence[Batch],
    sites: Sequence[FFNSite] = (),
    scales: Mapping[int, float] | None = None,
    loss: LossFn = next_token_loss,
) -> float:
    """The mean loss over ``batches`` with the given sub-layers scaled (none by default)."""
    total, count = 0.0, 0
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), scaled_sublayers(sites, scales or {}):
            for inputs, targets in batches:
                total += float(loss(model, inputs, targets).double())
                count += targets.numel()
    finally:
        model.train(was_training)
    return total / count


@dataclass(frozen=True)
class Sensitivity:
    """Loss increases over ``base`` per layer: its FFN scaled by (1 - eps), and removed."""

    base: float
    eps: float
    scale: list[float]
    remove: list[float]


def layer_sensitivity(
    model: nn.Module,
    sites: Sequence[FFNSite],
    batches: Sequence[Batch],
    eps: float,
    loss: LossFn = next_token_loss,
    progress: Callable[[int], None] | None = None,
    dist: DistContext | None = None,
) -> Sensitivity:
    """Loss increase when each layer's FFN sub-layer output is scaled by (1 - eps) and by 0.

    ``dist`` (under torchrun, every rank calling this with the same model and batches): each
    rank runs its share of the perturbations and every rank returns all of them, the values of
    one process (each perturbation's loss is computed alone, over the same batches in order)."""
    base = mean_loss(model, batches, loss=loss)
    jobs = [(layer, factor) for layer in range(len(sites)) for factor in (1.0 - eps, 0.0)]

    def compute(mine: list[int]) -> list[float]:
        changes = []
        for job in mine:
            layer, factor = jobs[job]
            changes.append(mean_loss(model, batches, sites, {layer: factor}, loss) - base)
            if progress is not None:
                progress(1)
        return changes

    changes = spread_over_ranks(len(jobs), compute, dist)
    return Sensitivity(base, eps, changes[0::2], changes[1::2])


@dataclass(frozen=True)
class PairEffect:
    """Two layers perturbed together: the joint loss change against the sum of the singles."""

    layers: tuple[int, int]
    joint: float
    singles: float

    @property
    def interaction(self) -> float:
        return self.joint - self.singles

    def record(self) -> dict[str, Any]:
        """The pair as diagnostics.json and demand.json record it."""
        return {
            "layers": list(self.layers),
            "joint": self.joint,
            "sum_of_singles": self.singles,
            "interaction": self.interaction,
        }


@dataclass(frozen=True)
class Additivity:
    """Local additivity over sampled layer pairs; ``r2`` of joint = sum of singles (None if
    the joint changes do not vary)."""

    scale: float
    pairs: list[PairEffect]
    r2: float | None

    def worst(self, count: int = 5) -> list[PairEffect]:
        """The pairs whose joint change departs most from the sum of their singles."""
        return sorted(self.pairs, key=lambda p: -abs(p.interaction))[:count]


def sample_pairs(n_layers: int, count: int, seed: int) -> list[tuple[int, int]]:
    """``count`` distinct layer pairs (i < j) drawn with ``random.Random(seed)``, in order; every
    pair when there are no more than ``count``."""
    every = list(combinations(range(n_layers), 2))
    if count >= len(every):
        return every
    return sorted(random.Random(seed).sample(every, count))


def r_squared(observed: Sequence[float], predicted: Sequence[float]) -> float | None:
    """1 - sum (o - p)^2 / sum (o - mean o)^2: how well ``predicted`` explains ``observed`` with
    no fitted coefficients (1: identical); None when ``observed`` is constant."""
    o = np.asarray(observed, dtype=np.float64)
    p = np.asarray(predicted, dtype=np.float64)
    if len(o) < 2:  # before the spread: the mean of nothing warns (pairs = 0)
        return None
    spread = float(((o - o.mean()) ** 2).sum())
    if spread == 0:
        return None
    return 1.0 - float(((o - p) ** 2).sum()) / spread


def additivity(
    model: nn.Module,
    sites: Sequence[FFNSite],
    batches: Sequence[Batch],
    sensitivity: Sensitivity,
    pairs: Sequence[tuple[int, int]],
    loss: LossFn = next_token_loss,
    progress: Callable[[int], None] | None = None,
    dist: DistContext | None = None,
) -> Additivity:
    """Perturb both layers of each pair by (1 - eps) and compare with the sum of the singles
    (``dist``: the pairs shared among torchrun's ranks, as in :func:`layer_sensitivity`)."""
    scale = 1.0 - sensitivity.eps

    def compute(mine: list[int]) -> list[float]:
        joints = []
        for index in mine:
            i, j = pairs[index]
            scales = {i: scale, j: scale}
            joints.append(mean_loss(model, batches, sites, scales, loss) - sensitivity.base)
            if progress is not None:
                progress(1)
        return joints

    joints = spread_over_ranks(len(pairs), compute, dist)
    effects = [
        PairEffect((i, j), joint, sensitivity.scale[i] + sensitivity.scale[j])
        for (i, j), joint in zip(pairs, joints, strict=True)
    ]
    fit = r_squared([e.joint for e in effects], [e.singles for e in effects])
    return Additivity(scale, effects, fit)
