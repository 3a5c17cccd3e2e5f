"""Stage and run keys: stable hashes of what a stage's or a run's result depends on.

A key changes exactly when the result would: spec sections as the stage sees them, upstream
stages' keys, and (for training) the settings that change what is computed. Keys are stored in
``stages.json`` and ``run_key.json``; an unchanged key lets a finished stage or run be reused.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from geospec.spec.sections import Bookkeeping, DataSpec, ModelSpec, Section, TrainSpec, marked
from geospec.storage.digests import digest


def section(model: Any) -> Any:
    """A spec section (or any value) as keys see it (:meth:`Section.key_form`)."""
    if isinstance(model, Section):
        return model.key_form()
    return model.model_dump(mode="json") if isinstance(model, BaseModel) else model


def data_key(data: DataSpec) -> str:
    return digest("data", section(data))


#: Train settings that change how a run is carried out (CPU threads, how often it saves and
#: logs, which experiment trackers watch it) but not what it computes: the fields marked
#: ``BOOKKEEPING`` in :class:`TrainSpec`. Keys see them at their defaults, so changing one never
#: retrains anything.
BOOKKEEPING = tuple(marked(TrainSpec, Bookkeeping))


def training_settings(train: TrainSpec) -> dict[str, Any]:
    """The train section as run keys see it (bookkeeping fields at their defaults)."""
    defaults = {name: TrainSpec.model_fields[name].default for name in BOOKKEEPING}
    settings: dict[str, Any] = section(train.model_copy(update=defaults))
    return settings


def arm_run_key(
    model: ModelSpec, data: DataSpec, train: TrainSpec, widths: list[int], seed: int
) -> str:
    """The key of one trained model: an arm's widths and a seed under the spec's settings."""
    settings = training_settings(train)
    settings.pop("seeds")
    return digest("train", section(model), data_key(data), settings, widths, seed)
