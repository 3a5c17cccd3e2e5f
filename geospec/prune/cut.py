"""How a unit's arm cuts its model: each layer's neuron order and its repair (mean compensation
or the least-squares re-fit), applied as a context (:func:`pruned`, :func:`cut_to`), and the
unit's record of it, ``cut.safetensors``: every layer's order under the arm's importance and,
mean-compensated, the calibration means, sealed by the unit's key (:func:`save_cut`), so that
a finished unit's model is written again (What to ship, an export asked for later) without
scoring its calibration sample again; its re-fits are ``repair.safetensors``.

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
from pathlib import Path
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
    cut), each layer's output projection is re-fitted instead; where the re-fits carry an
    intercept, a layer kept whole (no re-fit) gets a zero bias."""
    import torch

    from geospec.measure.cut import ffn_cut, ffn_width, kept_neurons

    for name, given in (("compensation", compensation), ("refits", refits)):
        if given is not None and len(given) != len(sites):
            raise ValueError(f"{name} for {len(given)} layers, {len(sites)} FFNs")
    # A layer kept whole has no re-fit (nothing changes it), so no intercept. Where the other
    # layers' re-fits have one, it gets a zero bias (the compensation of no removed neuron),
    # which computes exactly what the unpruned layer does: then every output projection has a
    # bias or none, as with mean compensation (whose bias is on every layer) and as the exports
    # store them (hf_export.compensation_biases). geospec's engine imports only such a model
    # (engine.imported.import_problem): healing trains the bias on every layer, and each
    # healed bias needs a place to go back to (engine.imported.load_into_llama).
    intercept = any(found is not None and found.bias is not None for found in refits or [])
    with ExitStack() as stack:
        for layer, (site, order, width) in enumerate(zip(sites, orders, widths, strict=True)):
            means = None if compensation is None else compensation[layer]
            found = None if refits is None else refits[layer]
            if found is None and intercept:
                means = torch.zeros(ffn_width(site.ffn))
            stack.enter_context(ffn_cut(site.ffn, kept_neurons(order, width), means, found))
        yield


def save_cut(path: Path, key: str, cut: Cut) -> None:
    """Write ``cut``'s orders and means (not its re-fits) to ``path``, sealed by the unit's
    ``key`` (:mod:`geospec.prune.sealed_tensors`)."""
    import torch

    from geospec.prune.sealed_tensors import save_sealed

    tensors = {
        f"{layer}.order": torch.tensor(order, dtype=torch.int32)
        for layer, order in enumerate(cut.orders)
    }
    for layer, means in enumerate(cut.means or []):
        tensors[f"{layer}.means"] = means
    save_sealed(path, key, tensors, len(cut.orders))


def load_cut(path: Path, key: str, widths: Sequence[int]) -> tuple[Cut | None, str | None]:
    """The cut recorded at ``path`` for ``key`` of a model whose FFNs are ``widths`` wide (its
    orders and means, no re-fits), or None and why it cannot be trusted (None, None: there is
    no record)."""
    import torch

    from geospec.prune.sealed_tensors import load_sealed

    found, problem = load_sealed(path, key, "neuron orders")
    if found is None:
        return None, problem
    tensors, layers = found
    if layers != len(widths):
        return None, f"{path} holds {layers} layers, not the model's {len(widths)}"
    orders: list[list[int]] = []
    for layer, width in enumerate(widths):
        order = tensors.get(f"{layer}.order")
        every = torch.arange(width, dtype=torch.int32)
        if order is None or order.shape != (width,) or not torch.equal(order.sort().values, every):
            return None, f"{path} holds no ordering of layer {layer}'s {width} neurons"
        orders.append([int(i) for i in order.tolist()])
    means = [tensors[f"{layer}.means"] for layer in range(layers) if f"{layer}.means" in tensors]
    if means and len(means) != layers:
        return None, f"{path} holds the means of some layers only"
    return Cut(orders, means=means or None), None
