"""``prune.select.shipped``: the recommendation made on what is shipped. Each unit's GGUF file (the
file ``--export ARM@KEEP --format gguf`` writes, in the source's own type:
:func:`geospec.prune.exports.unit_gguf`) is scored on the selection windows with its
de-quantized weights (:func:`geospec.prune.gguf_weights.shipped_window_losses`), and per keep
fraction the arm whose files have the lowest mean loss is recommended (:func:`geospec.prune.
select.recommend` on ``shipped_select_loss``), its margin and interval over seeds x windows as
before.

Each unit's losses are sealed in its directory (``shipped_loss.json``) under a key of the unit's
key and what makes its file (the export dtype, the GGUF type and who writes it, their versions:
:meth:`geospec.prune.shipped.ShipSettings.file_key`), so a rerun scores no file twice; a damaged
one is named and scored again. Where there is no GGUF file to write (a reference that is no GGUF
file, a K-quant source without llama-cpp-python) the float32 models recommend, and prune.json
says why (``recommended.on``). The model and the scorer are handed in by the prune (torch);
this module is torch-free.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from geospec.rundir.artifacts import json_problem, read_json
from geospec.rundir.layout import SHIPPED_LOSS_FILE
from geospec.storage.atomic import atomic_write_json
from geospec.storage.digests import sealed

if TYPE_CHECKING:
    from geospec.prune.shipped import Plan, ShipSettings
    from geospec.prune.units import Unit
    from geospec.spec.sections import PruneSpec

#: What ``shipped_loss.json`` holds.
FIELDS = ("key", "losses")
#: (the unit's float32 model directory, its GGUF file) -> each selection window's loss.
WindowScorer = Callable[[Path, Path], list[float]]


@dataclass(frozen=True)
class UnitFiles:
    """Where a unit's model is, for writing its GGUF file: its directory and key, its exported
    ``model/`` (None where the prune did not write it) and what writes the model elsewhere."""

    directory: Path
    key: str
    model_dir: Path | None
    write_model: Callable[[Path], None]


def unit_window_losses(
    files: UnitFiles,
    settings: ShipSettings,
    plan: Plan,
    score: WindowScorer,
    say: Callable[[str], None],
) -> list[float]:
    """Each selection window's loss of the unit's GGUF file: reused from its sealed
    ``shipped_loss.json`` when that holds its key, else written, scored and sealed there."""
    from geospec.prune.exports import unit_gguf

    path = files.directory / SHIPPED_LOSS_FILE
    key = settings.file_key(files.key, plan)
    if path.exists():
        problem = json_problem(path, *FIELDS)
        if problem is None and read_json(path)["key"] == key:
            return [float(v) for v in read_json(path)["losses"]]
        if problem is not None:
            unit = files.directory.relative_to(files.directory.parents[2])  # keep-F/ARM/seed-K
            say(f"! prune: prune/{unit}/{problem}; scoring its GGUF file again")
    source = settings.gguf_source
    assert source is not None and plan.dtype is not None
    scratch = Path(tempfile.mkdtemp(prefix=".shipping-", dir=files.directory))
    try:
        model = files.model_dir
        if model is None:
            model = scratch / "model"
            files.write_model(model)
        target = scratch / "unit.gguf"  # its name is the file's general.name: no score reads it
        unit_gguf(model, target, source, source, plan.dtype)
        losses = score(model, target)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    atomic_write_json(path, sealed({"key": key, "losses": losses}))
    return losses


def recommend_shipped(
    record: dict[str, Any],
    prune: PruneSpec,
    settings: ShipSettings,
    files_of: Callable[[Unit], UnitFiles],
    score: WindowScorer,
    say: Callable[[str], None],
) -> None:
    """Per budget of prune.json's content ``record``, every arm's units' GGUF files scored
    (``shipped_select_loss``, per seed and window) and the recommendation made on them
    (``recommended.on = "shipped"``); where no file can be written, the float32 models'
    recommendation stands and ``recommended.on`` says why."""
    from geospec.prune.select import recommend
    from geospec.prune.units import Unit

    assert prune.select is not None
    plan = settings.plan()
    if plan.dtype is None:
        why = f"float32: no GGUF file to score ({plan.no_gguf})"
        say(f"prune: select.shipped: {why}; the float32 models' losses recommend")
        for budget in record["budgets"]:
            if "recommended" in budget:
                budget["recommended"]["on"] = why
        return
    seeds: Sequence[int] = prune.calibration.seeds
    for budget in record["budgets"]:
        arms: Mapping[str, dict[str, Any]] = budget["arms"]
        count = len(arms) * len(seeds)
        say(f"prune: scoring the {count} GGUF files at keep {budget['keep']:g} (select.shipped)")
        for name, arm in arms.items():
            arm["shipped_select_loss"] = {
                str(seed): unit_window_losses(
                    files_of(Unit(budget["keep"], name, seed)), settings, plan, score, say
                )
                for seed in seeds
            }
        chosen = recommend(arms, prune.select.windows, "shipped_select_loss")
        budget["recommended"] = {**chosen, "on": "shipped"}


def chosen_on_stale(record: Mapping[str, Any], prune: PruneSpec) -> bool:
    """Whether prune.json (``record``) was recommended on other losses than ``prune.select``
    asks for now (``shipped`` turned on or off): the stage runs again, its units reused."""
    wanted = prune.select is not None and prune.select.shipped
    return any(
        ("on" in budget["recommended"]) != wanted
        for budget in record.get("budgets", [])
        if "recommended" in budget
    )
