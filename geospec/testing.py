"""A small pytest plugin for geospec plugin authors (loaded through the ``pytest11`` entry point).

Fixtures:

- ``geospec_registries``: fresh registries holding only geospec's builtins (installed third-party
  plugins are not loaded), in effect for the test.
- ``register_plugin``: a context manager factory; ``with register_plugin(my_module): ...`` makes
  ``my_module``'s hook implementations visible to validation and the pipeline inside the block only.

Helpers (importable): :func:`minimal_spec` builds a valid spec dictionary, :func:`registered`
is the context manager behind ``register_plugin``.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Iterator
from typing import Any

import pytest

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


@pytest.fixture
def geospec_registries() -> Iterator[Registries]:
    """Fresh registries with geospec's builtins only, in effect for the test."""
    with registered() as registries:
        yield registries


@pytest.fixture
def register_plugin() -> Callable[..., contextlib.AbstractContextManager[Registries]]:
    """``with register_plugin(obj): ...`` registers ``obj``'s hooks inside the block only."""
    return registered
