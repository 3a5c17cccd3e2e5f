"""lm-eval scores of the pruned models of a ``[prune]`` run: which units are scored, under which
key, their sealed ``eval.json`` beside the unit's ``result.json`` (torch-free), and the model
that is scored (:func:`load_for_eval`).

A unit is scored when the prune writes its model (``prune.export``: every unit, or the listed
``ARM@KEEP`` groups): the eval stage reads the exported ``model/`` with :func:`load_for_eval`
(:func:`geospec.load_pruned`: its true per-layer widths) and lm-eval scores the model object
(:meth:`geospec.evaluate.harness.Harness.evaluate_model`). A unit's eval key holds its export
mark (the unit's key and the dtype its model was written in: the weights that were scored) and
the eval settings that change scores, so a unit is scored once, and again only when it is
recomputed, written in another dtype, or the tasks change.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from geospec.prune.units import Unit, unit_key, units_of, written_mark
from geospec.rundir.artifacts import json_problem, read_json
from geospec.rundir.layout import EVAL_FILE, UNIT_FILE, UNIT_MODEL_DIR
from geospec.spec.sections import PruneSpec
from geospec.storage.digests import digest

#: The fields every scored unit's eval.json holds.
UNIT_EVAL_FIELDS = ("key", "unit_key", "tasks")


@dataclass(frozen=True)
class UnitEval:
    """One pruned model to score: its unit, directory, the unit's key and its eval key (None:
    its model is not written for that unit key yet)."""

    unit: Unit
    directory: Path
    unit_key: str
    key: str | None

    @property
    def name(self) -> str:
        return f"pruned {self.unit.arm} at keep {self.unit.keep:g}, seed {self.unit.seed}"

    @property
    def model_dir(self) -> Path:
        return self.directory / UNIT_MODEL_DIR


def unit_evals(prune: PruneSpec, stage_key: str, run_dir: Path, tasks_key: str) -> list[UnitEval]:
    """Every unit the prune exports, with its eval key when its model is written for the unit
    computed under ``stage_key`` (the prune stage's key)."""
    found = []
    for unit in units_of(prune):
        if not prune.exports(unit.keep, unit.arm):
            continue
        directory = unit.directory(run_dir)
        key_of_unit = unit_key(stage_key, unit)
        mark = written_mark(directory / UNIT_MODEL_DIR)
        ready = mark is not None and mark.split(" ")[0] == key_of_unit
        key = digest("eval-pruned", mark, tasks_key) if ready else None
        found.append(UnitEval(unit, directory, key_of_unit, key))
    return found


def load_for_eval(model_dir: Path, device: str) -> tuple[Any, Any]:
    """The pruned model exported in ``model_dir`` at its true per-layer widths
    (:func:`geospec.load_pruned`), in float32 on ``device`` as every scored model is, and the
    tokenizer written beside it."""
    import torch
    from transformers import AutoTokenizer

    from geospec.prune.true_width import load_pruned

    model = load_pruned(model_dir, dtype=torch.float32, device=device)
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    return model, tokenizer


def unit_eval_problem(directory: Path, key: str) -> str | None:
    """What keeps ``directory/eval.json`` from holding the scores of ``key`` (None: it does)."""
    problem = json_problem(directory / EVAL_FILE, *UNIT_EVAL_FIELDS)
    if problem is not None:
        return problem
    if read_json(directory / EVAL_FILE)["key"] != key:
        return f"{EVAL_FILE} holds the scores of other settings or another model"
    return None


def read_unit_scores(directory: Path) -> dict[str, Any] | None:
    """A unit's eval.json when it is intact and scores the unit computed there now (its
    ``unit_key`` is the key in the unit's result.json); None otherwise."""
    if json_problem(directory / EVAL_FILE, *UNIT_EVAL_FIELDS) is not None:
        return None
    if json_problem(directory / UNIT_FILE, "key") is not None:
        return None
    record = read_json(directory / EVAL_FILE)
    if record["unit_key"] != read_json(directory / UNIT_FILE)["key"]:
        return None
    return record if isinstance(record["tasks"], dict) else None
