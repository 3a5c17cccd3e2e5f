"""An ``evolve`` arm's search for one prune unit: its fitness on the unit's calibration windows
(:mod:`geospec.prune.search`), its resumable state in the unit's ``search.json``
(:class:`SealedSearchState`), what the unit's record and ``prune.json`` keep of it, and why it
stopped (torch-free)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from geospec.prune.units import Unit
from geospec.prune.units import unit_key as key_of
from geospec.rundir.artifacts import json_problem, read_json
from geospec.rundir.layout import SEARCH_FILE
from geospec.storage.atomic import atomic_write_json
from geospec.storage.digests import sealed
from geospec.storage.disk import writing

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
    from geospec.prune.search import CalibrationFitness

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
    state = read_json(path)["state"]
    return {key: state[key] for key in ("trajectory", "stopped") if key in state}


def searched_summary(search: Mapping[str, Any]) -> dict[str, Any]:
    """What ``prune.json`` keeps of one unit's search (its ``result.json``'s ``search``): the
    fitness per generation and whether it moved; with patience, the parent's fitness on the
    tracked windows per generation; and why it stopped, where the unit recorded it."""
    steps = search["trajectory"]
    summary: dict[str, Any] = {
        key: [step[key] for step in steps] for key in ("fitness", "accepted")
    }
    if steps and all("tracked" in step for step in steps):
        summary["tracked"] = [step["tracked"] for step in steps]
    if search.get("stopped"):
        summary["stopped"] = dict(search["stopped"])
    return summary


def stop_reason(stopped: Mapping[str, Any] | None, prefix: str = "") -> str:
    """Why a search stopped, in words after ``prefix`` (empty while it has not stopped)."""
    if not stopped:
        return ""
    if stopped["by"] == "patience":
        return (
            f"{prefix}stopped at generation {stopped['generation']} by patience "
            f"{stopped['patience']}: no better parent on the tracked windows since generation "
            f"{stopped['best_generation']}"
        )
    return f"{prefix}stopped at its cap of {stopped['generation']} generations"


class SealedSearchState:
    """:class:`geospec.kinds.SearchState` in a sealed JSON file (a unit's ``search.json``)
    holding the unit's key: a state written for other inputs, or changed after it was
    written, is not resumed from. Each save says how far the search is (``say``)."""

    def __init__(
        self,
        path: Path,
        key: str,
        say: Callable[[str], None],
        name: str,
        generations: int,
    ) -> None:
        self.path, self.key, self.say, self.name = path, key, say, name
        self.generations = generations
        self._since = time.perf_counter()

    def load(self) -> dict[str, Any] | None:
        self._since = time.perf_counter()  # the search starts now: its first rate from here
        if json_problem(self.path, "key", "state") is not None:
            return None
        data = read_json(self.path)
        if data.get("key") != self.key or not isinstance(data["state"], dict):
            return None
        state: dict[str, Any] = data["state"]
        return state

    def save(self, state: dict[str, Any]) -> None:
        with writing(self.path):
            atomic_write_json(self.path, sealed({"key": self.key, "state": state}))
        trajectory = state.get("trajectory") or [{}]
        now = time.perf_counter()
        last = trajectory[-1]
        seconds, self._since = now - self._since, now
        speed = last.get("tokens", 0) / seconds if seconds > 0 else 0.0
        self.say(
            f"prune: {self.name}: generation {last.get('generation')}/{self.generations}, "
            f"fitness {last.get('fitness', float('nan')):.5g}, {speed:,.0f} tokens/s"
            + stop_reason(state.get("stopped"), "; ")
        )
