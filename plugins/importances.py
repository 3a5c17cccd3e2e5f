"""The builtin neuron importance scores (``importance`` plugins): which FFN neurons a cut keeps.

- ``magnitude``: |W_in row| x |W_out column| (for a gated FFN, the gate and up rows' norms
  multiplied): a weight-only score, no data needed.
- ``activation``: the mean |activation| of the neuron over calibration tokens times its output
  column's norm, the structured form of Wanda's |W| x |X| score and of FLAP's channel score (the
  expected size of the neuron's contribution to the residual stream, up to its sign).
- ``random``: seeded scores, the control (a cut that knows nothing about the neurons).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import Field

from geospec import hookimpl
from geospec.kinds import Importance, NeuronWeights
from geospec.plugin import PluginParams, Register

if TYPE_CHECKING:
    import torch


class Magnitude(Importance):
    """Norm of the neuron's input rows (multiplied over the gate and up projections) times the
    norm of its output column."""

    class Params(PluginParams):
        kind: Literal["magnitude"] = "magnitude"

    def scores(self, ffn: NeuronWeights) -> torch.Tensor:
        score = ffn.output.norm(dim=0)
        for matrix in ffn.inputs:
            score = score * matrix.norm(dim=1)
        return score


class Activation(Importance):
    """Mean |hidden activation| over the calibration tokens times the output column's norm."""

    needs_activations = True

    class Params(PluginParams):
        kind: Literal["activation"] = "activation"

    def scores(self, ffn: NeuronWeights) -> torch.Tensor:
        if ffn.activation is None:
            raise ValueError("the activation score needs calibration activations")
        return ffn.activation * ffn.output.norm(dim=0)


class Random(Importance):
    """Uniform random scores, drawn from a generator seeded by ``seed`` and the layer index (so
    every layer gets its own ordering, the same in every run)."""

    class Params(PluginParams):
        kind: Literal["random"] = "random"
        seed: int = Field(0, ge=0, le=2**31 - 1)
        """Seed of the orderings."""

    params: Params

    def scores(self, ffn: NeuronWeights) -> torch.Tensor:
        import torch

        generator = torch.Generator().manual_seed(self.params.seed * 100_003 + ffn.layer)
        return torch.rand(ffn.width, generator=generator, dtype=torch.float64)


@hookimpl
def geospec_register_importances(register: Register) -> None:
    for cls in (Magnitude, Activation, Random):
        register(cls)
