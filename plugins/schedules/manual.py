"""An explicit list of widths, checked against the model (one per layer, multiples, on budget)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Annotated, Literal

from pydantic import Field

from geospec.errors import SpecError
from geospec.kinds import (
    ModelDims,
    Schedule,
)
from geospec.plugin import (
    PluginParams,
)


class Manual(Schedule):
    """An explicit list of widths, one per layer (multiples of the model's multiple, on budget)."""

    class Params(PluginParams):
        kind: Literal["manual"] = "manual"
        widths: list[Annotated[int, Field(ge=1)]] = Field(min_length=1, max_length=4096)
        """The FFN width of every layer, first to last."""

    params: Params

    def check(self, dims: ModelDims) -> list[str]:
        widths = self.params.widths
        problems = []
        if len(widths) != dims.n_layers:
            problems.append(
                f"widths has {len(widths)} entries; the model has {dims.n_layers} layers"
            )
        total = sum(widths)
        if total != dims.budget:
            fix = "remove" if total > dims.budget else "add"
            shares = (
                f" (n_layers x ffn_width = {dims.n_layers} x {dims.ffn_width})"
                if dims.total_width is None
                else ""
            )
            problems.append(
                f"widths sum to {total}, but the budget is {dims.budget}{shares}; "
                f"{fix} {abs(total - dims.budget)}"
            )
        odd = [f"layer {i}: {w}" for i, w in enumerate(widths) if w % dims.multiple_of]
        if odd:
            problems.append(
                f"widths must be multiples of model.multiple_of {dims.multiple_of}; not: "
                + ", ".join(odd)
            )
        return problems

    def widths(self, dims: ModelDims, profiles: Mapping[str, Sequence[float]]) -> list[int]:
        problems = self.check(dims)
        if problems:
            raise SpecError("manual schedule", problems)
        return list(self.params.widths)
