"""The bundled corpora, the GPT-2 BPE files and the evaluation task (package data).

Deprecated since 0.2.0: ``prepare_data`` moved to ``geospec.engine.token_data``.
"""

from __future__ import annotations

from geospec.moved import moved_names

__getattr__ = moved_names(
    __name__,
    {
        "prepare_data": "geospec.engine.token_data",
    },
)
