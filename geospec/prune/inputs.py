"""What the prune stage hands a prune besides the reference model and the text
(:class:`PruneInputs`): its section and key, the model's shape, the profiles its arms read, and
what its recommendation's continuations and shipped files read (torch-free)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from geospec.spec.sections import PruneSpec

if TYPE_CHECKING:
    from geospec.prune.shipped import ShipSettings


@dataclass(frozen=True)
class PruneInputs:
    """What a prune is computed from besides the reference model and the text."""

    prune: PruneSpec
    key: str
    """The prune stage's key: every unit's key derives from it."""
    seq_len: int
    multiple_of: int
    activation: str
    profiles: Mapping[str, Sequence[float]]
    """The profiles the arms' schedules read."""
    redraw: Callable[[int], Mapping[str, Sequence[float]]] | None = None
    """With ``prune.allocation_seeds``: calibration seed k's own measurement of the profiles it
    can re-draw (a probe sample drawn with seed k, measured again); they replace the run's
    profiles of the same names for seed k's units. None: every seed reads ``profiles``."""

    def seed_profiles(self, seed: int) -> Mapping[str, Sequence[float]]:
        """The profiles calibration seed ``seed``'s allocations are solved from."""
        if self.redraw is None:
            return self.profiles
        redrawn = self.redraw(seed)
        return {name: redrawn.get(name, values) for name, values in self.profiles.items()}

    bos: int | None = None
    """The token every window starts with (the tokenizer's BOS, ``TokenData.bos_id``), or None."""
    export_dtype: str = "float32"
    """The dtype exported models are written in (``prune.export_dtype`` resolved)."""
    prompts: Sequence[Sequence[int]] = ()
    """With ``prune.select``: fixed prompts (token ids) the recommended models and the unpruned
    one continue greedily in prune.json, for a reader to see what a perplexity means."""
    stop: int | None = None
    """The token a continuation ends at (the tokenizer's end of text)."""
    ship: ShipSettings | None = None
    """With ``prune.select``: how each recommended model's files and speed are measured
    (:mod:`geospec.prune.shipped`); None measures nothing."""
