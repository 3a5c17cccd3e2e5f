"""Deprecated since 0.2.0: token preparation moved to `geospec.engine.token_data`; this package holds the bundled corpora, the GPT-2 BPE files and the evaluation task."""

from __future__ import annotations

from geospec.moved import moved_names

__getattr__ = moved_names(
    __name__,
    {
        "prepare_data": "geospec.engine.token_data",
    },
)
