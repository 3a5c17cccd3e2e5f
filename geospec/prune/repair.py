"""Repair: what a cut FFN's kept neurons become, re-fitted on calibration text.

A cut keeps the neurons K of an FFN whose output is ``W a + b0`` (W the output projection,
d_model x n; a the hidden activations, the output projection's input). The least-squares
repair (``prune.repair = "lstsq"``) replaces the kept columns W_K by W_K' and adds an
intercept c to the bias, minimising over the calibration tokens

    E || W a - (W_K' a_K + c) ||^2  +  lambda || W_K' - W_K ||^2,

the unpruned FFN's output being the target. Only the output projection changes: the gate and up
(input) rows of every kept neuron stay the original rows. The normal equations need the hidden
activations' second moments H = E[a a^T] and mean mu = E[a] (:class:`Moments`, accumulated in
float64): with z = [a_K; 1],

    [W_K', c] = (W [H[:, K], mu] + lambda [W_K, 0]) (E[z z^T] + lambda diag(1, .., 1, 0))^-1,

solved in float64 (:func:`refit`). The damping lambda = ``damping`` x the mean of diag H[K, K]
(SparseGPT's relative dampening) pulls W_K' towards W_K, not towards zero: it is the damped
Hessian H + lambda I of structured OBS (ZipLM), whose update for a fixed kept set ends at this
re-fit. The intercept is not damped. Two limits say what it is: with every kept weight frozen
(lambda -> infinity) c = W_R mu_R, FLAP's mean compensation (``repair = "mean"``); with
lambda = 0 it is the ordinary least-squares fit of W a on [a_K, 1].

Where H comes from (``prune.lstsq.inputs``):

- ``"unpruned"``: every layer's moments from the unpruned model's activations, one calibration
  pass for all layers (:func:`moments_of`), shared by every unit of a calibration seed;
- ``"sequential"``: layer by layer, each layer's moments on the activations of the model whose
  earlier layers are already cut and repaired (SparseGPT's and OSSCAR's sequential targets:
  :func:`sequential_refits`), a walk of about two model passes per unit.

A unit's re-fitted weights are its record ``repair.safetensors`` (:func:`save_refits`, sealed by
the unit's key and a digest of the tensors; :func:`load_refits` names what is wrong with a
damaged one, and the unit's repair is then computed again).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch import nn

from geospec.measure.cut import (
    CutError,
    ffn_cut,
    ffn_layout,
    ffn_width,
    kept_neurons,
    output_matrix,
)
from geospec.measure.probe import FFNSite
from geospec.measure.sensitivity import Batch, logits_of, next_token_loss


@dataclass(frozen=True)
class Moments:
    """One FFN's calibration moments of its hidden activations a (float64, on the CPU)."""

    second: torch.Tensor
    """E[a a^T], (n, n)."""
    mean: torch.Tensor
    """E[a], (n,)."""
    count: int
    """The tokens averaged over."""


class Refit(NamedTuple):
    """One layer's repair: the kept columns of its output projection (d_model x kept, in the
    weight's dtype, kept neurons in index order) and the bias added to the projection's own
    (float64, (d_model,); None for a re-fit without an intercept, which adds no bias)."""

    weight: torch.Tensor
    bias: torch.Tensor | None


#: The dtype each batch's product a^T a is formed in before it joins the float64 sum: float32
#: (a batch's ~1k tokens summed in float32, ~1e-6 relative, then accumulated in float64) runs
#: float32 matrix kernels, several times float64's speed on a CPU (benchmarks/repair.py
#: measures both and the re-fit's difference).
PRODUCTS = torch.float32


