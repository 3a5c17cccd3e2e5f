"""Every linear map of a decoder layer and the calibration statistic of its input that Wanda's
per-weight score |W_ij| x ‖X_j‖₂ reads (OWL's layerwise outlier ratio: the ``owl`` allocation).

OWL (luuyin/OWL, ``lib/prune_all.py``, ``prune_wanda_outlier``, lines 884-924) hooks every
``nn.Linear`` of each decoder layer (``find_layers``, lines 59-77) and accumulates, per input
feature j, the sum over calibration tokens of x_j² (``WrappedGPT.add_batch``,
``lib/layerwrapper.py`` lines 22-35, ``scaler_row``); its score of weight (i, j) is |W_ij| x
the square root of that sum (``prune_all.py`` line 924). Here the same sums are taken over
every calibration token in float64 and divided by the token count (a factor common to every
linear of the model, which changes no ratio between scores), and GPT-2's ``Conv1D`` layers
(weights stored in x out) count as linear maps too. Every layer is measured on the unpruned
model, as OWL's first pass (its outlier ratios) does.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from geospec.errors import GeospecError
from geospec.kinds import BlockLinears, LinearInputs


def _is_conv1d(module: nn.Module) -> bool:
    """transformers' ``Conv1D`` (GPT-2): a linear map whose weight is stored in x out."""
    return type(module).__name__ == "Conv1D" and hasattr(module, "nf")


def linear_modules(layer: nn.Module) -> list[tuple[str, nn.Module]]:
    """Every linear map inside ``layer`` (``nn.Linear`` or ``Conv1D``), by module path, in
    module order (OWL's ``find_layers``)."""
    return [
        (name, module)
        for name, module in layer.named_modules()
        if name and (isinstance(module, nn.Linear) or _is_conv1d(module))
    ]


def _out_by_in(module: nn.Module) -> torch.Tensor:
    weight = module.weight
    assert isinstance(weight, torch.Tensor)
    matrix = weight.t() if _is_conv1d(module) else weight
    return matrix.detach().to("cpu", torch.float32)


@contextmanager
def linear_inputs(layers: Sequence[nn.Module]) -> Iterator[Callable[[], list[BlockLinears]]]:
    """Inside the block, accumulate the input of every linear map of every layer of ``layers``
    over all tokens run (the sum of x_j² per input feature, float64); the yielded function
    returns one :class:`BlockLinears` per layer, each linear with its weight (out x in, float32
    on the CPU) and its input RMS sqrt(E[x_j²])."""
    found = [linear_modules(layer) for layer in layers]
    sums: dict[tuple[int, int], torch.Tensor] = {}
    counts: dict[tuple[int, int], int] = {}

    def hook(key: tuple[int, int]) -> Callable[..., None]:
        def accumulate(module: nn.Module, args: tuple[Any, ...]) -> None:
            x = args[0].detach()
            flat = x.reshape(-1, x.shape[-1]).to(torch.float64)
            total = flat.square().sum(dim=0).cpu()
            sums[key] = total if key not in sums else sums[key] + total
            counts[key] = counts.get(key, 0) + flat.shape[0]

        return accumulate

    handles = [
        module.register_forward_pre_hook(hook((i, k)))
        for i, modules in enumerate(found)
        for k, (_, module) in enumerate(modules)
    ]

    def gathered() -> list[BlockLinears]:
        blocks = []
        for i, modules in enumerate(found):
            linears = []
            for k, (name, module) in enumerate(modules):
                if (i, k) not in sums:
                    raise GeospecError(f"layer {i}'s {name} was not called: no inputs to average")
                rms = (sums[(i, k)] / counts[(i, k)]).sqrt()
                linears.append(LinearInputs(name, _out_by_in(module), rms))
            blocks.append(BlockLinears(i, tuple(linears)))
        return blocks

    try:
        yield gathered
    finally:
        for handle in handles:
            handle.remove()
