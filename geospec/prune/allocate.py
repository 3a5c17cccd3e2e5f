"""Every pruning arm's widths at a pruned budget (torch-free).

The budget keeps ``round(keep x W / m) x m`` neurons per layer on average, so every arm has
exactly ``L`` times that many hidden units (equal FFN parameters); no layer may exceed its
pretrained width W (pruning never grows a layer) nor fall below one multiple. Schedules that
read profiles are solved with the pretrained width as the hard upper limit
(:attr:`ModelDims.max_width`); score allocations (:class:`~geospec.kinds.ScoreAllocation`: flap,
owl) allocate from the neuron scores of each arm's importance (owl also from every block
linear's calibration inputs); arms derived from
other arms (fitted, sorted) after those. A schedule that still asks a layer for more than its
pretrained width (a taper that starts above 1 / keep, a manual list) is refused by name.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from geospec.errors import UsageError
from geospec.kinds import (
    BlockLinears,
    CutLosses,
    ModelDims,
    ScoreAllocation,
    Search,
    reads_scores,
)
from geospec.solve.widths import arm_order
from geospec.spec.sections import ArmSpec


def allocate(
    arms: Sequence[ArmSpec],
    dims: ModelDims,
    profiles: Mapping[str, Sequence[float]],
    scores: Sequence[Sequence[float]],
    *,
    arm_scores: Mapping[str, Sequence[Sequence[float]]] | None = None,
    blocks: Sequence[BlockLinears] | None = None,
    cut_losses: Mapping[str, CutLosses] | None = None,
    searches: Mapping[str, Search] | None = None,
) -> dict[str, list[int]]:
    """Every arm's widths (in spec order), each checked: the budget exactly, multiples, at least
    one multiple, at most the pretrained width. A score allocation reads ``arm_scores[name]``
    (the neuron scores of the arm's own importance) where given, ``scores`` otherwise; one that
    reads block linears (``owl``) also gets ``blocks``, a search (``greedy``) the
    calibration losses of its own cuts, ``cut_losses[name]``, and a search of whole
    allocations (``evolve``) ``searches[name]`` with the widths of the arms it reads."""
    from geospec.plugin import create_plugin

    schedules = {arm.name: create_plugin("schedule", arm.schedule) for arm in arms}
    sources = {name: schedule.required_arms() for name, schedule in schedules.items()}
    for name, needed in sources.items():
        missing = [arm for arm in needed if arm not in schedules]
        if missing:
            raise UsageError(f"prune.arms: {name!r} reads the widths of {missing}, not a prune arm")
    widths: dict[str, list[int]] = {}
    for name in arm_order(sources):
        schedule = schedules[name]
        try:
            own = scores if arm_scores is None else arm_scores.get(name, scores)
            if isinstance(schedule, ScoreAllocation) and schedule.reads_cut_losses:
                if cut_losses is None or name not in cut_losses:
                    raise ValueError(f"prune arm {name!r} searches on losses; none were given")
                result = schedule.widths_from_losses(dims, own, cut_losses[name])
            elif isinstance(schedule, ScoreAllocation) and schedule.reads_search:
                if searches is None or name not in searches:
                    raise ValueError(f"prune arm {name!r} searches; no search was given")
                read = {arm: widths[arm] for arm in sources[name]}
                result = schedule.widths_from_search(dims, own, read, searches[name])
            elif isinstance(schedule, ScoreAllocation) and schedule.reads_block_linears:
                if blocks is None:
                    raise ValueError(f"prune arm {name!r} reads block linears; none were given")
                result = schedule.widths_from_blocks(dims, own, blocks)
            elif reads_scores(schedule):
                result = schedule.widths_from_scores(dims, own)
            else:
                result = schedule.widths_from(
                    dims, profiles, {arm: widths[arm] for arm in sources[name]}
                )
        except UsageError as error:
            raise UsageError(f"prune arm {name!r}: {error}") from None
        problems = width_problems(result, dims)
        if problems:
            raise UsageError(f"prune arm {name!r}: {'; '.join(problems)}")
        widths[name] = [int(w) for w in result]
    return {arm.name: widths[arm.name] for arm in arms}


def width_problems(widths: Sequence[int], dims: ModelDims) -> list[str]:
    """What makes ``widths`` no pruning of this model at this budget (empty: sound)."""
    problems = []
    if len(widths) != dims.n_layers:
        problems.append(f"{len(widths)} widths for {dims.n_layers} layers")
    if sum(widths) != dims.budget:
        problems.append(f"widths sum to {sum(widths)}, the budget is {dims.budget}")
    grown = [(layer, w) for layer, w in enumerate(widths) if w > (dims.max_width or w)]
    if grown:
        layer, w = grown[0]
        problems.append(
            f"layer {layer} would grow to {w} beyond its pretrained width {dims.max_width} "
            f"({len(grown)} layers do); pruning never grows a layer: bound the schedule "
            "(a solver's max_ratio, a gentler taper) or keep more"
        )
    if any(w < dims.multiple_of or w % dims.multiple_of for w in widths):
        problems.append(f"every width must be a positive multiple of {dims.multiple_of}")
    return problems