@contextmanager
def moments_of(
    ffns: Sequence[nn.Module], products: torch.dtype | None = None
) -> Iterator[Callable[[], list[Moments]]]:
    """Inside the block, accumulate every FFN's hidden-activation moments (the sums of a a^T
    and of a over every token run: each batch's in ``products``, default :data:`PRODUCTS`,
    summed over batches in float64); the yielded function returns their means."""
    sums: list[list[Any]] = [[None, None, 0] for _ in ffns]
    dtype = PRODUCTS if products is None else products

    def hook(i: int) -> Callable[..., None]:
        def accumulate(module: nn.Module, args: tuple[Any, ...]) -> None:
            flat = args[0].detach().reshape(-1, args[0].shape[-1]).to(dtype)
            second = (flat.T @ flat).to("cpu", torch.float64)
            total = flat.sum(dim=0, dtype=torch.float64).cpu()
            held = sums[i]
            held[0] = second if held[0] is None else held[0].add_(second)
            held[1] = total if held[1] is None else held[1].add_(total)
            held[2] += flat.shape[0]

        return accumulate

    handles = [
        getattr(ffn, ffn_layout(ffn).output).register_forward_pre_hook(hook(i))
        for i, ffn in enumerate(ffns)
    ]

    def means() -> list[Moments]:
        found = []
        for i, (second, total, count) in enumerate(sums):
            if second is None:
                raise CutError(f"FFN {i} was not called: no activations to repair from")
            found.append(Moments(second / count, total / count, count))
        return found

    try:
        yield means
    finally:
        for handle in handles:
            handle.remove()


def window_batches(
    tokens: Any,
    starts: Sequence[int] | Any,
    seq_len: int,
    batch_size: int,
    device: torch.device,
    bos: int | None = None,
) -> list[Batch]:
    """The calibration windows at ``starts`` as the calibration pass reads them
    (:func:`geospec.engine.batches.input_windows`), in batches on ``device``; each batch's
    targets are its inputs (a repair reads activations, never a loss)."""
    from geospec.engine.batches import input_windows

    ids = input_windows(tokens, starts, seq_len, bos).to(device)
    return [(batch, batch) for batch in ids.split(batch_size)]


def calibration_moments(
    model: nn.Module,
    sites: Sequence[FFNSite],
    batches: Sequence[Batch],
    products: torch.dtype | None = None,
    advance: Callable[[], None] | None = None,
) -> list[Moments]:
    """Every layer's :class:`Moments` on the unpruned ``model``'s activations over ``batches``
    (one pass; its memory is :func:`geospec.shapes.repair.moments_bytes` per layer);
    ``advance`` is called after each batch (a progress line: on a wide model the products take
    minutes)."""
    with torch.no_grad(), moments_of([site.ffn for site in sites], products) as found:
        for inputs, _ in batches:
            logits_of(model, inputs)
            if advance is not None:
                advance()
        return found()


