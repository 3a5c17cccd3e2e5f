"""Deprecated since 0.2.0: training moved to `geospec.engine.train`."""

from __future__ import annotations

from geospec.moved import moved_names

__getattr__ = moved_names(
    __name__,
    {
        "train_model": "geospec.engine.train",
        "load_model": "geospec.engine.train",
    },
)
