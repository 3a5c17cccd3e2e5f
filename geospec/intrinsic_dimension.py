"""Deprecated since 0.2.0: intrinsic dimension moved to `geospec.measure.intrinsic_dimension`."""

from __future__ import annotations

from geospec.moved import moved_names

__getattr__ = moved_names(
    __name__,
    {
        "two_nn": "geospec.measure.intrinsic_dimension",
        "fit_two_nn": "geospec.measure.intrinsic_dimension",
    },
)