def refit(
    weight: torch.Tensor,
    moments: Moments,
    keep: Sequence[int],
    damping: float,
    intercept: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The re-fitted kept columns W_K' (d_model x kept) and intercept c (d_model; None without
    ``intercept``, for a family whose output projection can carry no bias) of the output
    projection ``weight`` (d_model x n) keeping neurons ``keep`` (the module docstring), in
    float64."""
    index = torch.as_tensor(sorted(keep), dtype=torch.long)
    w = weight.detach().to("cpu", torch.float64)
    h, mu = moments.second, moments.mean
    k = len(index)
    if not intercept:  # the constant's row and column: z = [a_K; 1] with c held at zero
        mu = torch.zeros_like(mu)
    gram = torch.empty(k + 1, k + 1, dtype=torch.float64)
    gram[:k, :k] = h[index][:, index]
    gram[:k, k] = gram[k, :k] = mu[index]
    gram[k, k] = 1.0
    damp = damping * float(gram[:k, :k].diagonal().mean())
    if damp == 0.0 and damping > 0:  # every kept neuron silent on the calibration text
        damp = damping
    gram[:k, :k].diagonal().add_(damp)
    cross = torch.empty(w.shape[1], k + 1, dtype=torch.float64)
    cross[:, :k] = h[:, index]
    cross[:, k] = mu
    rhs = w @ cross
    rhs[:, :k] += damp * w[:, index]
    factor, info = torch.linalg.cholesky_ex(gram)
    if int(info) == 0:
        solved = torch.cholesky_solve(rhs.T, factor).T
    else:  # singular without damping: the least-squares solution of least norm
        solved = (torch.linalg.pinv(gram, hermitian=True) @ rhs.T).T
    return solved[:, :k].contiguous(), solved[:, k].contiguous() if intercept else None


def layer_refit(
    ffn: nn.Module, moments: Moments, keep: Sequence[int], damping: float, intercept: bool = True
) -> Refit:
    """:func:`refit` of ``ffn`` as a :class:`Refit` (the weight in the projection's dtype)."""
    matrix = output_matrix(ffn)
    weight, bias = refit(matrix, moments, keep, damping, intercept)
    return Refit(weight.to(matrix.dtype), bias)


def one_pass_refits(
    sites: Sequence[FFNSite],
    moments: Sequence[Moments],
    orders: Sequence[Sequence[int]],
    widths: Sequence[int],
    damping: float,
    intercept: bool = True,
) -> list[Refit | None]:
    """Every cut layer's repair from the unpruned model's moments (None: a layer that keeps
    every neuron, which nothing changes)."""
    found: list[Refit | None] = []
    for site, layer_moments, order, width in zip(sites, moments, orders, widths, strict=True):
        if width >= ffn_width(site.ffn):
            found.append(None)
            continue
        keep = kept_neurons(order, width)
        found.append(layer_refit(site.ffn, layer_moments, keep, damping, intercept))
    return found


def sequential_refits(
    model: nn.Module,
    sites: Sequence[FFNSite],
    batches: Sequence[Batch],
    orders: Sequence[Sequence[int]],
    widths: Sequence[int],
    damping: float,
    intercept: bool = True,
) -> list[Refit | None]:
    """Every cut layer's repair from the moments of its activations in the model whose earlier
    layers are already cut and repaired, layer by layer. Each layer is run from the residual
    stream the layer before left (the probe's suffix walk, when the model passes its check:
    :func:`geospec.measure.suffix.suffix_problem`; else a pass of the prefix per layer).
    Afterwards the model is the one it was."""
    from geospec.measure.suffix import SuffixRunner, suffix_problem

    runner = SuffixRunner(model, sites, next_token_loss)
    states: list[torch.Tensor | None] = [None] * len(batches)
    found: list[Refit | None] = []

    def run(layer: int, i: int) -> torch.Tensor:
        """Batch ``i`` run through ``layer`` as the model stands; the layer's output."""
        start = (layer - 1, states[i]) if walk else (-1, None)
        _, kept = runner.run(batches[i], *start, keep=(layer,), stop=layer)
        return kept[layer][1]

    with torch.no_grad(), ExitStack() as cut:
        walk = suffix_problem(runner, batches[0]) is None
        for layer, (site, order, width) in enumerate(zip(sites, orders, widths, strict=True)):
            keep = kept_neurons(order, width)
            repaired: Refit | None = None
            if width < ffn_width(site.ffn):
                with moments_of([site.ffn]) as measured:
                    for i in range(len(batches)):
                        run(layer, i)
                    repaired = layer_refit(site.ffn, measured()[0], keep, damping, intercept)
            cut.enter_context(ffn_cut(site.ffn, keep, refit=repaired))
            found.append(repaired)
            if walk and layer < len(sites) - 1:
                states = [run(layer, i) for i in range(len(batches))]
    return found


def save_refits(path: Path, key: str, refits: Sequence[Refit | None]) -> None:
    """Write a unit's repairs to ``path`` atomically, sealed by the unit's ``key`` and a digest
    of every tensor's bytes (:mod:`geospec.prune.sealed_tensors`)."""
    from geospec.prune.sealed_tensors import save_sealed

    tensors: dict[str, torch.Tensor] = {}
    for layer, found in enumerate(refits):
        if found is not None:
            tensors[f"{layer}.weight"] = found.weight
            if found.bias is not None:
                tensors[f"{layer}.bias"] = found.bias
    save_sealed(path, key, tensors, len(refits))


def load_refits(path: Path, key: str) -> tuple[list[Refit | None] | None, str | None]:
    """A unit's repairs written for ``key``, or None and why they cannot be trusted (None, None:
    there is no record)."""
    from geospec.prune.sealed_tensors import load_sealed

    found, problem = load_sealed(path, key)
    if found is None:
        return None, problem
    tensors, layers = found
    refits: list[Refit | None] = []
    for layer in range(layers):
        weight, bias = tensors.get(f"{layer}.weight"), tensors.get(f"{layer}.bias")
        refits.append(None if weight is None else Refit(weight, bias))
    return refits, None


def unit_refits(
    path: Path,
    key: str,
    layers: int,
    compute: Callable[[], list[Refit | None]],
    say: Callable[[str], None],
) -> list[Refit | None]:
    """A unit's repairs: its record at ``path`` when it was written for ``key``, else computed
    (a damaged record is named, then replaced) and written."""
    found, problem = load_refits(path, key)
    if found is not None and len(found) == layers:
        return found
    if problem is not None:
        say(f"prune: {problem}; the unit's repair is computed again")
    found = compute()
    save_refits(path, key, found)
    return found
