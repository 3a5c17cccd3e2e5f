"""An ``evolve`` arm's search for one prune unit: its fitness on the unit's calibration windows
(:mod:`geospec.prune.search`), its resumable state in the unit's ``search.json``, and what the
unit's record keeps of it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from geospec.prune.units import Unit
from geospec.prune.units import unit_key as key_of
from geospec.rundir.layout import SEARCH_FILE

if TYPE_CHECKING:
    import torch
    from torch import nn

    from geospec.kinds import Search
    from geospec.measure.probe import FFNSite
    from geospec.measure.sensitivity import Batch
    from geospec.prune.search import RepairedLevels
    from geospec.spec.sections import PruneSpec


def evolve_search(
    model: nn.Module,
    sites: Sequence[FFNSite],
    orders: Sequence[Sequence[int]],
    batches: Sequence[Batch],
    teacher: dict[Any, torch.Tensor],
    prune: PruneSpec,
    run_dir: Path,
    unit: Unit,
    stage_key: str,
    say: Callable[[str], None],
    levels: Callable[[], RepairedLevels | None] | None = None,
) -> Search:
    """An ``evolve`` arm's search for ``unit``: its fitness on the calibration windows
    ``batches`` (the unpruned model's log-probabilities shared through ``teacher``; each
    level repaired as ``levels`` gives them, asked when the search starts, or cut), its state
    in the unit's ``search.json`` under the unit's key (which holds the arm's repair)."""
    from geospec.kinds import Search
    from geospec.prune.search import CalibrationFitness, SealedSearchState

    arm = next(a for a in prune.arms if a.name == unit.arm)
    generations = int(getattr(arm.schedule, "generations", 0))
    name = f"{unit.arm} at keep {unit.keep:g}, seed {unit.seed}"
    path = unit.directory(run_dir) / SEARCH_FILE
    state = SealedSearchState(path, key_of(stage_key, unit), say, name, generations)

    def fitness(kind: str, top_k: int | None = None) -> CalibrationFitness:
        repaired = None if levels is None else levels()
        over = "cut levels" if repaired is None else repaired.describe()
        say(f"prune: searching {name}: {generations} generations over {over}, the unpruned "
            f"model's log-probabilities on {len(batches)} calibration batches first")  # fmt: skip
        size = prune.calibration.batch_size
        return CalibrationFitness(
            model, sites, orders, batches, kind, size, teacher, top_k=top_k, levels=repaired
        )

    return Search(fitness, state)


def searched_path(path: Path) -> dict[str, Any]:
    """What a unit's record keeps of its search: the trajectory (per generation its fitness on
    the last stage's windows, whether the parent was replaced, the parent's widths after it,
    the tokens scored; with patience, the parent's fitness on the tracked windows) and why it
    stopped (``stopped``: by "patience" or "generations", at which generation)."""
    from geospec.rundir.artifacts import read_json

    state = read_json(path)["state"]
    return {key: state[key] for key in ("trajectory", "stopped") if key in state}
