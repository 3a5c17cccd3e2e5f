"""Deprecated since 0.2.0: the model moved to `geospec.engine.model`."""

from __future__ import annotations

from geospec.moved import moved_names

__getattr__ = moved_names(
    __name__,
    {
        "GPT": "geospec.engine.model",
        "GPTConfig": "geospec.engine.model",
        "config_from_spec": "geospec.engine.model",
    },
)
