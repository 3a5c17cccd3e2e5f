"""Deprecated since 0.2.0: parameter counting moved to :mod:`geospec.shapes.model_size`
(torch-free, below the spec, which counts parameters when it validates)."""

from __future__ import annotations

from geospec.moved import moved_names

__getattr__ = moved_names(
    __name__,
    {
        name: "geospec.shapes.model_size"
        for name in (
            "Shape", "kv_width", "kv_head_problems", "attention_problems", "ffn_params",
            "norm_params", "attention_params", "count_params", "total_ffn_params",
        )
    },
)  # fmt: skip
