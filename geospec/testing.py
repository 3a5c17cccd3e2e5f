"""Helpers for testing geospec plugins, importable without pytest.

:func:`minimal_spec` builds a valid spec dictionary to modify; :func:`registered` makes a plugin
object's hook implementations visible to validation and the pipeline inside a ``with`` block.
The pytest fixtures built on them (``register_plugin``, ``geospec_registries``) live in
:mod:`geospec.pytest_plugin`, which pytest loads through the ``pytest11`` entry point.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from typing import Any

from geospec.registry.entries import Provider
from geospec.registry.loading import Registries, build_registries, use_registries

_MINIMAL_SPEC: dict[str, Any] = {
    "name": "test",
    "model": {
        "n_layers": 4,
        "d_model": 32,
        "n_heads": 2,
        "ffn_width": 64,
        "seq_len": 32,
        "multiple_of": 8,
    },
    "data": {"tokenizer": {"kind": "bpe", "vocab_size": 512}},
    "measure": [],
    "arms": [{"name": "uniform", "schedule": {"kind": "uniform"}}],
    "train": {"steps": 10, "batch_size": 4},
}


def minimal_spec(**sections: Any) -> dict[str, Any]:
    """A valid spec dictionary; keyword arguments replace (or, for dicts, update) top-level keys."""
    spec = copy.deepcopy(_MINIMAL_SPEC)
    for key, value in sections.items():
        if isinstance(value, dict) and isinstance(spec.get(key), dict):
            spec[key].update(value)
        else:
            spec[key] = value
    return spec


@contextlib.contextmanager
def registered(
    *plugins: Any, name: str = "test-plugin", builtins: bool = True
) -> Iterator[Registries]:
    """Registries holding the builtins plus ``plugins`` (objects with hook implementations)."""
    extra = [(plugin, Provider(name, "0.0.0")) for plugin in plugins]
    with use_registries(build_registries(builtins=builtins, entry_points=False, extra=extra)) as r:
        yield r
