"""Deprecated since 0.2.0: widths moved to `geospec.solve` (`widths`, `profiles`)."""

from __future__ import annotations

from geospec.moved import moved_names

__getattr__ = moved_names(
    __name__,
    {
        "compute_widths": "geospec.solve.widths",
        "write_widths": "geospec.solve.widths",
        "read_profiles": "geospec.profiles",
    },
)
