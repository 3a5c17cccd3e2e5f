"""How a unit's arm cuts its model: each layer's neuron order and its repair (mean compensation
or the least-squares re-fit), applied as a context (:func:`pruned`, :func:`cut_to`).

A pruned model is the reference with layer l keeping the ``widths[l]`` best neurons of its
ordering (:mod:`geospec.measure.cut`: rows and columns removed exactly).

Bias compensation (``prune.repair = "mean"``, FLAP's): the calibration pass records every
neuron's signed mean activation (:func:`geospec.measure.calibration.calibration_stats`), and
each cut layer's output projection gains the bias sum over its removed neurons j of mean_j x
W_out[:, j] (:func:`geospec.measure.cut.cut_modules`), so the pruned model computes what the full
model computes with each removed neuron's activation replaced by its calibration mean. An export
carries that bias where the family's MLP can (:mod:`geospec.prune.hf_export`)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    import torch

    from geospec.measure.probe import FFNSite
    from geospec.prune.repair import Refit


class Cut(NamedTuple):
    """How a unit's arm cuts and repairs: each layer's neuron order under its importance, with
    mean compensation (``repair = "mean"``) its calibration sample's mean activations, with the
    least-squares repair each layer's re-fit (:mod:`geospec.prune.repair`)."""

    orders: list[list[int]]
    means: list[torch.Tensor] | None = None
    refits: list[Refit | None] | None = None


def cut_to(sites: Sequence[FFNSite], cut: Cut, widths: Sequence[int]) -> Any:
    """The context in which the model is cut to ``widths`` as ``cut`` says
    (:func:`pruned`)."""
    return pruned(sites, cut.orders, widths, cut.means, cut.refits)


@contextmanager
def pruned(
    sites: Sequence[FFNSite],
    orders: Sequence[Sequence[int]],
    widths: Sequence[int],
    compensation: Sequence[torch.Tensor] | None = None,
    refits: Sequence[Refit | None] | None = None,
) -> Iterator[None]:
    """Inside the block, layer l keeps the ``widths[l]`` best neurons of ``orders[l]``; with
    ``compensation`` (one (width,) tensor per layer, the full layer's signed calibration means
    ``[s.mean for s in calibration_stats(...)]``), each cut layer's output projection gains the
    bias that puts each removed neuron's mean in place of its activation (module docstring);
    with ``refits`` (:mod:`geospec.prune.repair`: one per layer, None where a layer is only
    cut), each layer's output projection is re-fitted instead."""
    from geospec.measure.cut import ffn_cut, kept_neurons

    for name, given in (("compensation", compensation), ("refits", refits)):
        if given is not None and len(given) != len(sites):
            raise ValueError(f"{name} for {len(given)} layers, {len(sites)} FFNs")
    with ExitStack() as stack:
        for layer, (site, order, width) in enumerate(zip(sites, orders, widths, strict=True)):
            means = None if compensation is None else compensation[layer]
            found = None if refits is None else refits[layer]
            stack.enter_context(ffn_cut(site.ffn, kept_neurons(order, width), means, found))
        yield
