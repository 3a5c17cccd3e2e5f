"""A prune unit's model written into its ``model/`` (or another directory): the cut model at its
true widths, or the healed one in the checkpoint's family, with the run's tokenizer beside it
and the mark that says which unit and dtype it is (:func:`geospec.prune.units.has_model`)."""

from __future__ import annotations

import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from geospec.prune.cut import Cut, cut_to
from geospec.prune.units import EXPORTED_FILE
from geospec.rundir.layout import HEAL_DIR
from geospec.storage.disk import writing

if TYPE_CHECKING:
    from torch import nn

    from geospec.measure.probe import FFNSite


def export_finished(
    model: nn.Module,
    sites: Sequence[FFNSite],
    cut: Cut,
    stored: Mapping[str, Any],
    unit_dir: Path,
    target: Path,
    key: str,
    dtype: str,
) -> None:
    """A finished unit's model (``stored``: its record) written into ``target`` without
    computing the unit again: the healed model where the unit was healed (its ``heal/``), else
    ``model`` cut as ``cut`` says at the record's widths."""
    import torch

    widths = stored["widths"]
    if "healed_loss" in stored:  # the model it hands out is the healed one
        export_healed(model, sites, cut, widths, unit_dir / HEAL_DIR, target, key, dtype, unit_dir)
    else:
        with torch.no_grad(), cut_to(sites, cut, widths):
            export_unit(model, sites, widths, target, key, dtype, unit_dir)


def export_healed(
    model: nn.Module,
    sites: Sequence[FFNSite],
    cut: Cut,
    widths: Sequence[int],
    heal_dir: Path,
    directory: Path,
    key: str,
    dtype: str,
    unit_dir: Path | None = None,
) -> None:
    """Export the unit's healed model (trained in ``heal_dir``) as :func:`export_unit` exports a
    pruned one: ``model`` is cut as the unit was, the healed weights are copied into it
    (:func:`geospec.engine.imported.load_into_llama`), written, and ``model``'s own weights put
    back, so the export is the checkpoint's family, config and dtype with the healed values."""
    import torch

    from geospec.engine.checkpoint import load_model
    from geospec.engine.imported import load_into_llama

    healed = load_model(heal_dir, torch.device("cpu"))
    with torch.no_grad(), cut_to(sites, cut, widths):
        own = {name: value.clone() for name, value in model.state_dict().items()}
        try:
            load_into_llama(model, healed)
            export_unit(model, sites, widths, directory, key, dtype, unit_dir)
        finally:
            model.load_state_dict(own)


def export_unit(
    model: nn.Module,
    sites: Sequence[FFNSite],
    widths: Sequence[int],
    directory: Path,
    key: str,
    dtype: str,
    unit_dir: Path | None = None,
) -> None:
    """Export the pruned model into ``directory`` (at its true widths, in ``dtype``) with the
    checkpoint's tokenizer beside it (``AutoTokenizer`` reads it), replacing an older export of
    the unit, and mark it with the unit's ``key`` and the dtype (:func:`~geospec.prune.units.
    has_model`), last: a directory without the mark is written again (a full disk: one line).
    ``unit_dir``: the unit whose run names the tokenizer (None: ``directory``'s parent, where a
    unit keeps its ``model/``)."""
    from geospec.prune.exports import save_run_tokenizer
    from geospec.prune.hf_export import export_pruned
    from geospec.prune.units import export_mark
    from geospec.storage.atomic import atomic_write_text

    shutil.rmtree(directory, ignore_errors=True)  # from other inputs: the unit is recomputed
    with writing(directory):
        export_pruned(model, sites, widths, directory, dtype=dtype)
        save_run_tokenizer(unit_dir or directory.parent, directory)
        atomic_write_text(directory / EXPORTED_FILE, export_mark(key, dtype) + "\n")
