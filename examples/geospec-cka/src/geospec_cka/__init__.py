"""The `cka` work statistic: 1 - linear CKA between the clouds before and after an FFN."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import Field

from geospec import hookimpl
from geospec.kinds import Geometry, Statistic
from geospec.plugin import PluginParams

if TYPE_CHECKING:
    import torch


class CKA(Statistic):
    """1 - linear CKA: 0 when y is x up to rotation and isotropic scaling, near 1 when unrelated."""

    class Params(PluginParams):
        kind: Literal["cka"] = "cka"
        eps: float = Field(1e-12, gt=0, le=1e-3)
        """Guards the normalisation against clouds with no variance."""

    params: Params

    def __call__(self, geometry: Geometry, x: torch.Tensor, y: torch.Tensor) -> float:
        a = geometry.prepare(x).double()
        b = geometry.prepare(y).double()
        a = a - a.mean(dim=0, keepdim=True)
        b = b - b.mean(dim=0, keepdim=True)
        cross = (a.T @ b).pow(2).sum()
        norm = (a.T @ a).norm() * (b.T @ b).norm()
        return float(1.0 - cross / (norm + self.params.eps))


@hookimpl
def geospec_register_statistics(register):  # type: ignore[no-untyped-def]
    register(CKA)
