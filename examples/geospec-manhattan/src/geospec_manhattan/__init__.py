"""The `manhattan` geometry: the L1 (city-block) distance between token states as they are."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, Literal

from geospec import hookimpl
from geospec.kinds import Geometry
from geospec.plugin import PluginParams, Register

if TYPE_CHECKING:
    import torch


class Manhattan(Geometry):
    """sum_k |x_k - y_k|: like `raw`, scale-sensitive (a control), but every feature counts
    linearly rather than squared."""

    #: Rescaling both clouds by c rescales every distance by c.
    scale_sensitive: ClassVar[bool] = True

    class Params(PluginParams):
        kind: Literal["manhattan"] = "manhattan"

    def prepare(self, cloud: torch.Tensor) -> torch.Tensor:
        return cloud.double()  # the contract: float64 on the CPU, one row per token

    def pairwise(self, points: torch.Tensor) -> torch.Tensor:
        import torch

        distances = torch.cdist(points, points, p=1)
        return distances.fill_diagonal_(0.0)  # exactly zero, whatever cdist rounds

    def paired(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return (a - b).abs().sum(dim=1)


@hookimpl
def geospec_register_geometries(register: Register) -> None:
    register(Manhattan)
