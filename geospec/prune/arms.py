"""What a prune's arms read, from their plugins: each arm's importance (scored once per
calibration seed however many arms share it), and which arms' schedules read the block linears
(OWL), the calibration losses of cuts (``greedy``), a search (``evolve``) or other arms' widths."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, NamedTuple

from geospec.prune.score import importance_key

if TYPE_CHECKING:
    from geospec.kinds import Importance
    from geospec.spec.sections import PruneSpec


class ArmReads(NamedTuple):
    """What the arms read (:func:`arm_reads`)."""

    arm_importance: dict[str, str]
    """Each arm's importance, as its key (:func:`geospec.prune.score.importance_key`)."""
    importances: dict[str, Importance]
    """Every distinct importance the arms use, by its key."""
    blocks: bool
    """Whether an arm reads every decoder layer's linear inputs (``owl``)."""
    searches: list[str]
    """The arms whose allocation reads the calibration losses of cuts (``greedy``)."""
    evolves: list[str]
    """The arms whose allocation runs a search (``evolve``)."""
    required: dict[str, list[str]]
    """Each arm's schedule's other arms, whose widths it reads."""

    def wanted(self, arms: Iterable[str]) -> set[str]:
        """The arms ``arms`` are or read, at any remove (a search of an arm left out by
        ``--arms`` is not run for nothing)."""
        wanted: set[str] = set()
        unread = list(arms)
        while unread:
            name = unread.pop()
            if name not in wanted:
                wanted.add(name)
                unread += self.required.get(name, [])
        return wanted


def arm_reads(prune: PruneSpec) -> ArmReads:
    """What ``prune``'s arms read, their importance and schedule plugins created."""
    from geospec.kinds import ScoreAllocation
    from geospec.plugin import create_plugin

    # each distinct importance is scored once per calibration seed; an arm reads its own
    arm_importance = {arm.name: importance_key(prune.importance_of(arm)) for arm in prune.arms}
    importances = {
        arm_importance[arm.name]: create_plugin("importance", prune.importance_of(arm))
        for arm in prune.arms
    }
    schedules = {arm.name: create_plugin("schedule", arm.schedule) for arm in prune.arms}
    allocations = {name: s for name, s in schedules.items() if isinstance(s, ScoreAllocation)}
    return ArmReads(
        arm_importance,
        importances,
        blocks=any(s.reads_block_linears for s in allocations.values()),
        searches=[name for name, s in allocations.items() if s.reads_cut_losses],
        evolves=[name for name, s in allocations.items() if s.reads_search],
        required={name: s.required_arms() for name, s in schedules.items()},
    )
