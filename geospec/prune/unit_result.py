"""One unit's pruned model measured, what its ``result.json`` records: the reference cut and
repaired as the unit's arm says, its loss on every eval window (and on the calibration and
selection windows where asked), its FFN parameters, its checkpoint written, and its healing."""

from __future__ import annotations

import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from geospec.prune.cut import Cut, cut_to
from geospec.prune.unit_export import export_healed, export_unit
from geospec.rundir.layout import HEAL_DIR, UNIT_MODEL_DIR

if TYPE_CHECKING:
    from torch import nn

    from geospec.measure.probe import FFNSite
    from geospec.measure.sensitivity import Batch
    from geospec.prune.heal import Healer
    from geospec.prune.inputs import PruneInputs
    from geospec.prune.units import Unit


def pruned_unit(
    model: nn.Module,
    sites: Sequence[FFNSite],
    cut: Cut,
    widths: Sequence[int],
    corpora: Mapping[str, Sequence[Any]],
    unit: Unit,
    unit_dir: Path,
    key: str,
    inputs: PruneInputs,
    heal: Healer | None,
    *,
    calibration: Sequence[Batch] | None = None,
    export: bool = False,
    selection: Sequence[Batch] | None = None,
) -> dict[str, Any]:
    """One pruned model (cut and repaired as ``cut`` says): its losses, FFN parameters, (with
    export) checkpoint (the healed model's, with a healer), (with a healer) its losses after
    healing and (with ``calibration``, a sweep's arm) its loss on the calibration windows."""
    import torch

    from geospec.engine.imported import import_llama
    from geospec.prune.losses import eval_loss, ffn_parameters, window_losses

    imported = None
    with torch.no_grad(), cut_to(sites, cut, widths):
        windows = {name: window_losses(model, batches) for name, batches in corpora.items()}
        losses = {name: sum(values) / len(values) for name, values in windows.items()}
        own = None if calibration is None else eval_loss(model, calibration)
        chosen_on = None if selection is None else window_losses(model, selection)
        params = ffn_parameters(sites)
        if export and heal is None:
            export_unit(model, sites, widths, unit_dir / UNIT_MODEL_DIR, key, inputs.export_dtype)
        else:  # an earlier computation's model is not this one's
            shutil.rmtree(unit_dir / UNIT_MODEL_DIR, ignore_errors=True)
        if heal is not None:
            imported = import_llama(model, inputs.seq_len)
    result: dict[str, Any] = {
        "widths": list(widths), "ffn_params": params, "loss": losses, "window_loss": windows,
    }  # fmt: skip
    if own is not None:
        result["calibration_loss"] = own
    if chosen_on is not None:  # what the recommendation reads (prune.select)
        result["select_loss"] = chosen_on
    if imported is not None and heal is not None:
        # healing trains in its own precision (train.precision), not the prune's compute dtype
        with torch.autocast(next(model.parameters()).device.type, enabled=False):
            result["healed_loss"] = heal(unit, unit_dir / HEAL_DIR, key, imported)
        if export:
            export_healed(
                model, sites, cut, widths, unit_dir / HEAL_DIR, unit_dir / UNIT_MODEL_DIR, key,
                inputs.export_dtype,
            )  # fmt: skip
    return result
