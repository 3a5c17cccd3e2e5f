"""Deprecated since 0.2.0: sensitivities moved to `geospec.measure.sensitivity`."""

from __future__ import annotations

from geospec.moved import moved_names

__getattr__ = moved_names(
    __name__,
    {
        "loss_batches": "geospec.measure.sensitivity",
        "layer_sensitivity": "geospec.measure.sensitivity",
        "additivity": "geospec.measure.sensitivity",
        "sample_pairs": "geospec.measure.sensitivity",
        "mean_loss": "geospec.measure.sensitivity",
        "scaled_sublayers": "geospec.measure.sensitivity",
        "next_token_loss": "geospec.measure.sensitivity",
    },
)
