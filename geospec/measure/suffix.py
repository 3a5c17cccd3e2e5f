"""Layer sensitivity and additivity from the perturbed layer on: the same numbers as
:mod:`geospec.measure.sensitivity`'s full forward passes, without recomputing what a perturbation
cannot change.

Scaling layer l's FFN sub-layer output by s changes nothing before layer l's output, which becomes
x_l + s (y_l - x_l) (x_l enters the FFN's pre-norm, y_l leaves the unperturbed layer; see
:func:`~geospec.measure.sensitivity.perturbed`). So each perturbation of layer l runs only layers
l + 1 onwards and the output head, from x_l and y_l of the unperturbed model: neither the prefix
nor layer l itself (its attention or its FFN) is computed again. A pair (i, j), i < j, shares the
single perturbation of layer i up to layer j: that run keeps its own x_j and y_j, and the pair runs
from layer j + 1. Per batch this is one unperturbed pass, then for each layer l the two single
perturbations and the pairs (l, j), each from its own start; a batch's loss under every
perturbation is added in batch order, as the full forward passes add them.

How a suffix runs, on any architecture the probe maps: the model's own forward is called (it
embeds the tokens and builds the masks and position tables each layer needs, sliding windows per
layer included), but the decoder layers up to the start return the given residual stream instead
of computing it (their ``forward`` is replaced for that call). Layer l + 1 and everything after it
then compute the same operations on the same values as in a full forward pass. The unperturbed x_l
and y_l come from walking the stack one layer at a time (a forward pass that stops after layer l,
with the layers before it replaced by y_{l-1}), so only one layer's states are held, not every
layer's.

Before any of it, :func:`suffix_problem` checks the premise on the model itself: on the first
window, the walk must give every layer's output bit for bit as a full forward pass does, and the
same loss. A model whose layers share state other than the residual stream (a value residual from
the first layer, a cache shared across layers), or that does not call its layers through its layer
list, fails it, and :func:`perturb_layers` then uses the full forward passes and says why.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from geospec.engine.distributed import DistContext, spread_over_ranks
from geospec.measure.probe import FFNSite
from geospec.measure.sensitivity import (
    Additivity,
    Batch,
    LossFn,
    PairEffect,
    Sensitivity,
    additivity,
    layer_sensitivity,
    next_token_loss,
    perturbed,
    r_squared,
)

#: The residual stream entering the FFN's pre-norm (x) and leaving the layer (y), for one batch.
States = tuple[torch.Tensor, torch.Tensor]


class _Stop(BaseException):
    """Ends a forward pass after the layer it was needed for (a BaseException, so no
    ``except Exception`` inside a model's forward swallows it)."""


@dataclass(frozen=True)
class Perturbations:
    """Every layer's sensitivity and the additivity of the pairs, and how they were computed."""

    sensitivity: Sensitivity
    additivity: Additivity
    fallback: str | None
    """Why full forward passes were used (None: from the perturbed layer on)."""


class SuffixRunner:
    """Runs the loss of one batch with the decoder layers up to ``start`` returning a given
    residual stream, keeping chosen layers' x and y and stopping after a chosen layer."""

    def __init__(self, model: nn.Module, sites: Sequence[FFNSite], loss: LossFn) -> None:
        self.model, self.sites, self.loss = model, sites, loss
        self._rest: tuple[Any, ...] | None = None  # a layer output's other tuple elements

    def run(
        self,
        batch: Batch,
        start: int,
        state: torch.Tensor | None,
        keep: Sequence[int] = (),
        stop: int | None = None,
    ) -> tuple[float | None, dict[int, States]]:
        """The batch's summed loss (None when stopped) with layers 0..``start`` returning
        ``state`` (``start`` -1: none), and x, y of the layers in ``keep``."""
        kept: dict[int, list[torch.Tensor | None]] = {j: [None, None] for j in keep}
        with ExitStack() as stack:
            for layer in range(start + 1):
                stack.enter_context(self._replaced(layer, state))
            for layer in keep:
                stack.enter_context(self._kept(layer, kept[layer], stop == layer))
            try:
                loss: float | None = float(self.loss(self.model, *batch).double())
            except _Stop:
                loss = None
        states = {}
        for layer, (x, y) in kept.items():
            if x is None or y is None:
                raise RuntimeError(f"layer {layer} or its FFN's pre-norm was not called")
            states[layer] = (x, y)
        return loss, states

    @contextmanager
    def _replaced(self, layer: int, state: torch.Tensor | None) -> Iterator[None]:
        module = self.sites[layer].layer
        own = module.__dict__.get("forward")  # an instance-level forward (accelerate's hooks)

        def skip(*args: Any, **kwargs: Any) -> Any:
            return state if self._rest is None else (state, *self._rest)

        module.forward = skip
        try:
            yield
        finally:
            if own is None:
                del module.forward
            else:
                module.forward = own

    @contextmanager
    def _kept(self, layer: int, store: list[torch.Tensor | None], stop: bool) -> Iterator[None]:
        site = self.sites[layer]

        # Hooks must return None: a returned value would replace the input or the output.
        def entering(module: nn.Module, args: tuple[Any, ...]) -> None:
            store[0] = args[0]

        def leaving(module: nn.Module, args: tuple[Any, ...], out: Any) -> None:
            if isinstance(out, tuple):
                self._rest = tuple(out[1:])
                out = out[0]
            store[1] = out
            if stop:
                raise _Stop

        handles = [
            site.pre_norm.register_forward_pre_hook(entering),
            site.layer.register_forward_hook(leaving),
        ]
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()


def suffix_problem(runner: SuffixRunner, batch: Batch) -> str | None:
    """Why running from a layer on would not give a full forward pass's numbers on ``batch``
    (None: it gives them bit for bit).

    Checked: the walk (each layer run with the layers before it replaced by their outputs)
    reproduces every layer's output and the loss of a full pass; and after a full pass over other
    tokens (the batch reversed), a run from the middle layer on still gives the same loss, so no
    layer reads state that a layer not run in this pass left behind."""
    sites = runner.sites
    outputs: list[torch.Tensor] = []

    def record(module: nn.Module, args: tuple[Any, ...], out: Any) -> None:
        outputs.append((out[0] if isinstance(out, tuple) else out).clone())

    handles = [site.layer.register_forward_hook(record) for site in sites]
    try:
        full = float(runner.loss(runner.model, *batch).double())
    finally:
        for handle in handles:
            handle.remove()
    if len(outputs) != len(sites):
        return f"a forward pass called {len(outputs)} of its {len(sites)} decoder layers"
    state, walked = None, None
    for layer in range(len(sites)):
        stop = None if layer == len(sites) - 1 else layer
        try:
            walked, states = runner.run(batch, layer - 1, state, keep=(layer,), stop=stop)
        except Exception as error:  # a model that cannot run so is measured the reference's way
            return f"running from layer {layer} on fails: {type(error).__name__}: {error}"
        state = states[layer][1]
        if not torch.equal(state, outputs[layer]):
            return f"layer {layer}'s output differs when the layers before it are not run"
    if walked != full:
        return f"the loss from the last layer's output is {walked}, a full pass gives {full}"
    middle = (len(sites) - 1) // 2
    inputs, targets = batch
    runner.loss(runner.model, inputs.flip(-1), targets)
    try:
        after, _ = runner.run(batch, middle, outputs[middle])
    except Exception as error:
        return f"running from layer {middle + 1} on fails: {type(error).__name__}: {error}"
    if after != full:
        return (
            f"the loss from layer {middle + 1} on depends on the tokens of the previous pass "
            "(its layers keep state between passes)"
        )
    return None


def perturb_layers(
    model: nn.Module,
    sites: Sequence[FFNSite],
    batches: Sequence[Batch],
    eps: float,
    pairs: Sequence[tuple[int, int]],
    loss: LossFn = next_token_loss,
    progress: Callable[[int], None] | None = None,
    dist: DistContext | None = None,
) -> Perturbations:
    """:func:`~geospec.measure.sensitivity.layer_sensitivity` and
    :func:`~geospec.measure.sensitivity.additivity` of ``pairs``, computed from each perturbed
    layer on (full forward passes where the model fails :func:`suffix_problem`). ``progress``
    counts one perturbation of one batch as 1: ``len(batches) * (2 * layers + len(pairs))`` in
    all.

    ``dist`` (under torchrun, every rank calling this with the same model and batches): each rank
    runs its share of the perturbations (a layer scaled with the pairs that start from it, or a
    layer removed; shared by their cost, the layers they run) and every rank returns all of them.
    Each perturbation's losses are computed alone, batch by batch in order, so the values are
    those of one process; every rank walks the unperturbed stack itself (one forward pass per
    batch), which the perturbations start from."""
    runner = SuffixRunner(model, sites, loss)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            if batches:  # no batches: the reference divides by zero tokens as it always did
                inputs, targets = batches[0]
                problem = suffix_problem(runner, (inputs[:1], targets[:1]))
                if problem is None:
                    return _from_the_layer_on(runner, batches, eps, pairs, progress, dist)
            else:
                problem = "no batches"
        per_pass = None if progress is None else (lambda k: progress(k * len(batches)))
        single = layer_sensitivity(model, sites, batches, eps, loss, per_pass, dist)
        pair_effects = additivity(model, sites, batches, single, pairs, loss, per_pass, dist)
        return Perturbations(single, pair_effects, problem)
    finally:
        model.train(was_training)


def _from_the_layer_on(
    runner: SuffixRunner,
    batches: Sequence[Batch],
    eps: float,
    pairs: Sequence[tuple[int, int]],
    progress: Callable[[int], None] | None,
    dist: DistContext | None = None,
) -> Perturbations:
    layers = len(runner.sites)
    scale = 1.0 - eps
    partners: dict[int, list[tuple[int, int]]] = {}  # i -> (index in pairs, j) of each pair (i, j)
    for index, (i, j) in enumerate(pairs):
        partners.setdefault(i, []).append((index, j))
    # Job 2 l: layer l scaled by 1 - eps, with the pairs (l, j) that run on from it; job 2 l + 1:
    # layer l removed. A run from layer l on costs the layers after it and the output head.
    costs = []
    for layer in range(layers):
        after = layers - layer
        costs += [after + sum(layers - j for _, j in partners.get(layer, [])), after]
    count = sum(batch[1].numel() for batch in batches)

    def advance() -> None:
        if progress is not None:
            progress(1)

    def loss_from(
        batch: Batch, layer: int, states: States, s: float, keep: Sequence[int] = ()
    ) -> tuple[float, dict[int, States]]:
        """The loss with layer ``layer``'s output perturbed by ``s`` (from its ``states``)."""
        value, kept = runner.run(batch, layer, perturbed(*states, s), keep)
        assert value is not None
        advance()
        return value, kept

    def compute(mine: list[int]) -> list[tuple[float, float, list[float]]]:
        """Per job of ``mine``: the loss summed over the batches, the unperturbed loss so
        summed, and (a scaled layer) the summed losses of its pairs."""
        if not mine:  # more ranks than jobs: nothing to walk for
            return []
        totals = {job: 0.0 for job in mine}
        joint = {job: [0.0] * len(partners.get(job // 2, [])) * (job % 2 == 0) for job in mine}
        base = 0.0
        for batch in batches:
            state = None
            for layer in range(layers):
                last = layer == layers - 1
                value, walked = runner.run(
                    batch, layer - 1, state, keep=(layer,), stop=None if last else layer
                )
                if last:
                    assert value is not None
                    base += value
                own = partners.get(layer, [])
                if 2 * layer in totals:
                    value, kept = loss_from(batch, layer, walked[layer], scale, [j for _, j in own])
                    totals[2 * layer] += value
                    for slot, (_, j) in enumerate(own):
                        joint[2 * layer][slot] += loss_from(batch, j, kept[j], scale)[0]
                if 2 * layer + 1 in totals:
                    totals[2 * layer + 1] += loss_from(batch, layer, walked[layer], 0.0)[0]
                state = walked[layer][1]
        return [(totals[job], base, joint[job]) for job in mine]

    results = spread_over_ranks(2 * layers, compute, dist, costs)
    base = results[0][1] if results else 0.0
    mean = base / count
    scaled = [results[2 * layer][0] for layer in range(layers)]
    removed = [results[2 * layer + 1][0] for layer in range(layers)]
    single = Sensitivity(
        mean, eps, [t / count - mean for t in scaled], [t / count - mean for t in removed]
    )
    joint = [0.0] * len(pairs)
    for layer, own in partners.items():
        for (index, _), total in zip(own, results[2 * layer][2], strict=True):
            joint[index] = total
    effects = [
        PairEffect((i, j), total / count - mean, single.scale[i] + single.scale[j])
        for (i, j), total in zip(pairs, joint, strict=True)
    ]
    fit = r_squared([e.joint for e in effects], [e.singles for e in effects])
    return Perturbations(single, Additivity(scale, effects, fit), None)
