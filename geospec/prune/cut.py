"""How a unit's arm cuts its model: each layer's neuron order and its repair (mean compensation
or the least-squares re-fit), applied as a context (:func:`geospec.prune.apply.pruned`)."""

from __future__ import annotations

from collections.abc import Sequence
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
    (:func:`geospec.prune.apply.pruned`)."""
    from geospec.prune.apply import pruned

    return pruned(sites, cut.orders, widths, cut.means, cut.refits)
