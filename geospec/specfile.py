"""Deprecated since 0.2.0: the spec's loading moved to `geospec.spec`."""

from __future__ import annotations

from geospec.moved import moved_names

__getattr__ = moved_names(
    __name__,
    {
        "validate_spec": "geospec.spec",
        "load_spec": "geospec.spec",
    },
)
